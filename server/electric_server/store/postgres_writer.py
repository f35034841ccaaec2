"""The PostgreSQL store's writes: a batch of writes in one transaction, each decided on its locked row.

A batch (``write_many``; ``write`` is a batch of one) runs in one
transaction on one pooled connection:

1. its entities' rows are locked ``FOR UPDATE`` in (type, id) order, so two
   batches never wait for each other in a circle (were they to, PostgreSQL's
   deadlock error, or a serialization failure, re-runs the whole batch: its
   decide functions run again on what is current then);
2. txids are drawn from the ``electric_txid`` sequence after the locks, so
   each entity's txids increase in commit order (a write that commits takes
   the next one drawn; a refused one takes none, but numbers may be skipped);
3. each write, in call order: its idempotency key is looked up (after the
   lock, so a racing retry is seen), then ``decide`` runs on the locked row
   (``outcome.apply_write``) and its rows are written. A write whose decide
   refuses writes nothing and spares the others;
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

Then the batch's commits are published to the ``Hub``. Within this process,
writes to one entity queue for it (``_RefLocks``) from before the row lock to
after publishing, so the hub sees each entity's commits in commit order.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg

from .base import (
    DatabaseUnavailable,
    EntityRecord,
    Hub,
    Ref,
    StorageFault,
    Store,
    Write,
    WriteContext,
    WriteOutcome,
)
from .outcome import Applied, Refused, apply_write, now_ms, replay
from .postgres_schema import (
    INSERT_ENTITY,
    INSERT_EVENTS,
    INSERT_IDEMPOTENCY,
    LOCK_ENTITIES,
    LOCK_ENTITY,
    NEXT_TXIDS,
    SELECT_IDEMPOTENCY,
    UPDATE_ENTITY,
)
from .rows import entity_from_row, entity_row

__all__ = ["ACQUIRE_TIMEOUT_S", "LOST", "MAX_ATTEMPTS", "MAX_BATCH", "PostgresWriter"]

# What a lost, refused or unanswering connection raises: the call fails with DatabaseUnavailable.
LOST: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,  # the backend was terminated, or the server shuts down
    asyncpg.exceptions.InsufficientResourcesError,  # e.g. too many connections
)
# The most lone writes one batch gathers.
MAX_BATCH = 256
# How often a batch runs again after a deadlock or a serialization failure before it fails.
MAX_ATTEMPTS = 5
# How often one write is decided again after a racing insert of its row (the second attempt
# finds the row, locked; a third is for an idempotency row raced without an entity).
_DECIDE_ATTEMPTS = 3
# How long a call waits for one of the pool's connections.
ACQUIRE_TIMEOUT_S = 30.0


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

    async def draw(self, n: int) -> None:
        self._drawn = [int(row[0]) for row in await self._conn.fetch(NEXT_TXIDS, max(n, 1))]
        self._next = 0

    async def redraw(self) -> None:
        """After a row was locked late: fresh txids, above any that row's committed writes hold."""
        await self.draw(len(self._drawn) - self._next)

    def peek(self) -> int:
        return self._drawn[self._next]

    def take(self) -> None:
        self._next += 1


class PostgresWriter(Store):
    """The writing half of ``PostgresStore``."""

    hub: Hub

    def __init__(self, concurrent_batches: int) -> None:
        self._pool: Any = None
        self._ref_locks = _RefLocks()
        # Lone writes (``write``) queue here while every connection runs a batch (see _gather).
        self._concurrent_batches = concurrent_batches
        self._queued: list[tuple[Write, asyncio.Future[WriteOutcome | BaseException]]] = []
        self._batches_running = 0
        self._batch_tasks: set[asyncio.Task[None]] = set()  # referenced while they run
        # Batches committed and batches run again after a deadlock: exposed for tests and benchmarks.
        self.batches_committed = 0
        self.batches_retried = 0

    @contextlib.asynccontextmanager
    async def _connection(self, what: str) -> AsyncIterator[Any]:
        """A pooled connection; a lost or refused one fails the call with DatabaseUnavailable."""
        pool = self._pool
        if pool is None:
            raise RuntimeError("store is closed")
        try:
            async with pool.acquire(timeout=ACQUIRE_TIMEOUT_S) as conn:
                yield conn
        except LOST as exc:
            raise DatabaseUnavailable(
                f"{what} failed: the database connection failed ({type(exc).__name__}: {exc})"
            ) from exc

    async def write(self, write: Write) -> WriteOutcome:
        """One write; while every connection runs a batch, it waits to share the next
        (group commit: one transaction, one round of statements' waits, for many writes)."""
        future: asyncio.Future[WriteOutcome | BaseException] = asyncio.get_running_loop().create_future()
        self._queued.append((write, future))
        if self._batches_running < self._concurrent_batches:
            self._gather()
        outcome = await future
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

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
        refs = sorted({write.ref for write in writes})
        async with self._ref_locks.hold(refs):
            async with self._connection("a write") as conn:
                for attempt in range(1, MAX_ATTEMPTS + 1):
                    try:
                        outcomes = await self._apply_batch(conn, writes, refs)
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
            self.hub.publish_many(
                [o.commit for o in outcomes if isinstance(o, WriteOutcome) and o.commit is not None]
            )
        return outcomes

    async def _apply_batch(
        self, conn: Any, writes: Sequence[Write], refs: Sequence[Ref]
    ) -> list[WriteOutcome | BaseException]:
        transaction = conn.transaction()
        await transaction.start()
        try:
            rows = await conn.fetch(LOCK_ENTITIES, [t for t, _ in refs], [i for _, i in refs])
            current: dict[Ref, EntityRecord | None] = {}
            for row in rows:
                record = entity_from_row(row)
                current[record.ref] = record
            txids = _Txids(conn)
            await txids.draw(len(writes))
            now = now_ms()
            outcomes = [await self._apply_one(conn, write, current, txids, now) for write in writes]
        except BaseException:
            with contextlib.suppress(*LOST):  # a lost connection has rolled back by itself
                await transaction.rollback()
            raise
        try:
            await transaction.commit()
        except LOST as exc:
            raise DatabaseUnavailable(
                "the database connection was lost during COMMIT: the write may or may not have "
                "committed (a retry with the same idempotency key finds out)"
            ) from exc
        return outcomes

    async def _apply_one(
        self, conn: Any, write: Write, current: dict[Ref, EntityRecord | None], txids: _Txids, now: int
    ) -> WriteOutcome | BaseException:
        ref, idem = write.ref, write.idempotency
        for _ in range(_DECIDE_ATTEMPTS):
            if idem is not None:
                remembered = await conn.fetchrow(SELECT_IDEMPOTENCY, ref[0], ref[1], idem.key)
                if remembered is not None:
                    try:
                        return replay(idem, (bytes(remembered[0]), bytes(remembered[1])))
                    except Refused as refused:
                        return refused.error
            before = current.get(ref)
            try:
                applied = apply_write(write, before, WriteContext(txids.peek(), now))
            except Refused as refused:
                return refused.error
            if before is not None:  # its row is locked: nobody else writes it
                await _write_rows(conn, before, applied)
            elif applied.after is not None or applied.idempotency_row is not None:
                savepoint = conn.transaction()
                await savepoint.start()
                try:
                    await _write_rows(conn, before, applied)
                except asyncpg.exceptions.UniqueViolationError:
                    # Another transaction inserted the row meanwhile (and has committed: the
                    # insert waited for it). Lock it and decide again on what it holds.
                    await savepoint.rollback()
                    row = await conn.fetchrow(LOCK_ENTITY, *ref)
                    current[ref] = entity_from_row(row) if row is not None else None
                    await txids.redraw()
                    continue
                await savepoint.commit()
            if applied.outcome.commit is not None:
                txids.take()
            if applied.after is not None:
                current[ref] = applied.after
            return applied.outcome
        raise RuntimeError(f"a write to {ref[0]}/{ref[1]} kept racing other inserts of its rows")


async def _write_rows(conn: Any, before: EntityRecord | None, applied: Applied) -> None:
    """The entity's row first: a racing insert of a new entity conflicts there."""
    if applied.after is not None:
        await conn.execute(INSERT_ENTITY if before is None else UPDATE_ENTITY, *entity_row(applied.after))
    if len(applied.event_rows) == 1:
        await conn.execute(INSERT_EVENTS, *applied.event_rows[0])
    elif applied.event_rows:
        await conn.executemany(INSERT_EVENTS, applied.event_rows)
    if applied.idempotency_row is not None:
        await conn.execute(INSERT_IDEMPOTENCY, *applied.idempotency_row)
