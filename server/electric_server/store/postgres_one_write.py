"""A lone write in two round trips: a read, ``decide``, then one statement that commits by itself.

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

Why the batch path's guarantees hold:

- **Per-entity order.** Every commit sets the entity's txid to a new one, so
  the compare-and-set succeeds only if no commit on the entity came after
  the read. The txid was drawn after the read's snapshot, so above the txid
  of every commit the read saw; a commit the read did not see makes this
  write fail. So txids increase per entity in commit order, and the offsets,
  from the read head, stay gap-free.
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
from typing import Any, NamedTuple

import asyncpg

from .base import Commit, DatabaseUnavailable, Write, WriteContext, WriteOutcome
from .outcome import Applied, Refused, apply_write, replay
from .postgres_faults import LOST, lost_reason
from .postgres_schema import (
    ONE_INSERT,
    ONE_KEY,
    ONE_UPDATE,
    ONE_WRITE_COLUMNS,
    READ_AND_DRAW,
    SELECT_FED_XACT,
    TERMINATE_BACKEND,
)
from .rows import ENTITY_COLUMNS, entity_from_row, entity_row

__all__ = ["RACED", "Decided", "UnknownOutcome", "find_out", "write_alone"]

# READ_AND_DRAW's columns: the txid, the clock, the key's answer, then LOCK_ENTITY's.
_ROW = 4
_RECORD = len(ENTITY_COLUMNS)
_EVENT_WIDTH, _KEY_WIDTH, _ = ONE_WRITE_COLUMNS
_NO_KEY = (None,) * _KEY_WIDTH
_NO_BEFORE = (None,) * (_RECORD - 2)
_TXID = ENTITY_COLUMNS.index("txid")
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
    sending: Callable[[int], None],
    unknown: Callable[[UnknownOutcome], None],
    timeout_s: float,
) -> Decided:
    """The write on ``conn`` (its backend: pid and start). ``sending(txid)`` is called just before a
    commit's statement goes out (the FeedOrder then holds the entity's later commits), and
    ``unknown`` with what to find out when its outcome cannot be known (a lost connection: then
    ``UnknownOutcome`` is raised too; a cancelled caller: then the cancellation goes on).
    ``timeout_s``: the statements' bound, for the message of one that ran out."""
    ref, idem = write.ref, write.idempotency
    row = await conn.fetchrow(READ_AND_DRAW, ref[0], ref[1], idem.key if idem is not None else None)
    if idem is not None and row[2] is not None:
        try:
            return Decided(replay(idem, (bytes(row[2]), bytes(row[3]))))
        except Refused as refused:
            return Decided(refused.error)
    values = row[_ROW : _ROW + _RECORD]
    before = entity_from_row(values) if values[0] is not None else None
    before_xact = row[_ROW + _RECORD]
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
    sending(commit.txid)
    args = _arguments(applied, commit, origin, values if before is not None else None)
    try:
        xact = await conn.fetchval(ONE_UPDATE if before is not None else ONE_INSERT, *args)
    except asyncpg.exceptions.UniqueViolationError:
        return RACED  # a racing spawn, or a retry's key: the statement wrote nothing
    except LOST as exc:  # (a backend ended after its commit may say so instead of answering)
        lost = UnknownOutcome(
            f"a write failed: {lost_reason(exc, timeout_s)} while the write's statement was out, so "
            "it may or may not have committed (a retry with the same idempotency key finds out)",
            commit,
            before_xact,
            *backend,
        )
        unknown(lost)
        raise lost from exc
    except asyncio.CancelledError:
        # The caller gave up while the statement was out, and it may commit all the same. The
        # connection is closed here, so its backend runs nothing else, and found out as if lost.
        conn.terminate()
        unknown(UnknownOutcome("cancelled with its statement out", commit, before_xact, *backend))
        raise
    if xact is None:
        return RACED  # another commit on the entity since the read
    return Decided(applied.outcome, int(xact), before_xact)


async def _insert_key(conn: Any, key_row: tuple[object, ...]) -> bool:
    try:
        await conn.execute(ONE_KEY, *key_row)
    except asyncpg.exceptions.UniqueViolationError:
        return False
    return True


def _arguments(applied: Applied, commit: Commit, origin: int, before_values: Any) -> list[object]:
    """ONE_UPDATE's (with the txid read: ``before_values``) or ONE_INSERT's values."""
    assert commit.after is not None  # every commit writes its entity's row
    after = entity_row(commit.after)
    args: list[object] = list(after)
    if before_values is not None:
        args.append(before_values[_TXID])
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
