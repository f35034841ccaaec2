"""The PostgreSQL store, on asyncpg: the same contract as SQLite, for one server replica or many
on one database.

``PostgresStore`` holds its parts, each an object in a module of its own:

- the group committer (store/committer.py), shared with SQLite, whose
  backend here is the ``PostgresWriter`` (postgres/writer.py): up to the
  pool's size of batches at once, each a ``PostgresTransaction`` on its
  locked rows (postgres/transaction.py);
- the fast paths (store/fastpath.py): ``OneTrip``, a lone write in one
  statement that commits by itself after a read (postgres/one_trip.py), and
  inside it ``Guess``, the same without the read, on what the replica knew
  (postgres/guess.py, postgres/known.py);
- ``Connections`` (postgres/connections.py): the pool, and what a lost or
  refusing connection fails a call with; ``Reachability``
  (postgres/reachability.py): whether the database is there, told to the
  fault listeners through the shared fault policy (store/faults.py);
- the commit feed: ``Publisher`` (postgres/publisher.py) publishes to the
  ``Hub`` through the ``FeedOrder`` (store/feed_order.py); the ``FeedReader``
  and ``Doorbell`` (postgres/feed.py) bring the other replicas' commits;
- the schema (postgres/schema.py), every statement (postgres/statements.py)
  and the session book (postgres/sessions.py);
- here: opening and closing, and the reads.

Several replicas may share one database: leases and worker sessions are rows
(a lease's holder is judged live by each write, as it reads the entity's
row), and the deadline sweeps' reads below claim rows with ``FOR UPDATE SKIP
LOCKED`` by PostgreSQL's clock, so whichever replica finds a deadline due
fires it, and the write's compare-and-set makes it fire once. Commits reach
the ``Hub`` of every store on the database through the commit feed:
watchers, worker sessions and offers on any replica see each commit,
whichever replica made it.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg

from electric_sdk.lifecycle import State

from ..base import (
    DatabaseUnavailable,
    EntityRecord,
    FaultListener,
    Ref,
    StoreCounter,
    StoredEvent,
    SweepFinds,
    TypeProfile,
    VersionChoice,
    Write,
    WriteOutcome,
)
from ..committer import GroupCommitter, Outcome
from ..database_url import DEFAULT_DATABASE_POOL, DEFAULT_DATABASE_TIMEOUT_MS, redacted
from ..faults import Faults
from ..feed_order import FeedOrder
from ..hub import Hub
from ..rows import entity_from_row, event_from_row
from ..sql_reads import SQLReads, cascades_due_sql
from .connections import Connections
from .faults import LOST, setup_refusal
from .feed import DEFAULT_POLL_S, Doorbell, FeedReader
from .guess import Guess
from .known import Known
from .one_trip import OneTrip
from .publisher import Publisher
from .reachability import Reachability
from .schema import SchemaTooNew, migrate
from .sessions import PostgresSessions
from .statements import (
    PURGE_IDEMPOTENCY,
    SELECT_AWAITING,
    SELECT_BOUND_RUNS,
    SELECT_CHILDREN_ENDED,
    SELECT_DUE_DEADLINES,
    SELECT_ENTITIES,
    SELECT_ENTITY,
    SELECT_EVENTS,
    SELECT_HEAD_TXID,
    SELECT_IDEMPOTENCY,
    SELECT_INTERRUPTS_DUE,
    SELECT_LOST_LEASES,
    SELECT_SETTLED,
    SELECT_STOPPING_DEADLINES,
    SELECT_TYPE_PROFILES,
    SELECT_UNLEASED,
    SELECT_VERSION_CHOICES,
    SWEEP_FINDS,
    UPSERT_TYPE_PROFILE,
    UPSERT_VERSION_CHOICE,
)
from .writer import PostgresWriter

__all__ = ["PostgresStore"]

log = logging.getLogger(__name__)

# A schema version applied at start may rewrite a large table, or wait for another replica's.
MIGRATION_TIMEOUT_S = 600.0
PURGE_SLICE = 1000  # idempotency keys forgotten per transaction
# The most lone writes one batch gathers.
MAX_BATCH = 256


class PostgresStore(SQLReads):
    """See the module docstring. ``url`` is a ``postgresql://`` URL."""

    select_stopping_deadlines = SELECT_STOPPING_DEADLINES
    select_type_profiles = SELECT_TYPE_PROFILES
    select_version_choices = SELECT_VERSION_CHOICES
    select_bound_runs = SELECT_BOUND_RUNS
    select_children_ended = SELECT_CHILDREN_ENDED
    select_interrupts_due = SELECT_INTERRUPTS_DUE
    select_awaiting = SELECT_AWAITING
    select_cascades_due = cascades_due_sql("$1", ' COLLATE "C"')

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
        self.url = url
        self.where = redacted(url)  # what a refused connection names: the URL, password hidden
        self.pool_size = pool_size
        # Every wait on the database is bounded by ``timeout_s`` (connecting, a pooled connection, a
        # statement), so one that stops answering fails calls UNAVAILABLE instead of hanging them.
        self.timeout_s = timeout_s
        self.hub = Hub()
        # Nothing stops writes for good here: an unreachable database fails each call (retryable),
        # and the fault listeners hear when it is gone and when it is back; a read-only one, when
        # it refuses a write and when one commits again.
        self.faults = Faults(self.where)
        self.connections = Connections(url, self.where, pool_size, timeout_s)
        self.reachability = Reachability(self.where, self.connections.probe, timeout_s, self.faults.tell)
        # What this replica knew of the entities last, which may spare a lone write its read.
        self.known = Known()
        self.connections.lost = self._connection_lost
        self.connections.refuses_writes = self.reachability.refuses_writes
        self.publisher = Publisher(self.hub, self.known, self.reachability.took_writes)
        self.writer = PostgresWriter(self.connections, self.publisher)
        self.one_trip = OneTrip(self.connections, self.publisher, Guess(self.known))
        self.committer = GroupCommitter(
            self.writer,
            self.faults,
            name="electric-postgres-writer",
            max_batches=pool_size,
            max_batch_writes=MAX_BATCH,
            here=self.one_trip,
            lone=self.one_trip,
            start_at_once=True,
            drain=False,
        )
        # Its heartbeat, a write at every poll, is what tells the writes are ready again.
        self.sessions = PostgresSessions(self.connections.connection, self.reachability.took_writes)
        # The commit feed (postgres/feed.py): off (a tool's store), commits reach this store's hub only.
        self.feed = feed
        self.feed_poll_s = feed_poll_s
        self.notify = notify  # off (tests): the other replicas learn of commits by polling alone
        self.feed_reader: FeedReader | None = None
        self.doorbell: Doorbell | None = None
        self.origin = 0  # this replica's in the feed's rows (a random 63-bit number, with the feed)

    def __repr__(self) -> str:
        return f"PostgresStore({self.where!r}, pool_size={self.pool_size})"

    # -- what tests, benchmarks and operators read ---------------------------------------------

    @property
    def feed_order(self) -> FeedOrder | None:
        """How commits are published with the other replicas' (None: without the feed)."""
        return self.publisher.order

    @property
    def batches_committed(self) -> int:
        """Batches committed (lone writes included)."""
        return self.committer.batches_committed

    @property
    def batches_retried(self) -> int:
        """Batches run again after a deadlock or a serialization failure."""
        return self.committer.batches_retried

    @property
    def lone_writes(self) -> int:
        """Lone writes committed in one or two round trips (postgres/one_trip.py)."""
        return self.one_trip.lone_writes

    @property
    def finding_out(self) -> set[Any]:
        """Lone writes whose outcome is unknown, being found out (their tasks)."""
        return self.one_trip.finding_out

    @property
    def backend_starts(self) -> dict[int, Any]:
        return self.connections.backend_starts

    def counters(self) -> Sequence[StoreCounter]:
        return self.known.counters()

    # -- lifecycle -----------------------------------------------------------

    async def open(self) -> None:
        where = self.where
        pool = await self.connections.open()
        try:
            async with pool.acquire(timeout=self.timeout_s) as conn:
                version = await migrate(conn, MIGRATION_TIMEOUT_S)
        except SchemaTooNew as exc:
            await pool.close()
            raise DatabaseUnavailable(f"the database {where}: {exc}") from exc
        except (*LOST, asyncpg.PostgresError) as exc:
            pool.terminate()
            raise DatabaseUnavailable(f"cannot set up the database {where}: {setup_refusal(exc)}") from exc
        self.connections.serve(pool)
        if self.feed:
            try:
                await self._open_feed()
            except BaseException:
                self.connections.detach()
                pool.terminate()
                await self._close_feed()
                raise
        self.one_trip.open(self.origin)
        self.committer.start()
        log.info("on PostgreSQL %s (schema version %d, %d connections)", where, version, self.pool_size)

    async def _open_feed(self) -> None:
        # An origin of this store's own (a random 63-bit number): its rows in the feed are its own.
        self.origin = self.writer.origin = secrets.randbits(63)
        publisher = self.publisher
        order = FeedOrder(publisher.remote, publisher.read_soon)
        reader = FeedReader(self.url, order, self.origin, self.feed_poll_s, self.timeout_s)
        doorbell = Doorbell(self.url, self.timeout_s, enabled=self.notify, heard=reader.heard)
        self.feed_reader, self.doorbell = reader, doorbell  # closed by _close_feed if one fails
        publisher.reader = reader
        try:
            await reader.open()
            await doorbell.open()
        except (*LOST, asyncpg.PostgresError) as exc:
            raise DatabaseUnavailable(f"cannot open the commit feed on {self.where}: {_reason(exc)}") from exc
        publisher.order, publisher.doorbell = reader.order, doorbell

    async def _close_feed(self) -> None:
        publisher = self.publisher
        publisher.order = publisher.doorbell = publisher.reader = None
        doorbell, self.doorbell = self.doorbell, None
        reader, self.feed_reader = self.feed_reader, None
        if doorbell is not None:
            await doorbell.close()
        if reader is not None:
            await reader.close()

    async def close(self) -> None:
        await self.reachability.close()
        pool = self.connections.detach()
        if pool is None:
            return
        await self.committer.close()  # what is queued is refused; batches under way end by themselves
        await self.one_trip.close()
        await self._close_feed()
        await self.connections.close(pool)

    def _connection_lost(self) -> None:
        # Nothing known from before is guessed on: the database may be another now (a failover
        # to a standby behind the old primary, whose sequence could draw the spare txid again).
        self.known.reset()
        self.reachability.lost()

    # -- writes ----------------------------------------------------------------

    async def write(self, write: Write) -> WriteOutcome:
        """One write; while every connection runs a batch, it waits to share the next (group
        commit: one transaction, one round of statements' waits, for many writes). Alone, it is
        tried at once in the caller's task (postgres/one_trip.py)."""
        return await self.committer.write(write)

    async def write_many(self, writes: Sequence[Write]) -> list[Outcome]:
        return await self.committer.write_many(writes)

    def subscribe_faults(self, callback: FaultListener) -> Callable[[], None]:
        return self.faults.subscribe(callback)

    # -- reads -----------------------------------------------------------------

    async def fetch(self, sql: str, args: Sequence[object] = ()) -> list[Any]:
        async with self.connections.connection("a read") as conn:
            rows: list[Any] = await conn.fetch(sql, *args)
            return rows

    async def get_entity(self, ref: Ref) -> EntityRecord | None:
        rows = await self.fetch(SELECT_ENTITY, ref)
        return entity_from_row(rows[0]) if rows else None

    async def list_entities(
        self, type: str | None, states: Sequence[State], after: Ref | None, limit: int, parent: str = ""
    ) -> list[EntityRecord]:
        where: list[str] = []
        args: list[object] = []
        if parent:
            args.append(parent)
            where.append(f"parent = ${len(args)}")
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
        async with self.connections.connection("a type profile's announcement") as conn:
            await conn.execute(UPSERT_TYPE_PROFILE, *profile)

    async def store_version_choice(self, choice: VersionChoice) -> None:
        async with self.connections.connection("a version choice") as conn:
            await conn.execute(UPSERT_VERSION_CHOICE, *choice)

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
            async with self.connections.connection("a purge of old idempotency keys") as conn:
                status: str = await conn.execute(PURGE_IDEMPOTENCY, retention_ms, prefix + "%", PURGE_SLICE)
            deleted = int(status.rsplit(" ", 1)[-1])  # "DELETE n"
            purged += deleted
            if deleted < PURGE_SLICE:
                return purged


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
