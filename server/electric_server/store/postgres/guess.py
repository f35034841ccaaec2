"""The ``pg_guess`` fast path: a lone write decided on what the replica knew, in one round trip.

A lone write (postgres/one_trip.py) needs the entity's committed row, a txid
drawn after that row's commit, the database's clock and whether the lease
holder is live before it can decide; reading them costs a round trip. When
this replica wrote or read the entity last, it knows them already, or can
guess them (postgres/known.py): the row as its own commits, reads and the
feed left it; a spare txid drawn with the last statement; the clock, as a
lower bound of the offset from a reading; the holder live if there is one.
``decide`` runs on those, and ``ONE_UPDATE_GUESSED`` checks all three (the
row's txid unchanged, the clock within ``CLOCK_LAG_MS`` behind the
database's and not ahead, the holder as live as guessed) where
``ONE_UPDATE`` checks the txid.

- **Buys**: the read's round trip, on a lone write to an entity this
  replica wrote or read last (a signal after a signal): one round trip where
  the one-trip path takes two (bench/bench_pg_write.py, bench/bench_dbos.py).
- **Risks**: none of it is trusted: a wrong guess writes nothing and the
  write reads, as without a guess, at the cost of that round trip (counted,
  by which guess: ``electric_postgres_guesses_missed``). Only a commit is
  sent on a guess: a refusal or a no-op on a known row is read first. A spare
  txid is used only above the known row's txid and within ``SPARE_TTL_MS``
  of its draw, so commits of two entities stay near their txids' order.
  After a lost connection nothing known is guessed on (the database may be
  another, after a failover).
- **Checked by**: tests/test_pg_known.py (each wrong guess writes nothing and
  is read again; refusals and no-ops are read), the store suite, and the
  suite run with the switch forced.
- **Switch**: ``pg_guess``; forced, every lone write reads first (two round
  trips).
"""

from __future__ import annotations

from typing import Any

import asyncpg

from ..base import Write, WriteContext
from ..fastpath import switched_on
from ..outcome import Refused, apply_write
from ..rows import entity_row
from .known import MISS_REASONS, Known
from .lone_statement import Decided, Sending, Statement, arguments
from .statements import ONE_UPDATE_GUESSED

__all__ = ["Guess"]

_CHECKED = 3  # where ONE_UPDATE_GUESSED's checks start in its row


class Guess:
    """See the module docstring: guesses from ``known``."""

    __slots__ = ("enabled", "known")

    def __init__(self, known: Known) -> None:
        self.known = known
        self.enabled = False  # until the store opens

    def open(self) -> None:
        self.enabled = switched_on("pg_guess")

    def ready(self) -> bool:
        """Whether a lone write may be tried on a guess: on, and the database's clock was read (the
        entity, the spare txid and the clock's bounds are each write's to check)."""
        return self.enabled and self.known.clock_read

    async def write(self, statement: Statement, write: Write, origin: int, order: Sending) -> Decided | None:
        """The write in one round trip, if the replica knew enough and the write commits; None:
        it is to be read and decided again (nothing was written)."""
        known = self.known
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
        args = arguments(applied, commit, origin, entity_row(before), guess=(now_ms, live))
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
