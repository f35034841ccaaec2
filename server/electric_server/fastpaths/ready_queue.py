"""The ``ready_queue`` seam: whether anything else is ready to run on the event loop.

The SQLite store commits a write right in its caller, skipping the writer
task, when the write is alone: nobody to share a commit with
(store/sqlite/lone_write.py). Nothing else ready on the loop is what tells light
load from heavy: under load some other call is always about to run, and its
write must wait for the writer to batch it, or every write would take its own
fsync. asyncio's loop keeps the callbacks ready to run in a private deque,
``BaseEventLoop._ready`` (the same since Python 3.4), and ``ready_queue``
hands that deque out, live: empty exactly when nothing else is ready.

The fallback, for a loop without one (e.g. uvloop) or when
``ELECTRIC_FORCE_FALLBACKS`` names ``ready_queue``, is ``BUSY``, a queue that
is never empty: every write then goes through the writer task, which is
correct under any load and costs a lone write two turns of the loop.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import Sized

from . import ENV, forced

__all__ = ["BUSY", "ready_queue"]

log = logging.getLogger(__name__)

BUSY: Sized = (None,)  # never empty: always something else to run


@functools.cache
def _announce(level: int, message: str) -> None:
    """Log each path once per process, not once per store."""
    log.log(level, message)


def ready_queue(loop: asyncio.AbstractEventLoop) -> Sized:
    """``loop``'s callbacks ready to run, live (``BUSY`` for the fallback).

    Ask once per loop and keep the answer: its length is then the check, with
    no lookup per call.
    """
    if forced("ready_queue"):
        _announce(logging.INFO, f"{ENV}: every write goes through the store's writer task")
        return BUSY
    ready = getattr(loop, "_ready", None)
    if not isinstance(ready, collections.deque):
        _announce(
            logging.WARNING,
            f"{type(loop).__name__} has no ready queue asyncio's way: every write goes through the store's writer task",
        )
        return BUSY
    _announce(logging.DEBUG, "a lone write commits in its caller when nothing else is ready on the loop")
    return ready
