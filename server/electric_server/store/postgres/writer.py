"""The PostgreSQL store's writes: a batch of writes in one transaction, each decided on its locked row.

A batch (``write_many``; ``write`` is a batch of one) runs in one
transaction on one pooled connection:

1. its entities' rows are locked ``FOR UPDATE`` in (type, id) order, so two
   batches never wait for each other in a circle (were they to, PostgreSQL's
   deadlock error, or a serialization failure, re-runs the whole batch: its
   decide functions run again on what is current then);
2. txids are drawn from the ``electric_txid`` sequence after the locks (in
   the locking statement, once every row is locked), so each entity's txids
   increase in commit order (a write that commits takes the next one drawn;
   a refused one takes none, but numbers may be skipped);
3. each write, in call order: its idempotency key is looked up (the batch's
   keys are read at once, by the locking statement; and again, by a statement
   of their own after the locks, unless that one says its snapshot, taken
   before any wait for a lock, cannot have missed a racing retry's key: one
   row locked, nothing committed or begun meanwhile), then ``decide``
   runs on the locked row (``outcome.apply_write``) and its rows are staged,
   to be written at the end, every table's in one statement (``FLUSH_ROWS``).
   A write whose decide refuses writes nothing and spares the others;
4. a row that did not exist when the batch locked (``FOR UPDATE`` locks no
   missing row) is inserted inside a savepoint: a racing insert of the same
   entity (or idempotency key) ends in unique_violation, the savepoint is
   rolled back, the row the other transaction committed is locked, and the
   write is decided again on it (a spawn then ends as ENTITY_EXISTS, or as
   the idempotent replay), never as an internal error;
5. COMMIT. A connection lost before it fails the batch with
   ``DatabaseUnavailable``: nothing was committed. One lost during COMMIT
   leaves the outcome unknown: also ``DatabaseUnavailable``, and the
   client's retry with the same idempotency key finds out.

Lone writes (``write``) that arrive while every connection runs a batch
wait to share the next one (group commit, at most ``MAX_BATCH``). A batch of
one, with the commit feed on, is first tried in two round trips and no
transaction block (``postgres_one_write``); it comes here when it raced.

Then the batch's commits are published to the ``Hub``. Within this process,
writes to one entity queue for it (``_RefLocks``) from before the row lock to
after publishing, so the hub sees each entity's commits in commit order.

With the commit feed on (several replicas; ``postgres_feed``), a batch also
writes a feed row per commit with its other rows, and each entity row keeps
the transaction that wrote it last; just before COMMIT the batch's txids are
told to the ``FeedOrder``, which publishes the commits after it (holding one
whose entity another replica wrote last until the reader brings that
commit), and the doorbell rings after it, off the commit's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import asyncpg

from ..base import (
    Commit,
    DatabaseUnavailable,
    EntityRecord,
    Hub,
    Idempotency,
    Ref,
    StorageFault,
    Store,
    Write,
    WriteContext,
    WriteOutcome,
    WritesRefused,
)
from ..feed_order import FeedOrder
from ..outcome import Applied, Refused, apply_write, now_ms, replay
from ..rows import ENTITY_COLUMNS, entity_from_row, entity_row
from . import one_trip
from .faults import LOST, REFUSED, RefusedLog, lost_reason, unreachable_reason
from .known import Known
from .one_trip import RACED, Decided, UnknownOutcome
from .schema import (
    FLUSH_ROWS,
    FLUSH_WIDTHS,
    INSERT_ROWS,
    INSERT_WIDTHS,
    LOCK_AND_DRAW,
    LOCK_ENTITY,
    LOCKED_AT,
    NEXT_TXIDS,
    ROLLBACK_TO_SAVEPOINT,
    SAVEPOINT,
    SELECT_IDEMPOTENCY,
    SELECT_IDEMPOTENCY_MANY,
)

__all__ = ["MAX_ATTEMPTS", "MAX_BATCH", "PostgresWriter"]

log = logging.getLogger(__name__)

# The most lone writes one batch gathers.
MAX_BATCH = 256
# How often a batch runs again after a deadlock or a serialization failure before it fails.
MAX_ATTEMPTS = 5
# How often one write is decided again after a racing insert of its row (the second attempt
# finds the row, locked; a third is for an idempotency row raced without an entity).
_DECIDE_ATTEMPTS = 3
# A locked row's columns: the record's, then the transaction that last wrote it.
_RECORD = len(ENTITY_COLUMNS)
_NO_BEFORE = (None,) * (_RECORD - 2)


class _RefLocks:
    """Each entity's turn in this process (see the module docstring), taken in (type, id) order."""

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[Ref, asyncio.Lock] = weakref.WeakValueDictionary()

    @contextlib.asynccontextmanager
    async def hold(self, refs: Sequence[Ref]) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for ref in refs:
                lock = self._locks.get(ref)
                if lock is None:
                    lock = self._locks[ref] = asyncio.Lock()
                await stack.enter_async_context(lock)
            yield


class _Txids:
    """The txids a batch drew after its locks; a write that commits takes the next."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._drawn: list[int] = []
        self._next = 0
        self.xact = 0  # the transaction's id

    def drawn(self, txids: Sequence[int], xact: int) -> None:
        """The txids drawn with the locks (LOCK_AND_DRAW)."""
        self._drawn = list(txids)
        self.xact = xact
        self._next = 0

    async def draw(self, n: int) -> int:
        """Draw ``n`` txids; returns the database's clock (ms) as they were drawn."""
        rows = await self._conn.fetch(NEXT_TXIDS, max(n, 1))
        self.drawn([int(row[0]) for row in rows], int(rows[0][1]))
        return int(rows[0][2])

    async def redraw(self) -> None:
        """After a row was locked late: fresh txids, above any that row's committed writes hold."""
        await self.draw(len(self._drawn) - self._next)

    def peek(self) -> int:
        return self._drawn[self._next]

    def take(self) -> None:
        self._next += 1


class Doorbell(Protocol):
    def ring(self, xact: int) -> None: ...


class PostgresWriter(Store):
    """The writing half of ``PostgresStore``."""

    hub: Hub
    # With the commit feed on (PostgresStore sets them): how commits are published, this
    # replica's origin in the feed's rows, and what tells the other replicas.
    feed_order: FeedOrder | None = None
    origin = 0
    doorbell: Doorbell | None = None

    def __init__(self, concurrent_batches: int, timeout_s: float, where: str) -> None:
        self._pool: Any = None
        self.where = where  # the database's URL, redacted: for what a refused connection says
        self._refused = RefusedLog(where)
        # The longest a call waits for a pooled connection (its statements have the same bound).
        self.timeout_s = timeout_s
        self._ref_locks = _RefLocks()
        # Lone writes (``write``) queue here while every connection runs a batch (see _gather).
        self._concurrent_batches = concurrent_batches
        self._queued: list[tuple[Write, asyncio.Future[WriteOutcome | BaseException]]] = []
        self._batches_running = 0
        self._batch_tasks: set[asyncio.Task[None]] = set()  # referenced while they run
        # Batches committed and batches run again after a deadlock: exposed for tests and benchmarks.
        self.batches_committed = 0
        self.batches_retried = 0
        # Each pooled connection's backend's start, by its pid (set as it connects): with the pid,
        # it names the backend of a lone write whose connection was lost (postgres_one_write).
        self.backend_starts: dict[int, Any] = {}
        # Lone writes with their outcome unknown, being found out (_find_out).
        self.finding_out: set[asyncio.Task[None]] = set()
        self.lone_writes = 0  # committed alone, in one or two round trips (tests and benchmarks)
        # What this replica knew of the entities last, which may spare a lone write its read.
        self.known = Known()
        # Connections being handed back to the pool (``_connection``), referenced while they are.
        self._releasing: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def _connection(self, what: str) -> AsyncIterator[Any]:
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
            self._lost()
            raise DatabaseUnavailable(f"{what} failed: {lost_reason(exc, self.timeout_s)}") from exc
        except REFUSED as exc:  # there, but it will not do the work (e.g. read-only, a full disk)
            why = self._refused.note(what, exc)
            if isinstance(exc, asyncpg.exceptions.ReadOnlySQLTransactionError):
                self._writes_refused(why)
                raise WritesRefused(f"{what} failed: {why}") from exc
            raise DatabaseUnavailable(f"{what} failed: {why}") from exc
        except DatabaseUnavailable:  # e.g. lost during COMMIT
            self._lost()
            raise

    def _lost(self) -> None:
        # Nothing known from before is guessed on: the database may be another now (a failover
        # to a standby behind the old primary, whose sequence could draw the spare txid again).
        self.known.reset()
        self._connection_lost()

    def _release_later(self, pool: Any, conn: Any) -> None:
        """``conn`` back to ``pool``, in a task of its own (see ``_connection``), started a turn
        later: what the caller wakes next (a lone write's watchers, published right after this)
        runs first. The pool's close waits for it like for any connection in use."""
        asyncio.get_running_loop().call_soon(self._start_release, pool, conn)

    def _start_release(self, pool: Any, conn: Any) -> None:
        task = asyncio.get_running_loop().create_task(pool.release(conn), name="electric-pool-release")
        self._releasing.add(task)
        task.add_done_callback(self._released)

    def _released(self, task: asyncio.Task[None]) -> None:
        self._releasing.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # asyncpg has terminated the connection and put its holder back: the pool opens a
            # new one when it is next needed. Nothing was lost but that connection.
            log.warning(
                "handing a database connection back to the pool failed (%s: %s)", type(exc).__name__, exc
            )

    def _connection_lost(self) -> None:
        """A call lost its connection (the store finds out whether the database is gone)."""

    def _writes_refused(self, why: str) -> None:
        """A write was refused: the database takes none (the store's writes are not ready)."""

    def _took_writes(self) -> None:
        """A write committed (the store's writes are ready again if they were not)."""

    async def write(self, write: Write) -> WriteOutcome:
        """One write; while every connection runs a batch, it waits to share the next
        (group commit: one transaction, one round of statements' waits, for many writes).
        Alone (nothing running or queued), it is tried at once in the caller's task, sparing the
        two turns of the loop a batch's task costs (its start, then the caller's wake-up)."""
        if self.feed_order is not None and not self._batches_running and not self._queued:
            decided = await self._alone_in_caller(write, self.feed_order)
            if decided is not RACED:
                outcome = decided.outcome
                if isinstance(outcome, BaseException):
                    raise outcome
                return outcome
        future: asyncio.Future[WriteOutcome | BaseException] = asyncio.get_running_loop().create_future()
        self._queued.append((write, future))
        if self._batches_running < self._concurrent_batches:
            self._gather()
        outcome = await future
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def _alone_in_caller(self, write: Write, order: FeedOrder) -> Decided:
        """A lone write in the caller's task; RACED: it goes to a batch (of one). It counts as a
        running batch meanwhile, so writes that arrive share the next one."""
        started = time.perf_counter()
        self._batches_running += 1
        try:
            async with self._ref_locks.hold((write.ref,)):
                decided = await self._write_alone(write, order)
                if decided is not RACED:
                    self._published_alone(decided, started)
                return decided
        finally:
            self._batches_running -= 1
            if self._queued and self._batches_running < self._concurrent_batches:
                self._gather()

    def _gather(self) -> None:
        """Run the queued writes as one batch, in a task of its own."""
        taken, self._queued = self._queued[:MAX_BATCH], self._queued[MAX_BATCH:]
        self._batches_running += 1
        task = asyncio.get_running_loop().create_task(self._run(taken), name="electric-postgres-batch")
        self._batch_tasks.add(task)
        task.add_done_callback(self._batch_tasks.discard)

    async def _run(self, taken: list[tuple[Write, asyncio.Future[WriteOutcome | BaseException]]]) -> None:
        try:
            outcomes = await self.write_many([write for write, _ in taken])
        except BaseException as exc:  # the batch failed as a whole: each of its writes did
            for _, future in taken:
                if not future.done():
                    future.set_exception(exc.again() if isinstance(exc, StorageFault) else exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for (_, future), outcome in zip(taken, outcomes, strict=True):
                if not future.done():  # (a caller cancelled its wait: the write is applied all the same)
                    future.set_result(outcome)
        finally:
            self._batches_running -= 1
            if self._queued and self._batches_running < self._concurrent_batches:
                self._gather()

    async def write_many(self, writes: Sequence[Write]) -> list[WriteOutcome | BaseException]:
        started = time.perf_counter()
        refs = sorted({write.ref for write in writes})
        async with self._ref_locks.hold(refs):
            if len(writes) == 1 and self.feed_order is not None:
                decided = await self._write_alone(writes[0], self.feed_order)
                if decided is not RACED:
                    self._published_alone(decided, started)
                    return [decided.outcome]
            async with self._connection("a write") as conn:
                for attempt in range(1, MAX_ATTEMPTS + 1):
                    try:
                        outcomes, batch = await self._apply_batch(conn, writes, refs)
                        break
                    except (
                        asyncpg.exceptions.DeadlockDetectedError,
                        asyncpg.exceptions.SerializationError,
                    ) as exc:
                        if attempt == MAX_ATTEMPTS:
                            raise DatabaseUnavailable(
                                f"a write kept failing on PostgreSQL's {type(exc).__name__} "
                                f"({MAX_ATTEMPTS} attempts): retry"
                            ) from exc
                        self.batches_retried += 1
            self.batches_committed += 1
            self._took_writes()
            commits = _commits(outcomes)
            for commit in commits:
                assert commit.after is not None
                self.known.learn(commit.after, batch.txids.xact)
            order = self.feed_order
            if order is None:
                self.hub.committed(commits, len(writes), started)
            else:
                self.hub.acknowledged(commits, len(writes), started)
                order.committed(commits, [batch.before_xacts[c.txid] for c in commits])
                if commits and self.doorbell is not None:
                    self.doorbell.ring(batch.txids.xact)
        return outcomes

    async def _write_alone(self, write: Write, order: FeedOrder) -> Decided:
        """A batch of one in one or two round trips (postgres_one_write); RACED: take the batch
        path."""
        sent = _Sent(order)

        unknown: list[UnknownOutcome] = []
        floor = order.snapshot.xmax  # the reader's last snapshot: taken before the statement goes

        def find_out_later(lost: UnknownOutcome) -> None:
            unknown.append(lost)
            finding = self._find_out(lost, floor)
            task = asyncio.get_running_loop().create_task(finding, name="electric-find-out")
            self.finding_out.add(task)
            task.add_done_callback(self.finding_out.discard)

        try:
            async with self._connection("a write") as conn:
                pid = conn.get_server_pid()
                started = self.backend_starts.get(pid)
                if started is None:  # a connection not made by this store's pool
                    return RACED
                decided = await one_trip.write_alone(
                    conn, write, self.origin, (pid, started), sent, find_out_later, self.timeout_s, self.known
                )
        except UnknownOutcome as lost:
            raise DatabaseUnavailable(str(lost)) from lost  # the caller's: no commit to carry
        except BaseException:
            if not unknown:  # else it stays held until found out
                order.forgotten(sent.txids)
            raise
        if decided.xact is None:
            order.forgotten(sent.txids)
        return decided

    def _published_alone(self, decided: Decided, started: float) -> None:
        self.batches_committed += 1
        if decided.xact is not None:
            self._took_writes()
        outcome = decided.outcome
        commit = outcome.commit if isinstance(outcome, WriteOutcome) else None
        commits = [commit] if commit is not None else []
        self.hub.acknowledged(commits, 1, started)
        if commit is None or decided.xact is None:
            return
        self.lone_writes += 1
        self._published_late(commit, decided.xact, decided.before_xact)

    def _published_late(self, commit: Commit, xact: int, before_xact: int | None) -> None:
        order = self.feed_order
        assert order is not None
        order.committing(xact, ())
        order.committed([commit], [before_xact])
        if self.doorbell is not None:
            self.doorbell.ring(xact)

    async def _find_out(self, lost: UnknownOutcome, floor: int) -> None:
        """Whether a lone write whose connection was lost committed (postgres_one_write); published
        if it did. Tried until the database answers (the store is unavailable until then anyway)."""
        pause = 0.05
        while True:
            pool = self._pool
            if pool is None:
                return  # closed: this replica's Hub has no subscriber left to tell
            try:
                async with pool.acquire(timeout=self.timeout_s) as conn:
                    xact = await one_trip.find_out(conn, lost, self.origin, floor)
                break
            except (*LOST, asyncpg.PostgresError) as exc:
                log.debug("finding out a lost write's outcome failed (%s): trying again", exc)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
        commit = lost.commit
        ref = f"{commit.ref[0]}/{commit.ref[1]}"
        order = self.feed_order
        assert order is not None
        if xact is None:
            order.forgotten((commit.txid,))
            log.warning(
                "a write to %s whose connection was lost had not committed (txid %d)", ref, commit.txid
            )
        else:
            self._published_late(commit, xact, lost.before_xact)
            log.warning("a write to %s whose connection was lost had committed (txid %d)", ref, commit.txid)

    async def _apply_batch(
        self, conn: Any, writes: Sequence[Write], refs: Sequence[Ref]
    ) -> tuple[list[WriteOutcome | BaseException], _Batch]:
        transaction = conn.transaction()
        await transaction.start()
        order = self.feed_order
        try:
            batch = _Batch(conn, self.origin if order is not None else None)
            await batch.lock(refs, writes)
            outcomes = [await batch.apply(write) for write in writes]
            await batch.flush()
        except BaseException:
            with contextlib.suppress(*LOST):  # a lost connection has rolled back by itself
                await transaction.rollback()
            raise
        txids = [c.txid for c in _commits(outcomes)]
        if order is not None and txids:
            order.committing(batch.txids.xact, txids)
        try:
            await transaction.commit()
        except BaseException as exc:
            if order is not None and txids:  # committed or not: the feed reader finds out
                order.lost(batch.txids.xact, txids)
            if isinstance(exc, LOST):
                raise DatabaseUnavailable(
                    "the database connection was lost during COMMIT: the write may or may not have "
                    "committed (a retry with the same idempotency key finds out)"
                ) from exc
            raise
        return outcomes, batch


class _Sent:
    """The txids a lone write sent (postgres_one_write.Sending), held in the FeedOrder from then:
    the entity's later commits wait for them."""

    def __init__(self, order: FeedOrder) -> None:
        self._order = order
        self.txids: list[int] = []

    def sending(self, txid: int) -> None:
        self.txids.append(txid)
        self._order.sending((txid,))

    def unsent(self, txid: int) -> None:
        self.txids.remove(txid)
        self._order.forgotten((txid,))


def _commits(outcomes: Sequence[WriteOutcome | BaseException]) -> list[Commit]:
    return [o.commit for o in outcomes if isinstance(o, WriteOutcome) and o.commit is not None]


class _Batch:
    """One batch's transaction: its locked rows, txids, stored keys, and the rows it stages.

    Rows of entities locked at the start are staged and written at the end, in one
    statement (``flush``); a row missing at the start is written at
    once, in a savepoint (see the module docstring, 4).
    """

    def __init__(self, conn: Any, origin: int | None) -> None:
        self.conn = conn
        self.origin = origin  # None: no commit feed
        self.txids = _Txids(conn)
        self.now = now_ms()  # until the txids are drawn: then the database's clock
        self.current: dict[Ref, EntityRecord | None] = {}
        # The lease holders that are live, read with the rows' locks (store/sessions.py).
        self.live: set[str] = set()
        # Idempotency keys stored, read under the locks, plus those this batch stores.
        self.remembered: dict[tuple[str, str, str], tuple[bytes, bytes]] = {}
        self.entities: dict[Ref, EntityRecord] = {}  # staged: the rows' last records
        self.events: list[tuple[object, ...]] = []
        self.idempotency_rows: list[tuple[object, ...]] = []
        # The transaction that wrote each locked row last; each commit's of the one before it.
        self.xacts: dict[Ref, int | None] = {}
        # Each current record as a row (the feed row's "before"; made once, kept from the lock).
        self.rows: dict[Ref, tuple[object, ...]] = {}
        self.before_xacts: dict[int, int | None] = {}
        self.feed_rows: list[tuple[object, ...]] = []

    async def lock(self, refs: Sequence[Ref], writes: Sequence[Write]) -> None:
        """Lock the rows, draw the txids and read the keys (one statement); read the keys again
        when that statement's snapshot may have missed a retry committed while it waited."""
        conn = self.conn
        keys = {(w.ref[0], w.ref[1], w.idempotency.key) for w in writes if w.idempotency is not None}
        key_columns: list[list[str]] = [list(c) for c in zip(*keys, strict=True)] if keys else [[], [], []]
        rows = await conn.fetch(
            LOCK_AND_DRAW, [t for t, _ in refs], [i for _, i in refs], max(len(writes), 1), *key_columns
        )
        first = rows[0]
        self.txids.drawn(first[0], first[1])
        self.now = first[2]
        for row in rows:
            if row[LOCKED_AT] is not None:
                self._locked(row[LOCKED_AT:])
        if not keys:
            return
        stored: Any = zip(*first[4:LOCKED_AT], strict=True) if first[4] is not None else ()
        if not first[3]:  # not fresh (see LOCK_AND_DRAW)
            stored = await conn.fetch(SELECT_IDEMPOTENCY_MANY, *key_columns)
        for t, i, k, request_hash, response in stored:
            self.remembered[(t, i, k)] = (bytes(request_hash), bytes(response))

    async def apply(self, write: Write) -> WriteOutcome | BaseException:
        ref, idem = write.ref, write.idempotency
        for _ in range(_DECIDE_ATTEMPTS):
            if idem is not None:
                remembered = self.remembered.get((ref[0], ref[1], idem.key))
                if remembered is not None:
                    try:
                        return replay(idem, remembered)
                    except Refused as refused:
                        return refused.error
            before = self.current.get(ref)
            try:
                applied = apply_write(write, before, WriteContext(self.txids.peek(), self.now, self.live))
            except Refused as refused:
                return refused.error
            if before is not None:  # its row is locked: nobody else writes it
                self._stage(applied)
            elif (
                applied.after is not None or applied.idempotency_row is not None
            ) and not await self._insert(ref, idem, applied):
                continue  # raced: decide again on the row the other transaction committed
            commit = applied.outcome.commit
            if commit is not None:
                self.txids.take()
                if self.origin is not None:
                    self._feed(commit)
            if applied.after is not None:
                self.current[ref] = applied.after
                if applied.after.lease_session:  # granted now, by its live session
                    self.live.add(applied.after.lease_session)
            row = applied.idempotency_row
            if row is not None:
                self.remembered[(row[0], row[1], row[2])] = (row[3], row[4])
            return applied.outcome
        raise RuntimeError(f"a write to {ref[0]}/{ref[1]} kept racing other inserts of its rows")

    def _locked(self, row: Any) -> EntityRecord:
        """A row read with its lock (LOCK_ENTITY's columns): its record, the transaction that last
        wrote it, and whether its lease holder is live (noted in ``live``)."""
        values = row[:_RECORD]
        record = entity_from_row(values)
        self.current[record.ref] = record
        self.rows[record.ref] = values
        self.xacts[record.ref] = row[_RECORD]
        if row[_RECORD + 1]:
            self.live.add(record.lease_session)
        return record

    def _feed(self, commit: Commit) -> None:
        """The commit's feed row, and its entity's last writer now this transaction."""
        assert commit.after is not None  # every commit writes its entity's row
        ref = commit.ref
        after = entity_row(commit.after)
        before = self.rows[ref][2:] if commit.before is not None else _NO_BEFORE
        self.feed_rows.append((self.origin, commit.timestamp_ms, *after, *before))
        self.rows[ref] = after
        self.before_xacts[commit.txid] = self.xacts.get(ref)
        self.xacts[ref] = self.txids.xact

    def _stage(self, applied: Applied) -> None:
        if applied.after is not None:
            self.entities[applied.after.ref] = applied.after
        self.events.extend(applied.event_rows)
        if applied.idempotency_row is not None:
            self.idempotency_rows.append(applied.idempotency_row)

    async def _insert(self, ref: Ref, idem: Idempotency | None, applied: Applied) -> bool:
        """Write a new entity's rows in a savepoint; False when another transaction inserted
        them meanwhile (it has committed: the insert waited for it), with its rows now locked."""
        conn = self.conn
        await conn.execute(SAVEPOINT)
        inserted = [entity_row(applied.after)] if applied.after is not None else []
        idempotency = [applied.idempotency_row] if applied.idempotency_row is not None else []
        try:
            await _write_rows(conn, INSERT_ROWS, INSERT_WIDTHS, inserted, applied.event_rows, idempotency)
        except asyncpg.exceptions.UniqueViolationError:
            await conn.execute(ROLLBACK_TO_SAVEPOINT)
            row = await conn.fetchrow(LOCK_ENTITY, *ref)
            if row is not None:
                self._locked(row)
            else:
                self.current[ref] = self.xacts[ref] = None
            if idem is not None:
                found = await conn.fetchrow(SELECT_IDEMPOTENCY, ref[0], ref[1], idem.key)
                if found is not None:
                    self.remembered[(ref[0], ref[1], idem.key)] = (bytes(found[0]), bytes(found[1]))
            await self.txids.redraw()  # above any txid of the rows just locked
            return False
        return True

    async def flush(self) -> None:
        """The staged rows, every table's in one statement."""
        updated = [entity_row(r) for r in self.entities.values()]
        if updated or self.events or self.idempotency_rows or self.feed_rows:
            await _write_rows(
                self.conn,
                FLUSH_ROWS,
                FLUSH_WIDTHS,
                updated,
                self.events,
                self.idempotency_rows,
                self.feed_rows,
            )


async def _write_rows(
    conn: Any, sql: str, widths: Sequence[int], *tables: Sequence[tuple[object, ...]]
) -> None:
    """FLUSH_ROWS or INSERT_ROWS: each table's rows as columns (``unnest``'s arrays)."""
    arrays: list[list[object]] = []
    for rows, width in zip(tables, widths, strict=True):
        arrays.extend([list(column) for column in zip(*rows, strict=True)] if rows else [[]] * width)
    await conn.execute(sql, *arrays)
