"""The A2A face (docs/a2a.md): with ``--a2a`` the HTTP door serves each entity type as an A2A
agent, on the official ``a2a-sdk`` (the ``[a2a]`` extra).

``face.py`` is the door's front (cards, tokens, the SDK's JSON-RPC and HTTP+JSON routes),
``handler.py`` answers A2A's operations with the entity service, ``tasks.py`` reads a task
from the entity's stream, and ``states.py`` is the one table of task states. Only
``check_a2a`` and ``states`` load without the extra: the server imports the rest with ``--a2a``.
"""

from __future__ import annotations

import importlib.util

from ..config_error import ConfigError

__all__ = ["check_a2a"]


def check_a2a(a2a: bool, http: str | None) -> None:
    """ConfigError unless ``--a2a`` has the HTTP door to serve on and the SDK to serve with."""
    if not a2a:
        return
    if not http:
        raise ConfigError("--a2a needs --http: the A2A agents are served on the HTTP door")
    if importlib.util.find_spec("a2a") is None:
        raise ConfigError("--a2a needs the A2A SDK: pip install 'electric-sdk[a2a]'")
