"""Whether the running server's database answers: the server is told when it is gone and when it
is back, and when it takes no writes.

Every call that loses its connection fails with ``DatabaseUnavailable`` on
its own (retryable, postgres/connections.py). The first such failure also
starts a probe, which opens a connection at once: one backend that was ended
(``pg_terminate_backend``) while the database is up changes nothing else.
When the probe fails too, the database is gone: the fault listeners (the
server's health and ``/readyz``, through store/faults.py) are told, the log
says why, and the probe tries again every ``PROBE_INTERVAL_S`` until the
database answers, then tells the listeners it is back. Nothing needs a
restart.

A database that answers but is read-only refuses every write (``REFUSED``):
the first refusal tells the listeners ``WritesRefused`` (the server's writes
are not ready, its reads are), and the next write that commits (the
replica's heartbeat, at every poll, at the latest) tells them all is well.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import asyncpg

from ...lifetime import TaskGroup
from ..base import DatabaseUnavailable, StorageFault, WritesRefused
from .faults import unreachable_reason

__all__ = ["PROBE_INTERVAL_S", "Reachability"]

log = logging.getLogger(__name__)

# How often a database that went away is tried again (a probe is one connection, one SELECT 1).
PROBE_INTERVAL_S = 0.5


class Reachability:
    """Whether the database answers, as the server must know it (see the module docstring)."""

    __slots__ = ("_gone", "_probe", "_refusing", "_task", "_tasks", "_tell", "timeout_s", "where")

    def __init__(
        self,
        where: str,
        probe: Callable[[], Awaitable[object]],
        timeout_s: float,
        tell: Callable[[StorageFault | None], None],
    ) -> None:
        self.where = where
        self.timeout_s = timeout_s  # the probe's bound
        self._probe = probe
        self._tell = tell  # the fault listeners hear it (store/faults.py)
        self._gone: DatabaseUnavailable | None = None
        self._refusing: WritesRefused | None = None  # writes refused (read-only) since the last commit
        self._task: asyncio.Task[None] | None = None  # the probe started last, in its group:
        self._tasks = TaskGroup("the database's probe")

    @property
    def gone(self) -> DatabaseUnavailable | None:
        """The fault while the database is unreachable, else None."""
        return self._gone

    @property
    def probe(self) -> asyncio.Task[None] | None:
        """The probe started last, done or not (None: none yet): for tests, to wait for its verdict."""
        return self._task

    def refuses_writes(self, why: str) -> None:
        """A write was refused for good reason of the database's (it is read-only): the server's
        writes are not ready until one commits again (``took_writes``)."""
        if self._refusing is None:
            self._refusing = WritesRefused(f"the database {self.where} takes no writes: {why}")
            self._tell_worst()

    def took_writes(self) -> None:
        """A write committed: the database takes writes."""
        if self._refusing is not None:
            self._refusing = None
            log.warning("the database %s takes writes again: writes are ready", self.where)
            self._tell_worst()

    def lost(self) -> None:
        """A call lost its connection: find out whether the database is still there."""
        if (self._task is None or self._task.done()) and not self._tasks.closed:
            self._task = self._tasks.start_soon(self._follow(), name="electric-postgres-probe")

    async def close(self) -> None:
        await self._tasks.aclose()

    async def _follow(self) -> None:
        while True:
            try:
                await self._probe()
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                if self._gone is None:
                    why = unreachable_reason(exc, self.where, self.timeout_s)
                    self._gone = DatabaseUnavailable(f"the database {self.where} cannot be reached: {why}")
                    log.error(
                        "the database %s cannot be reached (%s): calls are answered UNAVAILABLE "
                        "and the server is not ready until it answers again (tried every %g s)",
                        self.where,
                        why,
                        PROBE_INTERVAL_S,
                    )
                    self._tell_worst()
                await asyncio.sleep(PROBE_INTERVAL_S)
                continue
            if self._gone is not None:
                self._gone = None
                log.warning("the database %s answers again: serving", self.where)
                self._tell_worst()
            return

    def _tell_worst(self) -> None:
        """The listeners hear the worst of now: gone, else writes refused, else None (all is well)."""
        self._tell(self._gone or self._refusing)
