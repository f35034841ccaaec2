"""The PostgreSQL store, on asyncpg: the same contract as SQLite, for one server replica now.

``PostgresStore`` is the entry point; its parts, each in its own module:

- ``rows`` and ``outcome``: the row ↔ record mappings and what a decided write
  becomes (shared with SQLite);
- ``postgres_schema``: the schema, its versions and every statement;
- ``postgres_writer``: how a batch of writes is applied in one transaction;
- ``postgres_one_write``: a lone write in two round trips and no transaction
  block (a read, then one statement that commits by itself), which goes to
  the batch path when it raced;
- ``postgres_faults``: what an unreachable database is told as, at start and
  while running (the server's readiness follows it);
- ``postgres_feed`` and ``feed_order``: how commits reach the other replicas
  on the database (a feed table, a doorbell, polling behind it) and are
  published to each one's ``Hub`` in commit order, once;
- here: the connection pool, opening and closing, what a lost connection
  means, and the reads.

A pool of ``pool_size`` connections (4 by default) serves reads and writes;
each connection runs with ``synchronous_commit=on``, so an acknowledged write
is on PostgreSQL's disk. A connection that is refused, lost or cut off fails
the call with ``DatabaseUnavailable`` (UNAVAILABLE for the client, who
retries), never a hang: every statement and every wait for a connection is
bounded. The URL's password is never logged (``redacted``).

Several replicas may share one database: leases and worker sessions are rows
(``postgres_sessions``; a lease's holder is judged live by each write, as it
reads the entity's row), and the deadline sweeps' reads below claim rows with
``FOR UPDATE SKIP LOCKED`` by PostgreSQL's clock, so whichever replica finds a
deadline due fires it, and the write's compare-and-set makes it fire once.
Commits reach the ``Hub`` of every store on the database through the commit
feed (``postgres_feed``): watchers, worker sessions and offers on any replica
see each commit, whichever replica made it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg

from electric_sdk.lifecycle import State

from ..base import (
    REMOTE_COMMIT,
    Commit,
    DatabaseUnavailable,
    EntityRecord,
    FaultListener,
    Hub,
    Ref,
    StoreCounter,
    StoredEvent,
    SweepFinds,
    TypeProfile,
)
from ..database_url import DEFAULT_DATABASE_POOL, DEFAULT_DATABASE_TIMEOUT_MS, redacted
from ..feed_order import FeedOrder
from ..rows import entity_from_row, event_from_row
from ..sql_reads import SQLReads
from .faults import LOST, Reachability, lost_reason, refusal, setup_refusal
from .feed import DEFAULT_POLL_S, Doorbell, FeedReader
from .schema import (
    PURGE_IDEMPOTENCY,
    SELECT_BACKEND_START,
    SELECT_DUE_DEADLINES,
    SELECT_ENTITIES,
    SELECT_ENTITY,
    SELECT_EVENTS,
    SELECT_HEAD_TXID,
    SELECT_IDEMPOTENCY,
    SELECT_LOST_LEASES,
    SELECT_SETTLED,
    SELECT_STOPPING_DEADLINES,
    SELECT_TYPE_PROFILES,
    SELECT_UNLEASED,
    SESSION_SETTINGS,
    SWEEP_FINDS,
    UPSERT_TYPE_PROFILE,
    SchemaTooNew,
    migrate,
)
from .sessions import PostgresSessions
from .writer import PostgresWriter

__all__ = ["PostgresStore"]

log = logging.getLogger(__name__)

# A schema version applied at start may rewrite a large table, or wait for another replica's.
MIGRATION_TIMEOUT_S = 600.0
PURGE_SLICE = 1000  # idempotency keys forgotten per transaction


class PostgresStore(SQLReads, PostgresWriter):
    """See the module docstring. ``url`` is a ``postgresql://`` URL."""

    select_stopping_deadlines = SELECT_STOPPING_DEADLINES
    select_type_profiles = SELECT_TYPE_PROFILES

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = DEFAULT_DATABASE_POOL,
        feed: bool = True,
        feed_poll_s: float = DEFAULT_POLL_S,
        notify: bool = True,
        timeout_s: float = DEFAULT_DATABASE_TIMEOUT_MS / 1000,
    ) -> None:
        if pool_size < 1:
            raise ValueError(f"the database pool must have at least 1 connection, not {pool_size}")
        if feed_poll_s <= 0:
            raise ValueError(f"the feed's poll interval must be positive, not {feed_poll_s}")
        if timeout_s <= 0:
            raise ValueError(f"the database timeout must be positive, not {timeout_s}")
        # Every wait on the database is bounded by ``timeout_s`` (connecting, a pooled connection, a
        # statement), so one that stops answering fails calls UNAVAILABLE instead of hanging them.
        super().__init__(concurrent_batches=pool_size, timeout_s=timeout_s, where=redacted(url))
        self.url = url
        self.pool_size = pool_size
        self.hub = Hub()
        self._reachability = Reachability(redacted(url), self._probe, timeout_s)
        # Its heartbeat, a write at every poll, is what tells the writes are ready again.
        self.sessions = PostgresSessions(self._connection, self._took_writes)
        # The commit feed (postgres_feed.py): off (a tool's store), commits reach this store's hub only.
        self.feed = feed
        self.feed_poll_s = feed_poll_s
        self.notify = notify  # off (tests): the other replicas learn of commits by polling alone
        self.feed_reader: FeedReader | None = None

    def __repr__(self) -> str:
        return f"PostgresStore({redacted(self.url)!r}, pool_size={self.pool_size})"

    async def open(self) -> None:
        where = redacted(self.url)
        try:
            pool = await asyncpg.create_pool(
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
            raise ValueError(f"the database URL {where} is not one PostgreSQL takes: {exc}") from exc
        except (*LOST, asyncpg.PostgresError) as exc:  # refused: a wrong password, no such database
            why = refusal(exc, where, self.timeout_s)
            raise DatabaseUnavailable(f"cannot open the database {where}: {why}") from exc
        try:
            async with pool.acquire(timeout=self.timeout_s) as conn:
                version = await migrate(conn, MIGRATION_TIMEOUT_S)
        except SchemaTooNew as exc:
            await pool.close()
            raise DatabaseUnavailable(f"the database {where}: {exc}") from exc
        except (*LOST, asyncpg.PostgresError) as exc:
            pool.terminate()
            raise DatabaseUnavailable(f"cannot set up the database {where}: {setup_refusal(exc)}") from exc
        self._pool = pool
        if self.feed:
            try:
                await self._open_feed(where)
            except BaseException:
                self._pool = None
                pool.terminate()
                await self._close_feed()
                raise
        log.info("on PostgreSQL %s (schema version %d, %d connections)", where, version, self.pool_size)

    async def _open_feed(self, where: str) -> None:
        # An origin of this store's own (a random 63-bit number): its rows in the feed are its own.
        self.origin = secrets.randbits(63)
        order = FeedOrder(self._publish, self._read_feed_soon)
        reader = FeedReader(self.url, order, self.origin, self.feed_poll_s, self.timeout_s)
        doorbell = Doorbell(self.url, self.timeout_s, enabled=self.notify, heard=reader.heard)
        self.feed_reader, self.doorbell = reader, doorbell  # closed by _close_feed if one fails
        try:
            await reader.open()
            await doorbell.open()
        except (*LOST, asyncpg.PostgresError) as exc:
            raise DatabaseUnavailable(f"cannot open the commit feed on {where}: {_reason(exc)}") from exc
        self.feed_order = reader.order

    def _publish(self, commits: Sequence[Commit]) -> None:
        """Commits to this replica's Hub, in order; the other replicas' are known from then."""
        for commit in commits:
            if commit.result is REMOTE_COMMIT and commit.after is not None:
                self.known.learn(commit.after, None)  # read by the feed: nothing to wait for
        self.hub.publish_many(commits)

    def _read_feed_soon(self) -> None:
        if self.feed_reader is not None:
            self.feed_reader.read_soon()

    async def _close_feed(self) -> None:
        doorbell, self.doorbell = self.doorbell, None
        reader, self.feed_reader = self.feed_reader, None
        self.feed_order = None
        if isinstance(doorbell, Doorbell):
            await doorbell.close()
        if reader is not None:
            await reader.close()

    async def close(self) -> None:
        await self._reachability.close()
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for task in tuple(self.finding_out):
            task.cancel()
        await self._close_feed()
        # pool.close() waits for the connections in use to be released and says goodbye on each:
        # bounded, since a database that stopped answering would keep a draining server up for
        # ever. Past the bound the connections are dropped under it (not it cancelled: asyncpg
        # then leaves the goodbyes' futures failed with no one to read them) and it ends.
        closing = asyncio.ensure_future(pool.close())
        await asyncio.wait((closing,), timeout=self.timeout_s)
        failed: BaseException | None = TimeoutError() if not closing.done() else None
        if failed is not None:
            pool.terminate()  # under it: it ends, and its own errors are read below
        try:
            await closing
        except (*LOST, asyncpg.PostgresError) as exc:
            failed = failed or exc
            pool.terminate()
        if failed is not None:
            log.warning(
                "closing the database connections failed (%s): they are dropped",
                lost_reason(failed, self.timeout_s),
            )

    async def _connected(self, conn: Any) -> None:
        self.backend_starts[conn.get_server_pid()] = await conn.fetchval(SELECT_BACKEND_START)

    def counters(self) -> Sequence[StoreCounter]:
        return self.known.counters()

    def subscribe_faults(self, callback: FaultListener) -> Callable[[], None]:
        # Nothing stops writes for good here: an unreachable database fails each call (retryable),
        # and listeners hear when it is gone and when it is back; a read-only one, when it
        # refuses a write and when one commits again.
        return self._reachability.subscribe(callback)

    def _connection_lost(self) -> None:
        self._reachability.lost()

    def _writes_refused(self, why: str) -> None:
        self._reachability.refuses_writes(why)

    def _took_writes(self) -> None:
        self._reachability.took_writes()

    async def _probe(self) -> None:
        """One new connection and a query: the pool's may all be busy, or dead."""
        conn = await asyncpg.connect(self.url, timeout=self.timeout_s)
        try:
            await conn.fetchval("SELECT 1", timeout=self.timeout_s)
        finally:
            conn.terminate()

    # -- reads -----------------------------------------------------------------

    async def fetch(self, sql: str, args: Sequence[object] = ()) -> list[Any]:
        async with self._connection("a read") as conn:
            rows: list[Any] = await conn.fetch(sql, *args)
            return rows

    async def get_entity(self, ref: Ref) -> EntityRecord | None:
        rows = await self.fetch(SELECT_ENTITY, ref)
        return entity_from_row(rows[0]) if rows else None

    async def list_entities(
        self, type: str | None, states: Sequence[State], after: Ref | None, limit: int
    ) -> list[EntityRecord]:
        where: list[str] = []
        args: list[object] = []
        if type:
            args.append(type)
            where.append(f"type = ${len(args)}")
        if states:
            args.append([s.value for s in states])
            where.append(f"state = ANY(${len(args)}::text[])")
        if after is not None:
            args.extend(after)
            where.append(f"(type, id) > (${len(args) - 1}, ${len(args)})")
        sql = SELECT_ENTITIES
        if where:
            sql += " WHERE " + " AND ".join(where)
        args.append(limit)
        sql += f" ORDER BY type, id LIMIT ${len(args)}"
        return [entity_from_row(r) for r in await self.fetch(sql, args)]

    async def read_events(self, ref: Ref, from_offset: int, limit: int) -> list[StoredEvent]:
        return [event_from_row(r) for r in await self.fetch(SELECT_EVENTS, (*ref, from_offset, limit))]

    async def idempotent_response(self, ref: Ref, key: str) -> tuple[bytes, bytes] | None:
        rows = await self.fetch(SELECT_IDEMPOTENCY, (*ref, key))
        return (bytes(rows[0][0]), bytes(rows[0][1])) if rows else None

    async def store_type_profile(self, profile: TypeProfile) -> None:
        async with self._connection("a type profile's announcement") as conn:
            await conn.execute(UPSERT_TYPE_PROFILE, *profile)

    async def head_txid(self) -> int:
        (row,) = await self.fetch(SELECT_HEAD_TXID)
        return int(row[0])

    # -- the deadline sweeps' reads (store/base.py) --------------------------------------------

    async def due_deadlines(self, limit: int) -> list[tuple[Ref, int]]:
        rows = await self.fetch(SELECT_DUE_DEADLINES, (limit,))
        return [((str(t), str(i)), int(d)) for t, i, d in rows]

    async def lost_leases(self, limit: int) -> list[tuple[Ref, int]]:
        return [((str(t), str(i)), int(e)) for t, i, e in await self.fetch(SELECT_LOST_LEASES, (limit,))]

    async def settled_streams(self, settle_ms: int, limit: int) -> list[Ref]:
        return [(str(t), str(i)) for t, i in await self.fetch(SELECT_SETTLED, (settle_ms, limit))]

    async def unleased(self, types: Sequence[str], states: Sequence[State], limit: int) -> list[EntityRecord]:
        args = (list(types), [s.value for s in states], limit)
        return [entity_from_row(r) for r in await self.fetch(SELECT_UNLEASED, args)]

    async def sweep_finds(
        self, settle_ms: int, types: Sequence[str], states: Sequence[State], limit: int
    ) -> SweepFinds:
        args = (limit, settle_ms, list(types), [s.value for s in states])
        found = SweepFinds([], [], [])
        for row in await self.fetch(SWEEP_FINDS, args):
            record = entity_from_row(tuple(row)[1:])
            if row[0] == 1:
                found.lost.append((record.ref, record.lease_epoch))
            elif row[0] == 2:
                found.settled.append(record.ref)
            else:
                found.unleased.append(record)
        return found

    async def purge_idempotency(self, retention_ms: int, prefix: str = "") -> int:
        # In slices, each its own short transaction: a day of keys is not one long lock.
        purged = 0
        while True:
            async with self._connection("a purge of old idempotency keys") as conn:
                status: str = await conn.execute(PURGE_IDEMPOTENCY, retention_ms, prefix + "%", PURGE_SLICE)
            deleted = int(status.rsplit(" ", 1)[-1])  # "DELETE n"
            purged += deleted
            if deleted < PURGE_SLICE:
                return purged


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def _no_reset(conn: Any) -> None:
    """A pooled connection's reset: none past asyncpg's own rollback of an open transaction. The
    store's statements leave no session state (no LISTEN, SET or session advisory lock: the feed
    listens on its own connection), and the default reset is a round trip on every write's path."""
