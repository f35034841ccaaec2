"""A lone write's statement that commits by itself (postgres/one_trip.py, postgres/guess.py): its
arguments, what it tells the replica's knowledge, and what is done when its outcome is unknown.

The statement is its own COMMIT, so a connection lost (or a caller cancelled)
while it is out leaves its outcome unknown: ``Statement.commit`` raises
``UnknownOutcome`` (a ``DatabaseUnavailable``: the caller's retry with the
same idempotency key finds out) and hands what to find out to the writer,
which ends that backend and looks for the commit's feed row
(``one_trip.find_out``).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import asyncpg

from ..base import Commit, DatabaseUnavailable, WriteOutcome
from ..outcome import Applied
from ..rows import ENTITY_COLUMNS, entity_row
from .faults import LOST, lost_reason
from .known import Known
from .statements import ONE_KEY, ONE_WRITE_COLUMNS

__all__ = ["RACED", "Decided", "Sending", "Statement", "UnknownOutcome", "arguments", "insert_key"]

_RECORD = len(ENTITY_COLUMNS)
_EVENT_WIDTH, _KEY_WIDTH, _ = ONE_WRITE_COLUMNS
_NO_KEY = (None,) * _KEY_WIDTH
_NO_BEFORE = (None,) * (_RECORD - 2)
_TXID = ENTITY_COLUMNS.index("txid")


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


class Sending(Protocol):
    """Where a lone write says which txid its committing statement carries (the FeedOrder's)."""

    def sending(self, txid: int) -> None: ...
    def unsent(self, txid: int) -> None: ...


class Statement:
    """A statement that commits by itself, on ``conn`` (its backend: pid and start): what it tells
    ``known``, and what is done when its outcome cannot be known (``unknown``)."""

    __slots__ = ("_backend", "_conn", "_known", "_timeout_s", "_unknown")

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


async def insert_key(conn: Any, key_row: tuple[object, ...]) -> bool:
    """A write that commits nothing but remembers its answer; False: a racing retry stored it."""
    try:
        await conn.execute(ONE_KEY, *key_row)
    except asyncpg.exceptions.UniqueViolationError:
        return False
    return True


def arguments(
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
