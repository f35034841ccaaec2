"""Group commit, once for every store: the queue, the batches, each write decided, the answers,
and the publication in commit order.

Writes queue (``write``, ``write_many``: in call order, the order they are
applied in) while the batches before them commit; a writer takes what is
queued as one batch (at most ``max_batch_writes``) and runs it in one
transaction. Each write is still its own logical transaction with its own
txid: its decide function raises before anything is written, so a refused
write leaves no trace, and the batch commits or fails as a whole — no caller
is told "done" before its data is durable. Up to ``max_batches`` batches run
at once, each in a writer task of its own: one for SQLite (one connection
writes), the pool's size for PostgreSQL.

A batch, in its entities' turn (``Backend.hold``) and on one session:

1. a batch of one is first offered to the backend's lone write, if one is
   ready (PostgreSQL's one statement: postgres/one_trip.py);
2. its transaction begins: the backend reads or locks its entities and
   stored keys;
3. each write, in order: a stored idempotency key replays its answer
   (``replay``); otherwise ``apply_write`` decides it on the entity as the
   batch sees it and the transaction stages its rows, or inserts them at once
   where the backend must (PostgreSQL's new rows: a racing insert has the
   write decided again on the row the other transaction committed). A write
   whose decide refuses writes nothing and spares the others;
4. commit; an error the backend calls retryable (a deadlock) runs the batch
   again, decide functions and all, at most ``MAX_ATTEMPTS`` times;
5. the backend makes the commit durable (SQLite's WAL sync);
6. the writers are answered, then the commits published through the
   transaction (to the ``Hub``, or through the ``FeedOrder`` and its
   doorbell), in commit order: with many watchers, fan-out never delays an
   answer.

A batch that fails fails its writes only, with what the fault policy makes
of the error (store/faults.py: a full disk pauses writes, a failed one stops
them, anything unforeseen is logged), and the writer goes on; were a writer's
loop itself to fail, every queued and later write is refused, never left
waiting.

At light load a write skips the queue when the backend's fast path for it is
``ready()`` (``here``): it runs in its caller's task, sparing the hand-over to
a writer and back (two turns of the loop). SQLite runs the batch path right
there (nothing in it waits: sqlite/lone_write.py), PostgreSQL its one
statement (a race sends the write to the queue). It counts as a running batch
meanwhile, so writes that arrive share the next one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from ..lifetime import TaskGroup
from .base import Commit, DatabaseUnavailable, StorageFailed, StorageFault, Write, WriteOutcome
from .fastpath import FastPath
from .faults import Faults
from .outcome import Applied, Refused, apply_write, replay
from .transaction import Backend, LoneWrite, Transaction

__all__ = ["DECIDE_ATTEMPTS", "MAX_ATTEMPTS", "GroupCommitter", "Outcome"]

# How often a batch runs again after a retryable error (a deadlock) before it fails.
MAX_ATTEMPTS = 5
# How often one write is decided again after a racing insert of its row (the second attempt
# finds the row; a third is for an idempotency row raced without an entity).
DECIDE_ATTEMPTS = 3

Outcome = WriteOutcome | BaseException


class _Pending:
    """Writes queued by one call, and the future that answers it."""

    __slots__ = ("future", "writes")

    def __init__(self, writes: Sequence[Write], future: asyncio.Future[list[Outcome]]) -> None:
        self.writes = writes
        self.future = future


class _Writer:
    """One writer task, what wakes it, and the batch it was handed (``start_at_once``)."""

    __slots__ = ("batch", "task", "wake")

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.batch: list[_Pending] | None = None


def _refuse(batch: Sequence[_Pending], error: BaseException) -> None:
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(error.again() if isinstance(error, StorageFault) else error)


def _commits(outcomes: Sequence[Outcome]) -> list[Commit]:
    return [o.commit for o in outcomes if isinstance(o, WriteOutcome) and o.commit is not None]


def _decide(tx: Transaction, write: Write) -> Applied | Outcome:
    """``write`` decided in ``tx``: its stored answer replayed, or ``apply_write``'s rows to stage,
    or what refused it (nothing of it is written)."""
    ref, idem = write.ref, write.idempotency
    try:
        remembered = tx.remembered(ref, idem.key) if idem is not None else None
        before = tx.current(ref) if remembered is None else None
    except Exception as exc:  # a read of this write's rows failed: this write fails, not its batch
        return exc
    try:
        if remembered is not None:
            assert idem is not None
            return replay(idem, remembered)
        return apply_write(write, before, tx.context())
    except Refused as refused:
        return refused.error


async def _decide_all(tx: Transaction, writes: Sequence[Write]) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for write in writes:
        for _ in range(DECIDE_ATTEMPTS):
            decided = _decide(tx, write)
            if not isinstance(decided, Applied):
                break
            if tx.stage(write, decided) or await tx.insert(write, decided):
                decided = decided.outcome
                break
            # raced: decided again on the row the other transaction committed
        else:
            ref = write.ref
            raise RuntimeError(f"a write to {ref[0]}/{ref[1]} kept racing other inserts of its rows")
        outcomes.append(decided)
    return outcomes


class GroupCommitter:
    """See the module docstring.

    ``max_batches``: batches at once (writer tasks); ``max_batch_writes``: the most writes one
    batch takes (None: all that is queued); ``commit_delay_s``: under concurrent load, how long a
    batch waits for more writes before it commits (PostgreSQL's commit_delay), never after a batch
    of one; ``here``: the fast path that lets a lone write run in its caller's task, and
    ``lone``: a batch of one's fast path, tried before its transaction (both may be set once
    the store's parts are built, since they ask the committer too); ``batches_in_caller``:
    whether a batch may run in its caller's task (it never waits inside); ``start_at_once``:
    whether a batch starts with what is queued the moment a writer is free (batches that run side
    by side: a write waits for no company), rather than when the writer wakes, a turn later, with
    all that came meanwhile (one writer, each of whose batches costs a sync); ``drain``: whether
    ``close`` commits what is queued (else it is refused).
    """

    __slots__ = (
        "_backend",
        "_batches_in_caller",
        "_closing",
        "_drain",
        "_faults",
        "_idle",
        "_last_batch_writes",
        "_max_batch_writes",
        "_max_batches",
        "_name",
        "_queue",
        "_running",
        "_start_at_once",
        "_tasks",
        "_woken",
        "_writers",
        "batches_committed",
        "batches_retried",
        "commit_delay_s",
        "here",
        "lone",
    )

    def __init__(
        self,
        backend: Backend,
        faults: Faults,
        *,
        name: str,
        max_batches: int = 1,
        max_batch_writes: int | None = None,
        commit_delay_s: float = 0.0,
        here: FastPath | None = None,
        lone: LoneWrite | None = None,
        batches_in_caller: bool = False,
        start_at_once: bool = False,
        drain: bool = True,
    ) -> None:
        self._backend = backend
        self._faults = faults
        faults.refuse_queued = self.refuse_queued
        self._name = name
        self._max_batches = max_batches
        self._max_batch_writes = max_batch_writes
        self.commit_delay_s = commit_delay_s
        self.here = here
        self.lone = lone
        self._batches_in_caller = batches_in_caller
        self._start_at_once = start_at_once
        self._drain = drain
        self._queue: list[_Pending] = []
        self._running = 0  # batches being run, a lone write in its caller's task included
        self._writers: list[_Writer] = []
        self._tasks = TaskGroup(f"the store's writers ({name})")  # anew at each start
        self._idle: list[_Writer] = []  # writers waiting for work
        self._woken: _Writer | None = None  # the writer woken for what is queued, until it takes it
        self._closing = False
        self._last_batch_writes = 0
        # Batches committed, and batches run again after a retryable error: for tests and benchmarks.
        self.batches_committed = 0
        self.batches_retried = 0

    # -- state the fast paths ask -------------------------------------------------------------

    def idle(self) -> bool:
        """Open, with no batch running and nothing queued: a write now would be alone."""
        return not self._running and not self._queue and not self._closing and bool(self._writers)

    @property
    def last_batch_writes(self) -> int:
        """How many writes the last batch held (1 or fewer: light load)."""
        return self._last_batch_writes

    @property
    def writer_tasks(self) -> tuple[asyncio.Task[None], ...]:
        """The writer tasks (for tests: who published a commit)."""
        return tuple(w.task for w in self._writers if w.task is not None)

    # -- lifetime ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer tasks, in a group of their own (lifetime.py): the store's only tasks
        that run batches."""
        self._tasks = TaskGroup(f"the store's writers ({self._name})")
        for i in range(self._max_batches):
            writer = _Writer()
            name = self._name if self._max_batches == 1 else f"{self._name}-{i}"
            writer.task = self._tasks.start_soon(self._work(writer), name=name)
            self._writers.append(writer)

    async def close(self) -> None:
        """Take no more writes. With ``drain`` the writers commit what is queued first and are
        waited for; else what is queued is refused and the writers end after their batches."""
        self._closing = True
        if not self._drain:
            self.refuse_queued(RuntimeError("store is closed"))
        self._wake_all()
        self._writers = []
        # They end on their own, after the batch each runs (and, with ``drain``, what is queued):
        # awaited, so no writer outlives its store.
        await self._tasks.wait()
        await self._tasks.aclose()

    def refuse_queued(self, error: BaseException) -> None:
        """Fail every write queued and not yet taken into a batch."""
        queue, self._queue = self._queue, []
        _refuse(queue, error)
        self._wake_all()  # a writer waiting for work or for room sees why

    # -- writes --------------------------------------------------------------------------------

    async def write(self, write: Write) -> WriteOutcome:
        here = self.here
        outcome = await self._in_caller(write) if here is not None and self.idle() and here.ready() else None
        if outcome is None:
            (outcome,) = await self._submit((write,))  # not through write_many: one coroutine less
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def write_many(self, writes: Sequence[Write]) -> list[Outcome]:
        return await self._submit(writes)

    def _submit(self, writes: Sequence[Write]) -> asyncio.Future[list[Outcome]]:
        """Queue writes for the writers (in call order: the order they are applied in)."""
        refusal = self._faults.refusal
        if refusal is not None:  # a full or failed disk: refused at once, costing nothing
            raise refusal.again()
        if self._closing or not self._writers:
            raise RuntimeError("store is closed")
        future: asyncio.Future[list[Outcome]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(writes, future))
        self._dispatch()
        return future

    async def _in_caller(self, write: Write) -> Outcome | None:
        """``write`` alone, in its caller's task (see the module docstring); None: it raced, and
        goes to the queue."""
        answered: list[Outcome] = []
        self._running += 1
        try:
            failure = await self._batch((write,), answered.extend, in_caller=True)
        finally:
            self._running -= 1
            self._dispatch()
        if failure is not None:
            return failure
        return answered[0] if answered else None

    # -- the writers ---------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Wake an idle writer for what is queued, unless the batches running are as many as may
        run: handing it its batch now (``start_at_once``), or to take what is queued when it wakes
        (then no other writer is woken meanwhile)."""
        while self._queue and self._idle and self._running < self._max_batches:
            if not self._start_at_once:
                if self._woken is None:
                    writer = self._woken = self._idle.pop()
                    writer.wake.set()
                return
            writer = self._idle.pop()
            writer.batch = self._take()
            self._running += 1
            writer.wake.set()

    def _wake_all(self) -> None:
        for writer in self._writers:
            writer.wake.set()

    async def _work(self, writer: _Writer) -> None:
        try:
            await self._serve(writer)
        except (
            BaseException
        ) as exc:  # the loop itself failed (a bug): refuse writes, never leave them waiting
            if not self._closing or not isinstance(exc, asyncio.CancelledError):
                stopped = StorageFailed(f"the store's writer stopped on {type(exc).__name__}: {exc}")
                self._faults.stop(stopped, "the writer's loop", exc_info=exc)
            self.refuse_queued(RuntimeError("store is closed"))
            if not isinstance(exc, Exception):
                raise

    async def _serve(self, writer: _Writer) -> None:
        while True:
            batch, writer.batch = writer.batch, None  # handed by _dispatch, and counted running
            if batch is None:
                if not self._queue:
                    if self._closing or self._faults.failed is not None:
                        return
                    await self._wait(writer)
                    continue
                if self.commit_delay_s and self._last_batch_writes > 1:
                    # Only when the last batch had company: a lone writer is never delayed.
                    await asyncio.sleep(self.commit_delay_s)
                batch = self._take()
                if not batch:
                    continue
                self._running += 1
            self._dispatch()  # what this batch left queued goes to another writer, if one is free
            try:
                if self._closing and not self._drain:  # handed over as the store closed
                    _refuse(batch, RuntimeError("store is closed"))
                else:
                    await self._commit(batch)
                    await self._backend.maintain()
            finally:
                self._running -= 1
            if self._faults.failed is not None:
                return

    async def _wait(self, writer: _Writer) -> None:
        """Idle until woken: for work, or because the store closes or refuses writes."""
        self._idle.append(writer)
        try:
            await self._faults.wait_for_room(writer.wake, self._backend.probe_room)  # at once unless full
            await writer.wake.wait()
        finally:
            writer.wake.clear()
            if self._woken is writer:
                self._woken = None
            elif writer in self._idle:
                self._idle.remove(writer)

    def _take(self) -> list[_Pending]:
        cap = self._max_batch_writes
        if cap is None:
            batch, self._queue = self._queue, []
            return batch
        taken = count = 0
        queue = self._queue
        while taken < len(queue) and count < cap:
            count += len(queue[taken].writes)
            taken += 1
        batch = queue[:taken]
        del queue[:taken]
        return batch

    async def _commit(self, batch: list[_Pending]) -> None:
        """Run one batch of queued writes and answer each call (or refuse it)."""
        writes = batch[0].writes if len(batch) == 1 else [w for p in batch for w in p.writes]

        def answer(outcomes: list[Outcome]) -> None:
            start = 0
            for pending in batch:
                end = start + len(pending.writes)
                if not pending.future.done():  # (a caller cancelled its wait: applied all the same)
                    pending.future.set_result(outcomes[start:end])
                start = end

        try:
            failure = await self._batch(writes, answer)
        except BaseException:  # cancelled with the loop: nobody waits for ever
            _refuse(batch, RuntimeError("store is closed"))
            raise
        if failure is not None:
            _refuse(batch, failure)

    # -- one batch -----------------------------------------------------------------------------

    async def _batch(
        self, writes: Sequence[Write], answer: Callable[[list[Outcome]], None], *, in_caller: bool = False
    ) -> BaseException | None:
        """Run ``writes`` as one batch (see the module docstring) and ``answer`` their outcomes;
        returns what they are told instead when the batch failed. In the caller's task
        (``in_caller``) a backend whose batches may not run there answers nothing when its lone
        write raced."""
        if not self._backend.holds:
            return await self._run(writes, answer, in_caller)
        async with self._backend.hold(writes):
            return await self._run(writes, answer, in_caller)

    async def _run(
        self, writes: Sequence[Write], answer: Callable[[list[Outcome]], None], in_caller: bool
    ) -> BaseException | None:
        started = time.perf_counter()
        count = len(writes)
        lone = count == 1 and self._last_batch_writes <= 1
        self._last_batch_writes = count
        if count == 1 and self.lone is not None and self.lone.ready():
            try:
                outcome = await self.lone.write(writes[0], started)
            except Exception as exc:
                return self._faults.write_fault(exc, "a write")
            if outcome is not None:
                self.batches_committed += 1
                answer([outcome])
                return None
            if in_caller and not self._batches_in_caller:
                return None
        try:
            outcomes, tx = await self._transact(writes)
        except Exception as exc:  # the whole batch failed to commit: nobody is acknowledged
            return self._faults.write_fault(exc, "a commit")
        try:
            await self._backend.durable(count, lone)
        except Exception as exc:  # nobody in the batch is acknowledged; never retried
            return self._faults.stop(exc, self._backend.durable_step)
        self.batches_committed += 1
        answer(outcomes)
        tx.publish(_commits(outcomes), count, started)
        return None

    async def _transact(self, writes: Sequence[Write]) -> tuple[list[Outcome], Transaction]:
        async with self._backend.session() as session:
            attempt = 1
            while True:
                try:
                    tx = await session.begin(writes)
                    try:
                        outcomes = await _decide_all(tx, writes)
                    except BaseException:
                        await tx.roll_back()
                        raise
                    await tx.commit()
                except Exception as exc:
                    why = self._backend.retryable(exc)
                    if why is None:
                        raise
                    if attempt == MAX_ATTEMPTS:
                        raise DatabaseUnavailable(
                            f"a write kept failing on {why} ({MAX_ATTEMPTS} attempts): retry"
                        ) from exc
                    self.batches_retried += 1
                    attempt += 1
                    continue
                return outcomes, tx
