"""The embedded default store: one SQLite file in WAL mode.

Writes queue up while the previous batch commits; the next batch applies all
of them in one SQLite transaction and one WAL sync (group commit). Each write
is still its own logical transaction with its own txid: its decide function
raises before anything is written, so a refused write leaves no trace, and the
batch commits or fails as a whole — no caller is told "done" before its data
is durable.

``synchronous=FULL`` by default: an acknowledged append survives a crash or
power loss. SQLite runs at NORMAL and the store syncs the WAL after each
commit itself (``_sync``), so the commit — page-cache writes only — runs on the
event loop and the disk's round trip does not hold it; a commit is
acknowledged, published and readable only once synced. Checkpoints run in the
writer thread (``_checkpoint``). With EXTRA, SQLite syncs inside COMMIT, so
commits run in the writer thread.

Reads use a separate connection on the event loop's thread; WAL lets them run
alongside the writer. Reads are bounded (pages), so they never hold the loop
for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Sequence, Sized
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from electric_sdk.lifecycle import State

from ..internals.ready_queue import BUSY, ready_queue
from ..internals.wal_index import Estimate, FrameCounter, frame_counter
from .base import (
    Commit,
    EntityRecord,
    Hub,
    IdempotencyKeyReused,
    Mutation,
    Ref,
    Store,
    StoredEvent,
    Write,
    WriteContext,
    WriteOutcome,
)
from .rows import ENTITY_VALUE_INDEXES, advanced, entity_from_row, entity_row, event_from_row
from .sqlite_schema import (
    INSERT_EVENT,
    INSERT_IDEMPOTENCY,
    PURGE_IDEMPOTENCY,
    SCHEMA,
    SELECT_ENTITIES,
    SELECT_ENTITY,
    SELECT_EVENTS,
    SELECT_IDEMPOTENCY,
    SELECT_NEXT_TXID,
    SELECT_STOPPING_DEADLINES,
    SET_NEXT_TXID,
    UPSERT_ENTITY,
    migrate,
    update_entity_sql,
)

# SCHEMA and now_ms are here too for the benchmarks, which build files the store's way.
__all__ = ["CHECKPOINT_FRAMES", "ENTITY_CACHE_SIZE", "MAX_COMMIT_DELAY_MS", "SCHEMA", "SQLiteStore", "now_ms"]

log = logging.getLogger(__name__)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


MAX_COMMIT_DELAY_MS = 100
# The store checkpoints the WAL itself (SQLiteStore._checkpoint) as often as
# SQLite would (its default wal_autocheckpoint is 1,000 pages): after this many
# frames appended since the last checkpoint, as the wal_index seam counts them
# (internals/wal_index.py).
CHECKPOINT_FRAMES = 1000
ENTITY_CACHE_SIZE = 50_000


@dataclass(slots=True)
class _Staged:
    """What one batch writes, applied with one statement per table at its end."""

    entities: dict[Ref, EntityRecord] = field(default_factory=dict)
    events: list[tuple[object, ...]] = field(default_factory=list)
    idempotency: dict[tuple[str, str, str], tuple[bytes, bytes]] = field(default_factory=dict)
    idempotency_rows: list[tuple[object, ...]] = field(default_factory=list)


class _Refused(Exception):
    def __init__(self, error: Exception) -> None:
        self.error = error


class _Pending:
    __slots__ = ("future", "outcomes", "writes")

    def __init__(self, writes: Sequence[Write], future: asyncio.Future[list[WriteOutcome | BaseException]]):
        self.writes = writes
        self.future = future
        self.outcomes: list[WriteOutcome | BaseException] = []  # filled in when the batch applies


class SQLiteStore(Store):
    """See the module docstring. ``path`` is the database file."""

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "FULL",
        readonly: bool = False,
        commit_delay_ms: float = 0.0,
    ) -> None:
        if synchronous.upper() not in {"FULL", "NORMAL", "EXTRA", "OFF"}:
            raise ValueError(f"synchronous must be FULL, NORMAL, EXTRA or OFF, not {synchronous!r}")
        if not 0 <= commit_delay_ms <= MAX_COMMIT_DELAY_MS:
            raise ValueError(f"the commit delay must be 0-{MAX_COMMIT_DELAY_MS} ms, not {commit_delay_ms} ms")
        # Under concurrent load, how long a batch waits for more writes before it commits
        # (PostgreSQL's commit_delay): fewer, larger commits, for a little latency. 0: never.
        self.commit_delay_s = commit_delay_ms / 1000
        self.path = Path(path)
        self.synchronous = synchronous.upper()
        # Read-only: no writer at all, so `electric verify` can run beside a live server.
        self.readonly = readonly
        self.hub = Hub()
        self._pending: list[_Pending] = []
        self._wakeup = asyncio.Event()
        self._closing = False
        self._writer_task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._sync_executor: ThreadPoolExecutor | None = None
        # With synchronous=FULL the store syncs the WAL itself (see _sync): the
        # file it syncs, batches committed and batches synced, and the sync in flight.
        self._wal_fd: int | None = None
        self._committed = 0
        self._synced = 0
        self._syncing: asyncio.Future[None] | None = None
        self._conn_lock = asyncio.Lock()
        # Commits run on the loop unless SQLite itself must sync inside them (EXTRA).
        self._commits_on_loop = self.synchronous != "EXTRA"
        self._frames_since_checkpoint = 0
        self._frames: FrameCounter = Estimate()  # until open: see open
        self._failed: OSError | None = None
        self._writer_idle = False  # waiting for writes: nothing being applied or synced
        # The loop's callbacks ready to run, from the ready_queue seam once the store is open (see _alone).
        self._loop_ready: Sized = BUSY
        self._wconn: sqlite3.Connection | None = None
        self._rconn: sqlite3.Connection | None = None
        self._next_txid = 1
        # The writer is the only writer, so it may remember entity records
        # (bounded, least recently used first out) instead of reading them back.
        self._cache: OrderedDict[Ref, EntityRecord] = OrderedDict()
        self._last_batch_writes = 0
        # Batches committed and checkpoints run: exposed for tests and benchmarks.
        self.batches_committed = 0
        self.checkpoints = 0

    # -- lifecycle -----------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self.readonly:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None)
            conn.execute("PRAGMA busy_timeout=10000")
            return conn
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # FULL is kept by syncing the WAL after each commit in _sync, not inside COMMIT.
        conn.execute(f"PRAGMA synchronous={'NORMAL' if self.synchronous == 'FULL' else self.synchronous}")
        conn.execute("PRAGMA busy_timeout=10000")
        return conn

    def _open_writer(self) -> None:
        conn = self._connect()
        if self._commits_on_loop:
            conn.execute("PRAGMA wal_autocheckpoint=0")  # _checkpoint does it, off the loop
        migrate(conn)
        row = conn.execute(SELECT_NEXT_TXID).fetchone()
        self._next_txid = int(row[0]) if row else 1
        self._wconn = conn

    async def open(self) -> None:
        if self.readonly:
            if not self.path.exists():
                raise FileNotFoundError(f"no electric database at {self.path}")
            self._rconn = self._connect()
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="electric-sqlite-writer")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._open_writer)
        self._rconn = self._connect()
        if self.synchronous == "FULL":
            self._wal_fd = os.open(f"{self.path}-wal", os.O_RDONLY | os.O_CLOEXEC)
            self._sync_executor = ThreadPoolExecutor(1, thread_name_prefix="electric-sqlite-sync")
        if self._commits_on_loop:  # the store checkpoints itself (see _checkpoint)
            self._frames = frame_counter(self.path)
        self._loop_ready = ready_queue(loop)
        self._writer_task = asyncio.create_task(self._writer_loop(), name="electric-sqlite-writer")

    async def close(self) -> None:
        if self._writer_task is None:
            if self._rconn is not None:
                self._rconn.close()
                self._rconn = None
            return
        self._closing = True
        self._wakeup.set()
        await self._writer_task
        self._writer_task = None
        self._loop_ready = BUSY
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close_writer)
        self._executor.shutdown(wait=True)
        if self._sync_executor is not None:
            self._sync_executor.shutdown(wait=True)
            self._sync_executor = None
        if self._wal_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._wal_fd)
            self._wal_fd = None
        self._frames.close()
        self._frames = Estimate()
        if self._rconn is not None:
            self._rconn.close()
            self._rconn = None

    def _close_writer(self) -> None:
        if self._wconn is not None:
            # Fold the WAL back into the database so the file is complete on its own.
            self._wconn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._wconn.close()
            self._wconn = None

    # -- writes ----------------------------------------------------------------

    async def write(self, write: Write) -> WriteOutcome:
        if self._alone():
            outcome = self._write_now(write)
        else:
            (outcome,) = await self._submit((write,))  # not through write_many: one coroutine less
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _alone(self) -> bool:
        """Whether a write can skip the queue: light load, and nobody to share a commit with.

        The writer is idle with nothing queued, the last batch was a single
        write, and no other callback is ready on the loop. The last condition is
        what tells light load from heavy: under load some other call is always
        about to run (at 64 concurrent callers, 99% of writes find two or more
        callbacks ready; one caller's find none), and those calls' writes must
        wait for the writer to batch them, or every write would take its own
        fsync. The ready_queue seam says what is ready (internals/ready_queue.py);
        its fallback is never empty, so every write then queues.
        """
        return (
            self._writer_idle
            and not self._pending
            and self._last_batch_writes <= 1
            and self._wal_fd is not None
            and self._frames_since_checkpoint < CHECKPOINT_FRAMES
            and self._failed is None
            and not self._closing
            and not self._conn_lock.locked()
            and not self._loop_ready
        )

    def _write_now(self, write: Write) -> WriteOutcome | BaseException:
        """Commit and sync one write right here (see _alone): no hand-over to the
        writer task and back, which costs two turns of the loop."""
        pending = _Pending((write,), asyncio.get_running_loop().create_future())
        self._apply_batch([pending])  # raises if the commit failed: nobody is acknowledged
        self._counted(1)
        try:
            self._sync_here()
        except OSError as exc:
            self._fail(exc)
            raise
        self.batches_committed += 1
        self._publish([pending])
        (outcome,) = pending.outcomes
        return outcome

    async def write_many(self, writes: Sequence[Write]) -> list[WriteOutcome | BaseException]:
        return await self._submit(writes)

    def _submit(self, writes: Sequence[Write]) -> asyncio.Future[list[WriteOutcome | BaseException]]:
        """Queue writes for the writer (in call order: the order they are applied in)."""
        if self._failed is not None:
            raise RuntimeError(f"the store stopped after a failed WAL sync: {self._failed}")
        if self._closing or self._writer_task is None:
            raise RuntimeError("store is closed")
        future: asyncio.Future[list[WriteOutcome | BaseException]] = (
            asyncio.get_running_loop().create_future()
        )
        self._pending.append(_Pending(writes, future))
        self._wakeup.set()
        return future

    async def _writer_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._writer_idle = True
            await self._wakeup.wait()
            self._writer_idle = False
            if self.commit_delay_s and self._last_batch_writes > 1:
                # Only when the last batch had company: a lone writer is never delayed.
                await asyncio.sleep(self.commit_delay_s)
            self._wakeup.clear()
            batch, self._pending = self._pending, []
            if not batch:
                if self._closing or self._failed is not None:
                    return
                continue
            writes = sum(len(p.writes) for p in batch)
            lone = writes == 1 and self._last_batch_writes <= 1
            self._last_batch_writes = writes
            try:
                async with self._conn_lock:
                    if self._commits_on_loop:
                        # SQLite does not sync inside this commit (see _sync): the
                        # loop is held for page-cache writes only.
                        self._apply_batch(batch)
                    else:
                        await loop.run_in_executor(self._executor, self._apply_batch, batch)
            except Exception as exc:  # the whole batch failed to commit: nobody is acknowledged
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(exc)
                continue
            self._counted(writes)
            if self._wal_fd is not None:
                try:
                    await self._sync(inline=lone)
                except OSError as exc:  # nobody in the batch is acknowledged (see _fail)
                    for pending in batch:
                        if not pending.future.done():
                            pending.future.set_exception(exc)
                    self._fail(exc)
                    return
            self.batches_committed += 1
            # Answer the writers first, then wake the watchers: with many
            # watchers open, fan-out must not delay the acknowledgements.
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_result(pending.outcomes)
            self._publish(batch)
            if self._commits_on_loop and self._frames_since_checkpoint >= CHECKPOINT_FRAMES:
                await self._checkpoint()
            if self._closing and not self._pending:
                return

    def _counted(self, writes: int) -> None:
        """A batch of this many writes was committed (not yet synced)."""
        self._committed += 1
        self._frames_since_checkpoint = self._frames.appended(self._frames_since_checkpoint, writes)

    def _publish(self, batch: list[_Pending]) -> None:
        self.hub.publish_many(
            [
                outcome.commit
                for pending in batch
                for outcome in pending.outcomes
                if isinstance(outcome, WriteOutcome) and outcome.commit is not None
            ]
        )

    def _sync_here(self) -> None:
        """fdatasync the WAL on this thread: every commit so far is durable after it."""
        assert self._wal_fd is not None
        target = self._committed
        os.fdatasync(self._wal_fd)
        self._synced = target

    def _fail(self, exc: OSError) -> None:
        """After a failed WAL sync: what the WAL holds may be lost, and retrying could
        report a write durable that is not (PostgreSQL stops for the same reason).
        Nobody queued is acknowledged, and the store takes no more writes."""
        log.critical("the WAL sync failed (%s): the store takes no more writes", exc)
        self._failed = exc
        for pending in self._pending:
            if not pending.future.done():
                pending.future.set_exception(exc)
        self._pending = []
        self._wakeup.set()  # the writer task ends

    async def _sync(self, *, inline: bool) -> None:
        """Make every commit so far durable: fdatasync the WAL.

        With synchronous=FULL SQLite would sync inside COMMIT; the store runs
        SQLite at NORMAL and syncs the WAL here instead, which is the same
        guarantee (the WAL holds every commit since the last checkpoint, and a
        checkpoint syncs it first). A burst's sync runs in the sync thread, so the
        loop keeps serving while the disk works and the writes that arrive
        meanwhile form the next batch; a batch of one write after another such
        batch (light load that did not qualify for _write_now, e.g. a worker
        session's write_many) syncs right here, where the thread hop would only
        add latency. A
        commit is acknowledged, published to watchers and shown to reads
        (_durable) only after its sync.
        """
        if inline:
            self._sync_here()
            return
        assert self._wal_fd is not None
        assert self._sync_executor is not None
        target = self._committed
        loop = asyncio.get_running_loop()
        self._syncing = done = loop.create_future()
        try:
            await loop.run_in_executor(self._sync_executor, os.fdatasync, self._wal_fd)
        except BaseException as exc:
            done.set_exception(
                exc if isinstance(exc, Exception) else RuntimeError("the WAL sync was cancelled")
            )
            done.exception()  # marked retrieved: a reader waiting on it gets it raised
            raise
        finally:
            self._syncing = None
        self._synced = target
        done.set_result(None)

    async def _durable(self) -> None:
        """Return once everything a read may have seen is durable.

        A read sees what SQLite has committed, and a commit precedes its WAL sync
        (_sync): a read that ran between the two waits for that sync, so nobody
        is shown a change that a power loss could still take back.
        """
        if self._synced < self._committed and self._syncing is not None:
            await asyncio.shield(self._syncing)

    async def _checkpoint(self) -> None:
        """Copy the WAL back into the database file, in the writer thread.

        SQLite's own automatic checkpoint would run inside a COMMIT, on the
        loop, with two fsyncs and megabytes of copying; here the loop keeps
        serving and writes queue up meanwhile. PASSIVE: readers are never
        blocked. Once the WAL is fully copied, the next commit rewrites it from
        the start, so the file stops growing and its blocks are reused.
        """
        self._frames_since_checkpoint = 0
        self.checkpoints += 1
        self._frames.checkpointed()
        conn = self._wconn
        assert conn is not None
        loop = asyncio.get_running_loop()

        def checkpoint() -> None:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()  # fetched: the statement ends

        async with self._conn_lock:
            await loop.run_in_executor(self._executor, checkpoint)

    def _apply_batch(self, batch: list[_Pending]) -> None:
        conn = self._wconn
        assert conn is not None
        start_txid = self._next_txid
        txid = start_txid
        now = now_ms()
        staged = _Staged()
        conn.execute("BEGIN IMMEDIATE")
        try:
            for pending in batch:
                pending.outcomes = []
                for write in pending.writes:
                    try:
                        outcome = self._apply_one(conn, write, WriteContext(txid, now), staged)
                    except _Refused as refused:
                        # refused before anything was staged: nothing of it is written
                        pending.outcomes.append(refused.error)
                        continue
                    if outcome.commit is not None:
                        txid += 1
                    pending.outcomes.append(outcome)
            # One statement per table for the whole batch; a failure here fails
            # (and rolls back) the batch, so no half-written transaction survives.
            if staged.events:
                conn.executemany(INSERT_EVENT, staged.events)
            if staged.entities:
                self._write_entities(conn, staged.entities)
            if staged.idempotency_rows:
                conn.executemany(INSERT_IDEMPOTENCY, staged.idempotency_rows)
            if txid != start_txid:
                conn.execute(SET_NEXT_TXID, (txid,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self._next_txid = txid
        for ref, record in staged.entities.items():
            self._cache[ref] = record
            self._cache.move_to_end(ref)
        while len(self._cache) > ENTITY_CACHE_SIZE:
            self._cache.popitem(last=False)

    def _write_entities(self, conn: sqlite3.Connection, entities: dict[Ref, EntityRecord]) -> None:
        """Write the batch's entity rows, setting only the columns that changed.

        The cache holds each entity as the file has it (it is updated only after
        a commit), so the changed columns are known without reading. Leaving the
        rest out spares SQLite the index entries of unchanged columns: a signal
        that changes no state rewrites one page of the entities table instead of
        also deleting and re-inserting its entry in the state index, which is
        fewer pages to write to the WAL and to sync.
        """
        fresh: list[tuple[object, ...]] = []
        updates: dict[tuple[int, ...], list[tuple[object, ...]]] = {}
        for ref, after in entities.items():
            row = entity_row(after)
            before = self._cache.get(ref)
            if before is None:  # new, or not read by this batch (a spawn): the whole row
                fresh.append(row)
                continue
            old = entity_row(before)
            changed = tuple([i for i in ENTITY_VALUE_INDEXES if row[i] != old[i]])
            if changed:
                updates.setdefault(changed, []).append(tuple([row[i] for i in changed]) + ref)
        if fresh:
            conn.executemany(UPSERT_ENTITY, fresh)
        for changed, rows in updates.items():
            conn.executemany(update_entity_sql(changed), rows)

    def _current(self, conn: sqlite3.Connection, ref: Ref, staged: _Staged) -> EntityRecord | None:
        """The entity as this batch sees it: staged, cached, or from the file."""
        record = staged.entities.get(ref) or self._cache.get(ref)
        if record is None:
            row = conn.execute(SELECT_ENTITY, ref).fetchone()
            if row is not None:
                record = self._cache[ref] = entity_from_row(row)
        return record

    def _remembered(
        self, conn: sqlite3.Connection, ref: Ref, key: str, staged: _Staged
    ) -> tuple[bytes, bytes] | None:
        found = staged.idempotency.get((ref[0], ref[1], key))
        if found is None:
            row = conn.execute(SELECT_IDEMPOTENCY, (ref[0], ref[1], key)).fetchone()
            found = (bytes(row[0]), bytes(row[1])) if row else None
        return found

    def _apply_one(
        self, conn: sqlite3.Connection, write: Write, ctx: WriteContext, staged: _Staged
    ) -> WriteOutcome:
        ref, idem = write.ref, write.idempotency
        # Decide first, stage after: a refusal (raised as _Refused) leaves nothing behind.
        try:
            if idem is not None:
                remembered = self._remembered(conn, ref, idem.key, staged)
                if remembered is not None:
                    if remembered[0] != idem.request_hash:
                        raise IdempotencyKeyReused(idem.key)
                    return WriteOutcome(None, remembered[1], True)
            before = staged.entities.get(ref) or self._cache.get(ref) or self._current(conn, ref, staged)
            mutation: Mutation = write.decide(before, ctx)
            if mutation.events and before is not None and before.closed:
                raise RuntimeError(f"append to the closed stream {ref[0]}/{ref[1]}")
        except Exception as exc:
            raise _Refused(exc) from exc
        if not mutation.events and mutation.entity is None:
            commit = None
            response = None
            if write.encode is not None:
                response = write.encode(Commit(ref, 0, ctx.now_ms, (), before, before, mutation.result))
        else:
            head = before.head_offset if before else 0
            if len(mutation.events) == 1:  # the common case, without the comprehensions
                ev = mutation.events[0]
                stored: tuple[StoredEvent, ...] = (
                    StoredEvent(head, ev.kind, ev.key, ev.operation, ctx.now_ms, ctx.txid, ev.body),
                )
                # A StoredEvent's fields are the events table's columns after (type, id), in order.
                staged.events.append(ref + stored[0])
            else:
                stored = tuple(
                    [
                        StoredEvent(offset, ev.kind, ev.key, ev.operation, ctx.now_ms, ctx.txid, ev.body)
                        for offset, ev in enumerate(mutation.events, start=head)
                    ]
                )
                staged.events.extend([ref + e for e in stored])
            base = mutation.entity or before
            assert base is not None, "a mutation that creates an entity must return its record"
            after = advanced(base, head + len(stored), ctx)
            staged.entities[ref] = after
            commit = Commit(ref, ctx.txid, ctx.now_ms, stored, before, after, mutation.result)
            response = write.encode(commit) if write.encode is not None else None
        if idem is not None and response is not None:
            staged.idempotency[(ref[0], ref[1], idem.key)] = (idem.request_hash, response)
            staged.idempotency_rows.append(
                (ref[0], ref[1], idem.key, idem.request_hash, response, ctx.now_ms)
            )
        return WriteOutcome(commit, response, False)

    # -- reads -----------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        if self._rconn is None:
            raise RuntimeError("store is closed")
        return self._rconn

    async def get_entity(self, ref: Ref) -> EntityRecord | None:
        row = self._reader().execute(SELECT_ENTITY, ref).fetchone()
        await self._durable()
        return entity_from_row(row) if row else None

    async def list_entities(
        self, type: str | None, states: Sequence[State], after: Ref | None, limit: int
    ) -> list[EntityRecord]:
        where, args = [], []
        if type:
            where.append("type = ?")
            args.append(type)
        if states:
            where.append(f"state IN ({', '.join('?' * len(states))})")
            args.extend(s.value for s in states)
        if after is not None:
            where.append("(type, id) > (?, ?)")
            args.extend(after)
        sql = SELECT_ENTITIES
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY type, id LIMIT ?"
        args.append(str(limit))
        rows = self._reader().execute(sql, args).fetchall()
        await self._durable()
        return [entity_from_row(r) for r in rows]

    async def read_events(self, ref: Ref, from_offset: int, limit: int) -> list[StoredEvent]:
        rows = self._reader().execute(SELECT_EVENTS, (ref[0], ref[1], from_offset, limit)).fetchall()
        await self._durable()
        return [event_from_row(r) for r in rows]

    async def idempotent_response(self, ref: Ref, key: str) -> tuple[bytes, bytes] | None:
        row = self._reader().execute(SELECT_IDEMPOTENCY, (ref[0], ref[1], key)).fetchone()
        await self._durable()
        return (bytes(row[0]), bytes(row[1])) if row else None

    async def stopping_deadlines(self) -> list[tuple[Ref, int]]:
        rows = self._reader().execute(SELECT_STOPPING_DEADLINES).fetchall()
        await self._durable()
        return [((str(t), str(i)), int(d)) for t, i, d in rows]

    async def head_txid(self) -> int:
        row = self._reader().execute(SELECT_NEXT_TXID).fetchone()
        await self._durable()
        return (int(row[0]) if row else 1) - 1

    async def purge_idempotency(self, older_than_ms: int) -> int:
        def purge() -> int:
            assert self._wconn is not None
            return self._wconn.execute(PURGE_IDEMPOTENCY, (older_than_ms,)).rowcount

        loop = asyncio.get_running_loop()
        async with self._conn_lock:  # the writer connection is not shared mid-statement
            return await loop.run_in_executor(self._executor, purge)
