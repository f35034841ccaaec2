"""The PostgreSQL store's pool of connections: opening it, each call's connection, and what a lost
or refusing connection fails the call with.

A pool of ``pool_size`` connections (4 by default) serves reads and writes;
each connection runs with ``synchronous_commit=on``, so an acknowledged write
is on PostgreSQL's disk. A connection that is refused, lost or cut off fails
the call with ``DatabaseUnavailable`` (UNAVAILABLE for the client, who
retries), never a hang: every statement and every wait for a connection is
bounded by ``timeout_s``. A lost one also tells the store (``lost``: the
reachability probe, and forgetting what was known); a read-only database's
refusal tells it the writes are refused (``refuses_writes``). The URL's
password is never logged (``redacted``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg

from ...lifetime import TaskGroup
from ..base import DatabaseUnavailable, WritesRefused
from .cancelled_connects import quiet_cancelled_connects
from .faults import LOST, REFUSED, RefusedLog, lost_reason, refusal, unreachable_reason
from .statements import SELECT_BACKEND_START, SESSION_SETTINGS

__all__ = ["Connections"]

log = logging.getLogger(__name__)


class Connections:
    """See the module docstring. ``where``: the database's URL, redacted."""

    __slots__ = (
        "_pool",
        "_refused",
        "_tasks",
        "backend_starts",
        "lost",
        "pool_size",
        "refuses_writes",
        "timeout_s",
        "url",
        "where",
    )

    def __init__(self, url: str, where: str, pool_size: int, timeout_s: float) -> None:
        self.url = url
        self.where = where
        self.pool_size = pool_size
        # The longest a call waits for a pooled connection (its statements have the same bound).
        self.timeout_s = timeout_s
        self._pool: Any = None
        self._refused = RefusedLog(where)
        # Told when a call lost its connection, and when the database refused a write (why).
        self.lost: Callable[[], None] = lambda: None
        self.refuses_writes: Callable[[str], None] = lambda why: None
        # Each pooled connection's backend's start, by its pid (set as it connects): with the pid,
        # it names the backend of a lone write whose connection was lost (postgres/one_trip.py).
        self.backend_starts: dict[int, Any] = {}
        # Connections being handed back to the pool (``connection``), and the pool's close: anew
        # at each open (lifetime.py).
        self._tasks = TaskGroup("the database connections")

    @property
    def pool(self) -> Any:
        """The asyncpg pool (None while closed): for tests and tools that need a connection."""
        return self._pool

    async def open(self) -> Any:
        """Open the pool; returns it. Raises ``ValueError`` for a URL PostgreSQL does not take, and
        ``DatabaseUnavailable`` saying why for a database that refuses."""
        self._tasks = TaskGroup("the database connections")
        # Every connect of this store (pool, feed, probe) runs on this loop.
        quiet_cancelled_connects()
        try:
            return await asyncpg.create_pool(
                self.url,
                min_size=self.pool_size,
                max_size=self.pool_size,
                timeout=self.timeout_s,
                command_timeout=self.timeout_s,
                server_settings={
                    **SESSION_SETTINGS,
                    "synchronous_commit": "on",
                    "application_name": "electric",
                },
                reset=_no_reset,
                init=self._connected,
            )
        except asyncpg.exceptions.ClientConfigurationError as exc:
            raise ValueError(f"the database URL {self.where} is not one PostgreSQL takes: {exc}") from exc
        except (*LOST, asyncpg.PostgresError) as exc:  # refused: a wrong password, no such database
            why = refusal(exc, self.where, self.timeout_s)
            raise DatabaseUnavailable(f"cannot open the database {self.where}: {why}") from exc

    def serve(self, pool: Any) -> None:
        """From now on, calls take their connections from ``pool`` (its schema is set up)."""
        self._pool = pool

    async def _connected(self, conn: Any) -> None:
        self.backend_starts[conn.get_server_pid()] = await conn.fetchval(SELECT_BACKEND_START)

    def detach(self) -> Any:
        """Take the pool away (returned: None if closed already): no call takes a connection from
        it any more ("store is closed"), and ``close`` it once what uses it has ended."""
        pool, self._pool = self._pool, None
        return pool

    async def close(self, pool: Any) -> None:
        """Close the ``detach``ed ``pool``, bounded."""
        # pool.close() waits for the connections in use to be released and says goodbye on each:
        # bounded, since a database that stopped answering would keep a draining server up for
        # ever. Past the bound the connections are dropped under it (not it cancelled: asyncpg
        # then leaves the goodbyes' futures failed with no one to read them) and it ends.
        closing = self._tasks.start_soon(_closed(pool), name="electric-pool-close")
        await asyncio.wait((closing,), timeout=self.timeout_s)
        failed: BaseException | None = TimeoutError() if not closing.done() else None
        if failed is not None:
            pool.terminate()  # under it: it ends, and its own errors are read below
        refused = await closing
        if refused is not None:
            failed = failed or refused
            pool.terminate()
        if failed is not None:
            log.warning(
                "closing the database connections failed (%s): they are dropped",
                lost_reason(failed, self.timeout_s),
            )
        await self._tasks.aclose()  # the hand-backs still under way end with the pool

    async def probe(self) -> None:
        """One new connection and a query: the pool's may all be busy, or dead."""
        conn = await asyncpg.connect(self.url, timeout=self.timeout_s)
        try:
            await conn.fetchval("SELECT 1", timeout=self.timeout_s)
        finally:
            conn.terminate()

    @contextlib.asynccontextmanager
    async def connection(self, what: str) -> AsyncIterator[Any]:
        """A pooled connection; a lost or refused one fails the call with DatabaseUnavailable.

        asyncpg's pool spends a task on each acquire with a timeout (``wait_for``) and on each
        release (``shield``): two turns of the loop each, in which every other ready callback
        runs first, on every write's path (a lone write's answer waited 0.1-0.2 ms more for
        them: bench/bench_dbos.py's SIGINT). So a connection idle in the pool is taken without
        a timeout (it is there: nothing waits), and every one is handed back in a task of its
        own that the caller does not wait for.
        """
        pool = self._pool
        if pool is None:
            raise RuntimeError("store is closed")
        try:
            try:
                if pool.get_idle_size() > 0:
                    conn = await pool.acquire()
                else:
                    conn = await pool.acquire(timeout=self.timeout_s)
            except asyncpg.PostgresError as exc:
                # A new connection refused by PostgreSQL: the database dropped or renamed, the
                # login revoked. The call fails UNAVAILABLE (not INTERNAL), saying why.
                if isinstance(exc, LOST):
                    raise
                why = unreachable_reason(exc, self.where, self.timeout_s)
                raise DatabaseUnavailable(f"{what} failed: {why}") from exc
            try:
                yield conn
            finally:
                self._release_later(pool, conn)
        except LOST as exc:
            self.lost()
            raise DatabaseUnavailable(f"{what} failed: {lost_reason(exc, self.timeout_s)}") from exc
        except REFUSED as exc:  # there, but it will not do the work (e.g. read-only, a full disk)
            why = self._refused.note(what, exc)
            if isinstance(exc, asyncpg.exceptions.ReadOnlySQLTransactionError):
                self.refuses_writes(why)
                raise WritesRefused(f"{what} failed: {why}") from exc
            raise DatabaseUnavailable(f"{what} failed: {why}") from exc
        except DatabaseUnavailable:  # e.g. lost during COMMIT
            self.lost()
            raise

    def _release_later(self, pool: Any, conn: Any) -> None:
        """``conn`` back to ``pool``, in a task of its own (see ``connection``), started a turn
        later: what the caller wakes next (a lone write's watchers, published right after this)
        runs first. The pool's close waits for it like for any connection in use."""
        asyncio.get_running_loop().call_soon(self._start_release, pool, conn)

    def _start_release(self, pool: Any, conn: Any) -> None:
        if self._tasks.closed:
            return  # the pool was closed meanwhile, and its connections with it
        self._tasks.start_soon(_release(pool, conn), name="electric-pool-release")


async def _closed(pool: Any) -> BaseException | None:
    """Close ``pool``; what a lost or refusing database made it fail with, if anything (an
    answer, not a crash of the task: ``Connections.close`` says it)."""
    try:
        await pool.close()
    except (*LOST, asyncpg.PostgresError) as exc:
        failure: BaseException = exc  # (asyncpg has no type hints)
        return failure
    return None


async def _release(pool: Any, conn: Any) -> None:
    try:
        await pool.release(conn)
    except Exception as exc:
        # asyncpg has terminated the connection and put its holder back: the pool opens a new one
        # when it is next needed. Nothing was lost but that connection.
        log.warning("handing a database connection back to the pool failed (%s: %s)", type(exc).__name__, exc)


async def _no_reset(conn: Any) -> None:
    """A pooled connection's reset: none past asyncpg's own rollback of an open transaction. The
    store's statements leave no session state (no LISTEN, SET or session advisory lock: the feed
    listens on its own connection), and the default reset is a round trip on every write's path."""
