"""The store's fast paths: each one object with one question, ``ready()``, and a switch.

A fast path is a quicker way to do what a plain path does, safe only in some
states of the store. Each is one object that holds the parts whose state can
veto it and answers ``ready()`` from them, so a part added later vetoes it in
one place, not in a test spread over the store. Each has a switch, a name in
``fastpaths.SEAMS``: ``ELECTRIC_FORCE_FALLBACKS`` naming it (or ``all``)
turns it off, read once when the store opens, and the plain path runs.

Each is named in the registry of every fast path of the server
(``fastpaths/__init__.py``: what it buys, what it risks, its fallback, its
bench row): a lone SQLite write committed in its caller (``ready_queue``,
sqlite/lone_write.py), the SQLite WAL sync on the loop
(``sqlite_inline_sync``, sqlite/inline_sync.py), a lone PostgreSQL write in one
statement (``pg_one_trip``, postgres/one_trip.py), and the same on what the
replica knew (``pg_guess``, postgres/guess.py). Each module's docstring says what its fast path buys, what it risks and what
checks it.
"""

from __future__ import annotations

import functools
import logging
from typing import Protocol

from ..fastpaths import ENV, forced

__all__ = ["FastPath", "switched_on"]

log = logging.getLogger(__name__)


class FastPath(Protocol):
    def ready(self) -> bool:
        """Whether the fast path may be taken now."""
        ...


@functools.cache
def _announce(name: str) -> None:
    """Once per process, not once per store."""
    log.info("%s: the store's %s fast path is off, its plain path runs", ENV, name)


def switched_on(name: str) -> bool:
    """Whether fast path ``name`` may run: its switch is not forced off. Read when the store opens."""
    if forced(name):
        _announce(name)
        return False
    return True
