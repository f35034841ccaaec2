"""The SQLite store's writer: group commit, the lone-write path, and how a batch is applied.

Writes queue up while the previous batch commits; the next batch applies all
of them in one SQLite transaction and one WAL sync (group commit). Each write
is still its own logical transaction with its own txid: its decide function
raises before anything is written, so a refused write leaves no trace, and the
batch commits or fails as a whole — no caller is told "done" before its data
is durable. At light load a write alone commits right in its caller
(``_alone``, ``_write_now``).

No error ends the writer task: a batch that fails fails its writes, with what
``_fault`` makes of the error (store/sqlite_faults.py: a full disk pauses
writes, a failed disk stops them, anything else is logged with its
traceback), and the writer goes on; were the loop itself to fail, every
queued and later write would be refused, never left waiting.

Txids are handed out below the reservation in the state file
(store/state_file.py): a batch that needs a txid beyond it reserves the next
block before it commits, once per ``TXID_BLOCK`` txids.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Sequence, Sized
from dataclasses import dataclass, field

from ...clock import Clock
from ...internals.ready_queue import BUSY
from ..base import (
    EntityRecord,
    Hub,
    Ref,
    StorageFailed,
    Write,
    WriteContext,
    WriteOutcome,
)
from ..outcome import Refused, apply_write, now_ms, replay
from ..rows import ENTITY_VALUE_INDEXES, entity_from_row, entity_row
from ..sessions import MemorySessions
from .faults import roll_back
from .schema import (
    INSERT_EVENT,
    INSERT_IDEMPOTENCY,
    SELECT_ENTITY,
    SELECT_IDEMPOTENCY,
    SET_NEXT_TXID,
    UPSERT_ENTITY,
    update_entity_sql,
)
from .state_file import TXID_BLOCK, StateFile, StoreState
from .wal import CHECKPOINT_FRAMES, SQLiteWal

__all__ = ["ENTITY_CACHE_SIZE", "SQLiteWriter", "now_ms"]

log = logging.getLogger(__name__)

ENTITY_CACHE_SIZE = 50_000


@dataclass(slots=True)
class _Staged:
    """What one batch writes, applied with one statement per table at its end."""

    entities: dict[Ref, EntityRecord] = field(default_factory=dict)
    events: list[tuple[object, ...]] = field(default_factory=list)
    idempotency: dict[tuple[str, str, str], tuple[bytes, bytes]] = field(default_factory=dict)
    idempotency_rows: list[tuple[object, ...]] = field(default_factory=list)


def _refuse(batch: list[_Pending], error: BaseException) -> None:
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(error)


class _Pending:
    __slots__ = ("future", "outcomes", "writes")

    def __init__(self, writes: Sequence[Write], future: asyncio.Future[list[WriteOutcome | BaseException]]):
        self.writes = writes
        self.future = future
        self.outcomes: list[WriteOutcome | BaseException] = []  # filled in when the batch applies


class SQLiteWriter(SQLiteWal):
    """The writing half of ``SQLiteStore``: the only writer of its file."""

    hub: Hub
    clock: Clock
    _sessions: MemorySessions  # the live sessions a write judges lease holders by

    def __init__(self, commit_delay_s: float) -> None:
        super().__init__()
        # Under concurrent load, how long a batch waits for more writes before it commits
        # (PostgreSQL's commit_delay): fewer, larger commits, for a little latency. 0: never.
        self.commit_delay_s = commit_delay_s
        self._pending: list[_Pending] = []
        self._wakeup = asyncio.Event()
        self._closing = False
        self._writer_task: asyncio.Task[None] | None = None
        self._writer_idle = False  # waiting for writes: nothing being applied or synced
        # The loop's callbacks ready to run, from the ready_queue seam once the store is open (see _alone).
        self._loop_ready: Sized = BUSY
        self._next_txid = 1
        # Every txid handed out is below this; the state file records it (see _reserve).
        self._reserved_below = 1
        self._state_file: StateFile | None = None
        # The writer is the only writer, so it may remember entity records
        # (bounded, least recently used first out) instead of reading them back.
        self._cache: OrderedDict[Ref, EntityRecord] = OrderedDict()
        self._last_batch_writes = 0
        # Batches committed: exposed for tests and benchmarks.
        self.batches_committed = 0

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
            and self._refusal is None
            and not self._closing
            and not self._conn_lock.locked()
            and not self._loop_ready
        )

    def _write_now(self, write: Write) -> WriteOutcome | BaseException:
        """Commit and sync one write right here (see _alone): no hand-over to the
        writer task and back, which costs two turns of the loop."""
        started = time.perf_counter()
        pending = _Pending((write,), asyncio.get_running_loop().create_future())
        try:
            self._apply_batch([pending])
        except Exception as exc:  # the commit failed: nobody is acknowledged
            return self._fault(exc, "a commit")
        self._counted(1)
        try:
            self._sync_here()
        except Exception as exc:
            return self._fail(exc, "a WAL sync")
        self.batches_committed += 1
        self._publish([pending], 1, started)
        (outcome,) = pending.outcomes
        return outcome

    async def write_many(self, writes: Sequence[Write]) -> list[WriteOutcome | BaseException]:
        return await self._submit(writes)

    def _submit(self, writes: Sequence[Write]) -> asyncio.Future[list[WriteOutcome | BaseException]]:
        """Queue writes for the writer (in call order: the order they are applied in)."""
        if self._refusal is not None:  # a full or failed disk: refused at once, costing nothing
            raise self._refusal.again()
        if self._closing or self._writer_task is None:
            raise RuntimeError("store is closed")
        future: asyncio.Future[list[WriteOutcome | BaseException]] = (
            asyncio.get_running_loop().create_future()
        )
        self._pending.append(_Pending(writes, future))
        self._wakeup.set()
        return future

    async def _writer_loop(self) -> None:
        try:
            await self._write_batches()
        except (
            BaseException
        ) as exc:  # the loop itself failed (a bug): refuse writes, never leave them waiting
            if not self._closing or not isinstance(exc, asyncio.CancelledError):
                stopped = StorageFailed(f"the store's writer stopped on {type(exc).__name__}: {exc}")
                self._fail(stopped, "the writer's loop", exc_info=exc)
            self._refuse_queued(RuntimeError("store is closed"))
            if not isinstance(exc, Exception):
                raise

    async def _write_batches(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._writer_idle = True
            await self._wait_for_room(self._wakeup)  # returns at once unless the disk is full
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
            await self._commit(batch, loop)
            if self._frames_since_checkpoint >= CHECKPOINT_FRAMES and self._refusal is None:
                try:
                    await self._checkpoint()
                except Exception as exc:  # nothing is lost: the WAL still holds every commit
                    self._fault(exc, "a checkpoint")
            if (self._closing and not self._pending) or self._failed is not None:
                return

    async def _commit(self, batch: list[_Pending], loop: asyncio.AbstractEventLoop) -> None:
        """Apply, sync and acknowledge one batch; a failure fails the batch's writes only."""
        started = time.perf_counter()
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
            _refuse(batch, self._fault(exc, "a commit"))
            return
        self._counted(writes)
        if self._wal_fd is not None:
            try:
                await self._sync(inline=lone)
            except Exception as exc:  # nobody in the batch is acknowledged; never retried (see _fail)
                _refuse(batch, self._fail(exc, "a WAL sync"))
                return
        self.batches_committed += 1
        # Answer the writers first, then wake the watchers: with many
        # watchers open, fan-out must not delay the acknowledgements.
        for pending in batch:
            if not pending.future.done():
                pending.future.set_result(pending.outcomes)
        self._publish(batch, writes, started)

    def _publish(self, batch: list[_Pending], writes: int, started: float) -> None:
        self.hub.committed(
            [
                outcome.commit
                for pending in batch
                for outcome in pending.outcomes
                if isinstance(outcome, WriteOutcome) and outcome.commit is not None
            ],
            writes,
            started,
        )

    def _refuse_queued(self, error: BaseException) -> None:
        _refuse(self._pending, error)
        self._pending = []
        self._wakeup.set()  # a writer waiting for work or for room sees why

    def _apply_batch(self, batch: list[_Pending]) -> None:
        conn = self._wconn
        assert conn is not None
        start_txid = self._next_txid
        txid = start_txid
        now = self.clock.now_ms()
        staged = _Staged()
        conn.execute("BEGIN IMMEDIATE")
        try:
            for pending in batch:
                pending.outcomes = []
                for write in pending.writes:
                    try:
                        outcome = self._apply_one(
                            conn, write, WriteContext(txid, now, self._sessions), staged
                        )
                    except Refused as refused:
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
                if txid > self._reserved_below:  # once per TXID_BLOCK txids
                    self._reserve(txid)
                conn.execute(SET_NEXT_TXID, (txid,))
            conn.execute("COMMIT")
        except BaseException:
            roll_back(conn)
            raise
        self._next_txid = txid
        for ref, record in staged.entities.items():
            self._cache[ref] = record
            self._cache.move_to_end(ref)
        while len(self._cache) > ENTITY_CACHE_SIZE:
            self._cache.popitem(last=False)

    def _reserve(self, next_txid: int) -> None:
        """Record in the state file, durably, that txids below ``next_txid`` + a block may
        be handed out, before any of them commits (raises OSError, failing the batch)."""
        assert self._state_file is not None
        reserved = next_txid + TXID_BLOCK
        self._state_file.write(StoreState(clean=False, reserved_below=reserved))
        self._reserved_below = reserved

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
        # Decide first, stage after: a refusal (raised as Refused) leaves nothing behind.
        try:
            remembered = self._remembered(conn, ref, idem.key, staged) if idem is not None else None
            if remembered is None:
                before = staged.entities.get(ref) or self._cache.get(ref) or self._current(conn, ref, staged)
        except Exception as exc:
            raise Refused(exc) from exc
        if remembered is not None:
            assert idem is not None
            return replay(idem, remembered)
        applied = apply_write(write, before, ctx)
        if applied.after is not None:
            staged.entities[ref] = applied.after
        if applied.event_rows:
            staged.events.extend(applied.event_rows)
        row = applied.idempotency_row
        if row is not None:
            staged.idempotency[(row[0], row[1], row[2])] = (row[3], row[4])
            staged.idempotency_rows.append(row)
        return applied.outcome
