"""The replica id on every log record a server writes: `electric workers` names each session's
replica by it, so an operator can find that replica's lines (docs/operations.md, "Logs").

A record gets it as its ``replica`` attribute, from a record factory installed once per process:
the id of the server whose task (or a thread it started with ``to_thread``, which copies the
context) logged it. A record logged outside any server's context (grpc's or Python's own threads)
gets the id of the process's only live server, and none when several run in one process (tests):
a wrong id would be worse than none. The JSON format logs it as a field like any ``extra``; the
text format puts it after the level (electric_sdk/cli/logs.py).
"""

from __future__ import annotations

import contextvars
import logging
import uuid
from typing import Any

__all__ = ["REPLICA_FIELD", "new_replica_id", "replica_ended", "tag_logs"]

REPLICA_FIELD = "replica"

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("electric_replica", default=None)
# The live servers of this process, by replica id (a dict for its order: an ordered set).
_live: dict[str, None] = {}
_installed: list[bool] = []


def new_replica_id() -> str:
    """A server process's id in the session book, its logs and `electric workers`."""
    return uuid.uuid4().hex[:12]


def tag_logs(replica: str) -> None:
    """From now on, records logged in the calling task's context (and the tasks and threads it
    starts) carry ``replica``; the server is live until ``replica_ended``."""
    _install()
    _live[replica] = None
    _current.set(replica)


def replica_ended(replica: str) -> None:
    """The server stopped (or never started): other threads' records no longer fall back to it."""
    _live.pop(replica, None)


def _install() -> None:
    if _installed:
        return
    _installed.append(True)
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        replica = _current.get()
        if replica is None and len(_live) == 1:
            replica = next(iter(_live))
        if replica is not None and not hasattr(record, REPLICA_FIELD):
            setattr(record, REPLICA_FIELD, replica)
        return record

    logging.setLogRecordFactory(factory)
