"""A lone write in one or two round trips: a read unless the row is known, ``decide``, then one
statement that commits by itself.

A write alone (``PostgresWriter.write`` with no batch to share, so a batch of
one) is the latency path: a signal, a worker's step record. The batch path
(``postgres_writer``) spends four round trips on it — BEGIN, the locking
statement, the rows, COMMIT — and two of them only open and close the
transaction. This path has no transaction block:

1. ``READ_AND_DRAW`` reads the entity's row as committed (no lock), draws a
   txid after the statement's snapshot was taken, and reads the database's
   clock, whether the lease holder is live and the key's stored answer. A
   stored answer is replayed, and a refused write answered, from this read:
   nothing is written.
2. ``decide`` runs on that row, and one statement writes every row of the
   write and commits (``ONE_UPDATE``, ``ONE_INSERT``, ``ONE_KEY``): the
   entity's row compare-and-set on the txid it was read with, then its
   events, its key's answer and its feed row, only if the row was written.

When the replica knows the row already (``postgres_known``), step 1 is skipped:
``decide`` runs on the known row with a spare txid and a guessed clock, and
``ONE_UPDATE_GUESSED`` checks all three (the row's txid unchanged, the clock
within bounds, the holder as live as guessed) where ``ONE_UPDATE`` checks the
txid. A wrong guess writes nothing, and the write takes the two steps. Only a
commit is sent on a guess: a refusal or a no-op on a known row is read first.

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
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import asyncpg

from ..base import Commit, DatabaseUnavailable, Write, WriteContext, WriteOutcome
from ..outcome import Applied, Refused, apply_write, replay
from ..rows import ENTITY_COLUMNS, entity_from_row, entity_row
from .faults import LOST, lost_reason
from .known import MISS_REASONS, Known
from .schema import (
    ONE_INSERT,
    ONE_KEY,
    ONE_UPDATE,
    ONE_UPDATE_GUESSED,
    ONE_WRITE_COLUMNS,
    READ_AND_DRAW,
    SELECT_FED_XACT,
    TERMINATE_BACKEND,
)

__all__ = ["RACED", "Decided", "Sending", "UnknownOutcome", "find_out", "write_alone"]

# READ_AND_DRAW's columns: the txid, the clock, the key's answer, then LOCK_ENTITY's.
_ROW = 4
_RECORD = len(ENTITY_COLUMNS)
_EVENT_WIDTH, _KEY_WIDTH, _ = ONE_WRITE_COLUMNS
_NO_KEY = (None,) * _KEY_WIDTH
_NO_BEFORE = (None,) * (_RECORD - 2)
_TXID = ENTITY_COLUMNS.index("txid")
_SPARE = _ROW + _RECORD + 2  # READ_AND_DRAW's spare txid, then its exact clock
_CHECKED = 3  # where ONE_UPDATE_GUESSED's checks start in its row
# How often ``find_out`` asks whether the lost statement's backend has ended.
_ENDED_POLL_S = 0.01


class Decided(NamedTuple):
    """A lone write's end: its outcome and, when it committed, its transaction's id and the id of
    the transaction that wrote the entity before it (the FeedOrder's ``before_xact``)."""

    outcome: WriteOutcome | BaseException
    xact: int | None = None
    before_xact: int | None = None


# The write raced another: nothing was written; the batch path decides it again.
RACED = Decided(RuntimeError("raced"))


class UnknownOutcome(DatabaseUnavailable):
    """The connection was lost while the write's statement was out: it may have committed."""

    def __init__(self, message: str, commit: Commit, before_xact: int | None, pid: int, started: Any) -> None:
        super().__init__(message)
        self.commit = commit
        self.before_xact = before_xact
        self.pid = pid
        self.started = started


async def write_alone(
    conn: Any,
    write: Write,
    origin: int,
    backend: tuple[int, datetime.datetime],
    order: Sending,
    unknown: Callable[[UnknownOutcome], None],
    timeout_s: float,
    known: Known,
) -> Decided:
    """The write on ``conn`` (its backend: pid and start). ``order.sending(txid)`` is called just
    before a commit's statement goes out (the FeedOrder then holds the entity's later commits),
    ``order.unsent(txid)`` when that statement wrote nothing, and ``unknown`` with what to find
    out when its outcome cannot be known (a lost connection: then ``UnknownOutcome`` is raised
    too; a cancelled caller: then the cancellation goes on). ``timeout_s``: the statements'
    bound, for the message of one that ran out. ``known``: what the replica knew of the entity,
    which spares the read when the database finds it right (``_on_a_guess``)."""
    statement = _Statement(conn, backend, unknown, timeout_s, known)
    guessed = await _on_a_guess(statement, write, origin, order, known)
    if guessed is not None:
        return guessed
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
        if key_row is not None and not await _insert_key(conn, key_row):
            return RACED
        return Decided(applied.outcome)
    order.sending(commit.txid)
    args = _arguments(applied, commit, origin, values if before is not None else None)
    try:
        row = await statement.commit(
            ONE_UPDATE if before is not None else ONE_INSERT, args, commit, before_xact
        )
    except asyncpg.exceptions.UniqueViolationError:
        return RACED  # a racing spawn, or a retry's key: the statement wrote nothing
    if row is None:
        return RACED  # another commit on the entity since the read
    return Decided(applied.outcome, int(row[0]), before_xact)


class Sending(Protocol):
    """Where a lone write says which txid its committing statement carries (the FeedOrder's)."""

    def sending(self, txid: int) -> None: ...
    def unsent(self, txid: int) -> None: ...


async def _on_a_guess(
    statement: _Statement, write: Write, origin: int, order: Sending, known: Known
) -> Decided | None:
    """The write in one round trip, decided on what the replica knew (postgres_known), if it
    knew enough and the write commits; None: it is to be read and decided again (nothing was
    written). A refusal or a no-op is never answered from a guess: only a commit's statement
    checks the guess."""
    ref = write.ref
    entry = known.entity(ref)
    if entry is None:
        return None
    before, before_xact = entry
    now_ms = known.now_ms(before.updated_at_ms)
    if now_ms is None:
        return None
    txid = known.take_spare(above=before.txid)
    if txid is None:
        return None
    live = bool(before.lease_session)
    try:
        applied = apply_write(
            write, before, WriteContext(txid, now_ms, (before.lease_session,) if live else ())
        )
    except Refused:
        return None
    commit = applied.outcome.commit
    if commit is None:
        return None
    order.sending(txid)
    args = _arguments(applied, commit, origin, entity_row(before), guess=(now_ms, live))
    try:
        row = await statement.commit(ONE_UPDATE_GUESSED, args, commit, before_xact)
    except asyncpg.exceptions.UniqueViolationError:
        row = None  # a retry's key stored: the read finds it
    if row is None or row[0] is None:
        order.unsent(txid)
        known.missed(ref, _wrong_guesses(row))
        return None
    known.guesses += 1
    return Decided(applied.outcome, int(row[0]), before_xact)


def _wrong_guesses(row: Any) -> list[str]:
    """Which guesses ONE_UPDATE_GUESSED found wrong (its row, or None: nothing came back)."""
    if row is None:
        return ["row"]
    wrong = [reason for reason, right in zip(MISS_REASONS, row[_CHECKED:], strict=True) if not right]
    # None wrong at the statement's snapshot: a commit since, which the update saw.
    return wrong or ["row"]


class _Statement:
    """A statement that commits by itself, on ``conn``: what it tells ``known``, and what is done
    when its outcome cannot be known (``write_alone``)."""

    def __init__(
        self,
        conn: Any,
        backend: tuple[int, datetime.datetime],
        unknown: Callable[[UnknownOutcome], None],
        timeout_s: float,
        known: Known,
    ) -> None:
        self._conn = conn
        self._backend = backend
        self._unknown = unknown
        self._timeout_s = timeout_s
        self._known = known

    async def commit(self, sql: str, args: list[object], commit: Commit, before_xact: int | None) -> Any:
        """Its row (the transaction's id first: None if it wrote nothing), or None: no row came
        back (nothing was written)."""
        known = self._known
        try:
            row = await self._conn.fetchrow(sql, *args)
        except LOST as exc:  # (a backend ended after its commit may say so instead of answering)
            # (What was known is forgotten by the writer, as after any lost connection.)
            lost = UnknownOutcome(
                f"a write failed: {lost_reason(exc, self._timeout_s)} while the write's statement was "
                "out, so it may or may not have committed (a retry with the same idempotency key "
                "finds out)",
                commit,
                before_xact,
                *self._backend,
            )
            self._unknown(lost)
            raise lost from exc
        except asyncio.CancelledError:
            # The caller gave up while the statement was out, and it may commit all the same. The
            # connection is closed here, so its backend runs nothing else, and found out as if lost.
            known.forget(commit.ref)
            self._conn.terminate()
            self._unknown(
                UnknownOutcome("cancelled with its statement out", commit, before_xact, *self._backend)
            )
            raise
        if row is None:
            return None
        known.spare(int(row[1]))
        known.clock(float(row[2]))
        if row[0] is not None:
            assert commit.after is not None
            known.learn(commit.after, int(row[0]))
        return row


async def _insert_key(conn: Any, key_row: tuple[object, ...]) -> bool:
    try:
        await conn.execute(ONE_KEY, *key_row)
    except asyncpg.exceptions.UniqueViolationError:
        return False
    return True


def _arguments(
    applied: Applied, commit: Commit, origin: int, before_values: Any, guess: tuple[int, bool] | None = None
) -> list[object]:
    """ONE_UPDATE's (with the txid read: ``before_values``), ONE_UPDATE_GUESSED's (with the guessed
    clock and holder's liveness: ``guess``) or ONE_INSERT's values."""
    assert commit.after is not None  # every commit writes its entity's row
    after = entity_row(commit.after)
    args: list[object] = list(after)
    if before_values is not None:
        args.append(before_values[_TXID])
    if guess is not None:
        args.extend(guess)
    rows = applied.event_rows
    args.extend([list(column) for column in zip(*rows, strict=True)] if rows else [[]] * _EVENT_WIDTH)
    args.extend(applied.idempotency_row or _NO_KEY)
    before = tuple(before_values[2:]) if before_values is not None else _NO_BEFORE
    args.extend((origin, commit.timestamp_ms, *after, *before))
    return args


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
