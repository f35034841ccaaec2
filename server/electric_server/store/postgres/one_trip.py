"""The ``pg_one_trip`` fast path: a lone write in one or two round trips, with no transaction
block: a read unless the row is known, ``decide``, then one statement that commits by itself.

A write alone (no batch to share: in its caller's task when the committer is
idle, or a batch of one) is the latency path: a signal, a worker's step
record. The batch path (postgres/transaction.py) spends four round trips on
it — BEGIN, the locking statement, the rows, COMMIT — and two of them only
open and close the transaction. This path has none:

1. ``READ_AND_DRAW`` reads the entity's row as committed (no lock), draws a
   txid after the statement's snapshot was taken, and reads the database's
   clock, whether the lease holder is live and the key's stored answer. A
   stored answer is replayed, and a refused write answered, from this read:
   nothing is written.
2. ``decide`` runs on that row, and one statement writes every row of the
   write and commits (``ONE_UPDATE``, ``ONE_INSERT``, ``ONE_KEY``): the
   entity's row compare-and-set on the txid it was read with, then its
   events, its key's answer and its feed row, only if the row was written.

When the replica knows the row already, step 1 is skipped: that is the
``pg_guess`` fast path (postgres/guess.py); a wrong guess writes nothing,
and the write takes the two steps.

Why the batch path's guarantees hold:

- **Per-entity order.** Every commit sets the entity's txid to a new one, so
  the compare-and-set succeeds only if no commit on the entity came after
  the read. The txid was drawn after the read's snapshot, so above the txid
  of every commit the read saw; a commit the read did not see makes this
  write fail. (On a guess: the spare is used only above the known row's
  txid, and the compare-and-set makes that row the last commit.) So txids
  increase per entity in commit order, and the offsets, from the read head,
  stay gap-free.
- **Races** (another replica's write, a retry with the same key, a racing
  spawn): the compare-and-set writes no row, or an insert ends in
  unique_violation, so nothing at all is written, and the write goes to the
  batch path (``RACED``), which locks the row and decides again (the replay,
  ``ENTITY_EXISTS``).
- **Linearization.** A refusal, a replay or a no-op is decided on the row as
  committed when it was read, and takes effect there; a commit takes effect
  at its statement, with nothing committed on the entity in between.

One case is new: the connection lost (or the caller cancelled) while the statement was out. The
statement is its own commit, so its outcome is unknown (on the batch path
only a loss during COMMIT is). The caller gets ``DatabaseUnavailable`` (its
retry with the same idempotency key finds out), and the writer finds out for
its own ``Hub`` (``find_out``): it ends the statement's backend — the same
one, by its pid and its start time, since pids are reused — waits until
PostgreSQL has no such backend (its transaction has then committed or rolled
back) and looks for the commit's feed row. Until then the ``FeedOrder`` holds
the entity's later commits, as it does for a COMMIT under way.

- **Buys**: two of a lone write's four round trips (bench/bench_pg_write.py:
  a lone write against a raw commit; bench/bench_dbos.py).
- **Risks**: the guarantees above, which rest on the compare-and-set and on
  finding out an unknown outcome; a write whose statement is out when its
  caller is cancelled may still commit (it is found out and published).
- **Checked by**: tests/test_pg_one_write.py (races from two stores, a racing
  retry's key, a connection lost with the statement out, a cancelled
  caller), the store suite, and the suite run with the switch forced.
- **Switch**: ``pg_one_trip``; forced, every write takes a batch's
  transaction (and the ``pg_guess`` fast path, which lives inside this one,
  is off too). It needs the commit feed (the feed row finds out an unknown
  outcome): a store without it (a tool's) always takes the batch path.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg

from ...lifetime import TaskGroup
from ..base import DatabaseUnavailable, Write, WriteContext, WriteOutcome
from ..fastpath import switched_on
from ..feed_order import FeedOrder
from ..outcome import Refused, apply_write, replay
from ..rows import ENTITY_COLUMNS, entity_from_row
from .connections import Connections
from .faults import LOST
from .guess import Guess
from .known import Known
from .lone_statement import RACED, Decided, Sending, Statement, UnknownOutcome, arguments, insert_key
from .publisher import Publisher
from .statements import ONE_INSERT, ONE_UPDATE, READ_AND_DRAW, SELECT_FED_XACT, TERMINATE_BACKEND

__all__ = ["OneTrip", "find_out", "write_alone"]

log = logging.getLogger(__name__)

# READ_AND_DRAW's columns: the txid, the clock, the key's answer, then LOCK_ENTITY's.
_ROW = 4
_RECORD = len(ENTITY_COLUMNS)
_SPARE = _ROW + _RECORD + 2  # READ_AND_DRAW's spare txid, then its exact clock
# How often ``find_out`` asks whether the lost statement's backend has ended.
_ENDED_POLL_S = 0.01


class OneTrip:
    """See the module docstring: the committer's lone write (store/transaction.py's ``LoneWrite``),
    in its caller's task or as a batch of one."""

    __slots__ = (
        "_connections",
        "_publisher",
        "_tasks",
        "enabled",
        "finding_out",
        "guess",
        "lone_writes",
        "origin",
    )

    def __init__(self, connections: Connections, publisher: Publisher, guess: Guess) -> None:
        self._connections = connections
        self._publisher = publisher
        self.guess = guess
        self.enabled = False  # until the store opens
        self.origin = 0  # this replica's in the feed's rows (set with the feed)
        # Lone writes with their outcome unknown, being found out (_find_out).
        self.finding_out: set[asyncio.Task[None]] = set()
        self._tasks = TaskGroup("the lone writes' findings")  # anew at each open
        self.lone_writes = 0  # committed alone, in one or two round trips (tests and benchmarks)

    def open(self, origin: int) -> None:
        self._tasks = TaskGroup("the lone writes' findings")
        self.origin = origin
        self.enabled = switched_on("pg_one_trip")
        if self.enabled:
            self.guess.open()

    async def close(self) -> None:
        """No more lone writes; what is being found out is given up (the store's Hub has no
        subscriber left to tell), awaited."""
        self.enabled = False
        await self._tasks.aclose()

    def ready(self) -> bool:
        """On, with the commit feed open (the feed row finds out an unknown outcome)."""
        return self.enabled and self._publisher.order is not None

    async def write(self, write: Write, started: float) -> WriteOutcome | BaseException | None:
        order = self._publisher.order
        assert order is not None
        decided = await self._write_alone(write, order)
        if decided is RACED:
            return None
        self._published(decided, started)
        return decided.outcome

    async def _write_alone(self, write: Write, order: FeedOrder) -> Decided:
        sent = _Sent(order)
        unknown: list[UnknownOutcome] = []
        floor = order.snapshot.xmax  # the reader's last snapshot: taken before the statement goes

        def find_out_later(lost: UnknownOutcome) -> None:
            unknown.append(lost)
            finding = self._find_out(lost, floor)
            task = self._tasks.start_soon(finding, name="electric-find-out")
            self.finding_out.add(task)
            task.add_done_callback(self.finding_out.discard)

        connections = self._connections
        try:
            async with connections.connection("a write") as conn:
                pid = conn.get_server_pid()
                started = connections.backend_starts.get(pid)
                if started is None:  # a connection not made by this store's pool
                    return RACED
                statement = Statement(
                    conn, (pid, started), find_out_later, connections.timeout_s, self.guess.known
                )
                decided = await write_alone(statement, conn, write, self.origin, sent, self.guess)
        except UnknownOutcome as lost:
            raise DatabaseUnavailable(str(lost)) from lost  # the caller's: no commit to carry
        except BaseException:
            if not unknown:  # else it stays held until found out
                order.forgotten(sent.txids)
            raise
        if decided.xact is None:
            order.forgotten(sent.txids)
        return decided

    def _published(self, decided: Decided, started: float) -> None:
        if decided.xact is not None:
            self._publisher.took_writes()
        outcome = decided.outcome
        commit = outcome.commit if isinstance(outcome, WriteOutcome) else None
        self._publisher.alone(commit, started, decided.xact, decided.before_xact)
        if commit is not None and decided.xact is not None:
            self.lone_writes += 1

    async def _find_out(self, lost: UnknownOutcome, floor: int) -> None:
        """Whether a lone write whose connection was lost committed; published if it did. Tried
        until the database answers (the store is unavailable until then anyway)."""
        pause = 0.05
        while True:
            pool = self._connections.pool
            if pool is None:
                return  # closed: this replica's Hub has no subscriber left to tell
            try:
                async with pool.acquire(timeout=self._connections.timeout_s) as conn:
                    xact = await find_out(conn, lost, self.origin, floor)
                break
            except (*LOST, asyncpg.PostgresError) as exc:
                log.debug("finding out a lost write's outcome failed (%s): trying again", exc)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
        commit = lost.commit
        ref = f"{commit.ref[0]}/{commit.ref[1]}"
        if xact is None:
            self._publisher.forgotten(commit.txid)
            log.warning(
                "a write to %s whose connection was lost had not committed (txid %d)", ref, commit.txid
            )
        else:
            self._publisher.late(commit, xact, lost.before_xact)
            log.warning("a write to %s whose connection was lost had committed (txid %d)", ref, commit.txid)


class _Sent:
    """The txids a lone write sent (``Sending``), held in the FeedOrder from then: the entity's
    later commits wait for them."""

    __slots__ = ("_order", "txids")

    def __init__(self, order: FeedOrder) -> None:
        self._order = order
        self.txids: list[int] = []

    def sending(self, txid: int) -> None:
        self.txids.append(txid)
        self._order.sending((txid,))

    def unsent(self, txid: int) -> None:
        self.txids.remove(txid)
        self._order.forgotten((txid,))


async def write_alone(
    statement: Statement, conn: Any, write: Write, origin: int, order: Sending, guess: Guess
) -> Decided:
    """The write on ``conn``, whose committing statement is ``statement``. ``order.sending(txid)``
    is called just before a commit's statement goes out (the FeedOrder then holds the entity's
    later commits), ``order.unsent(txid)`` when that statement wrote nothing. ``guess``: what the
    replica knew of the entity, which spares the read when the database finds it right."""
    if guess.ready():
        guessed = await guess.write(statement, write, origin, order)
        if guessed is not None:
            return guessed
    known: Known = guess.known
    ref, idem = write.ref, write.idempotency
    row = await conn.fetchrow(READ_AND_DRAW, ref[0], ref[1], idem.key if idem is not None else None)
    known.clock(float(row[_SPARE + 1]))
    known.spare(row[_SPARE])
    if idem is not None and row[2] is not None:
        try:
            return Decided(replay(idem, (bytes(row[2]), bytes(row[3]))))
        except Refused as refused:
            return Decided(refused.error)
    values = row[_ROW : _ROW + _RECORD]
    before = entity_from_row(values) if values[0] is not None else None
    before_xact = row[_ROW + _RECORD]
    if before is not None:
        known.learn(before, before_xact)
    live = (before.lease_session,) if before is not None and row[_ROW + _RECORD + 1] else ()
    ctx = WriteContext(int(row[0]), int(row[1]), live)
    try:
        applied = apply_write(write, before, ctx)
    except Refused as refused:
        return Decided(refused.error)
    commit = applied.outcome.commit
    if commit is None:
        key_row = applied.idempotency_row
        if key_row is not None and not await insert_key(conn, key_row):
            return RACED
        return Decided(applied.outcome)
    order.sending(commit.txid)
    args = arguments(applied, commit, origin, values if before is not None else None)
    try:
        row = await statement.commit(
            ONE_UPDATE if before is not None else ONE_INSERT, args, commit, before_xact
        )
    except asyncpg.exceptions.UniqueViolationError:
        return RACED  # a racing spawn, or a retry's key: the statement wrote nothing
    if row is None:
        return RACED  # another commit on the entity since the read
    return Decided(applied.outcome, int(row[0]), before_xact)


async def find_out(conn: Any, lost: UnknownOutcome, origin: int, floor: int) -> int | None:
    """Whether the lost write committed: its transaction's id, or None. Its backend is ended first
    and waited for, so the answer is final (a backend gone has committed or rolled back).
    ``floor``: the xmax of a snapshot taken before the write's statement went out, below every
    transaction id assigned after (so below the write's), which bounds the feed rows read."""
    # Polled: PostgreSQL tells no one when a backend has gone.
    while await conn.fetch(TERMINATE_BACKEND, lost.pid, lost.started):  # noqa: ASYNC110
        await asyncio.sleep(_ENDED_POLL_S)
    xact = await conn.fetchval(SELECT_FED_XACT, origin, lost.commit.txid, str(floor))
    return None if xact is None else int(xact)
