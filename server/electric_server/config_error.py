"""``ConfigError``: a configuration the server refuses to start with (the CLI exits 2).

Its own module so that ``app.py`` and the parts it assembles (``datadir.py``)
both raise it without importing each other.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A server configuration that must not start (the CLI exits 2)."""
