"""What a replica last knew of the entities it wrote or read, the database's clock and a spare
txid: what a lone write may guess on (postgres/guess.py), never trusted (the database checks it).

- the row and the transaction that wrote it, as this replica's own commits,
  its reads and the feed (the other replicas' commits) left it;
- a *spare* txid: every lone statement draws one more than it uses, and a
  guess is made only with a spare above the known row's txid and drawn less
  than ``SPARE_TTL_MS`` before;
- the clock: the monotonic clock plus the greatest lower bound of the
  offset between the two that a reading gave (the reading, to the
  microsecond, less the local time it arrived), so the guess is never ahead
  of the database's clock, and behind it by the time the best reading took
  to arrive.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable

from ..base import EntityRecord, Ref, StoreCounter

__all__ = ["CLOCK_LAG_MS", "MISS_REASONS", "Known"]

# How far behind the database's clock a guessed clock may be (checked by the statement). A
# lower bound from a reading lags by the time the reading took to arrive (about 0.1 ms): a
# deadline judged with it is judged that much late, never early, and one set with it (a grace's
# end) is set that much before the write commits, as one set on a read is by the write's trip.
CLOCK_LAG_MS = 10
# Which guess the database found wrong: the row (another commit since, or a key already stored),
# the clock, or the holder's liveness.
MISS_REASONS = ("row", "clock", "holder")
# How long a spare txid may wait for its write. Only each entity's txids are promised to increase
# in commit order, but a txid used long after it was drawn would put two entities' commits far
# out of their txids' order; a read's or a batch's txid is used within its statement's time.
SPARE_TTL_MS = 1000
# How many entities a replica remembers (the least recently written are forgotten first).
CAPACITY = 4096


def _monotonic_ms() -> float:
    return time.monotonic_ns() / 1_000_000


class Known:
    """See the module docstring. One per writer, used from its event loop only."""

    __slots__ = ("_capacity", "_clock_offset_ms", "_entities", "_spare", "guesses", "misses")

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        # ref -> (the row as last committed, the id of the transaction that wrote it: None when
        # the feed brought it, which the FeedOrder then counts as read).
        self._entities: OrderedDict[Ref, tuple[EntityRecord, int | None]] = OrderedDict()
        self._spare: tuple[int, float] | None = None  # (txid, when drawn)
        self._clock_offset_ms: float | None = None
        self.guesses = 0  # writes committed on a guess (metrics, tests and benchmarks)
        # Guesses the database found wrong, by which (MISS_REASONS): metrics and tests.
        self.misses = dict.fromkeys(MISS_REASONS, 0)

    def entity(self, ref: Ref) -> tuple[EntityRecord, int | None] | None:
        return self._entities.get(ref)

    def learn(self, record: EntityRecord, xact: int | None) -> None:
        """The entity's row as a commit (or a read) left it; an older one is ignored (txids
        increase per entity in commit order)."""
        ref = record.ref
        known = self._entities.get(ref)
        if known is not None and known[0].txid > record.txid:
            return
        self._entities[ref] = (record, xact)
        self._entities.move_to_end(ref)
        if len(self._entities) > self._capacity:
            self._entities.popitem(last=False)

    def forget(self, ref: Ref) -> None:
        self._entities.pop(ref, None)

    def spare(self, txid: int) -> None:
        """A txid drawn and not used: the newest is kept (the likeliest above a known row's)."""
        if self._spare is None or txid > self._spare[0]:
            self._spare = (txid, _monotonic_ms())

    def take_spare(self, above: int) -> int | None:
        """The spare txid if it is above ``above`` and fresh (it is then used up), else None."""
        spare = self._spare
        if spare is None or spare[0] <= above or _monotonic_ms() - spare[1] > SPARE_TTL_MS:
            return None
        self._spare = None
        return spare[0]

    def clock(self, db_ms: float) -> None:
        """A reading of the database's clock (ms, to the microsecond), just received: it was taken
        no later than now, so its offset from now is a lower bound of the clocks' offset."""
        offset = db_ms - _monotonic_ms()
        if self._clock_offset_ms is None or offset > self._clock_offset_ms:
            self._clock_offset_ms = offset

    def now_ms(self, not_before: int) -> int | None:
        """The guessed clock, no earlier than ``not_before`` (the known row's time, so an entity's
        times do not go back); None until a reading."""
        if self._clock_offset_ms is None:
            return None
        return max(int(_monotonic_ms() + self._clock_offset_ms), not_before)

    @property
    def clock_read(self) -> bool:
        """Whether the database's clock was read (since the last reset)."""
        return self._clock_offset_ms is not None

    def shift_clock(self, ms: float) -> None:
        """For tests: the guessed clock ``ms`` off the database's (a stalled process, a stepped clock)."""
        if self._clock_offset_ms is not None:
            self._clock_offset_ms += ms

    def age_spare(self, ms: float) -> None:
        """For tests: the spare txid drawn ``ms`` earlier than it was."""
        if self._spare is not None:
            self._spare = (self._spare[0], self._spare[1] - ms)

    def reset(self) -> None:
        """Forget everything: a connection was lost (the store's database may be another now)."""
        self._entities.clear()
        self._spare = None
        self._clock_offset_ms = None

    def missed(self, ref: Ref, reasons: Iterable[str]) -> None:
        """The database found guesses wrong (``reasons``, of MISS_REASONS): what they were is read
        again (the row, or the clock; a holder's liveness is read with the row)."""
        for reason in reasons:
            self.misses[reason] += 1
            if reason == "clock":
                self._clock_offset_ms = None
            else:
                self._entities.pop(ref, None)

    def counters(self) -> tuple[StoreCounter, ...]:
        """What the guesses did, for the server's metrics (docs/operations.md)."""
        return (
            StoreCounter(
                "electric_postgres_guessed_writes",
                "Lone writes committed in one round trip, on what the replica knew of the entity.",
                samples=(((), self.guesses),),
            ),
            StoreCounter(
                "electric_postgres_guesses_missed",
                "Guesses of lone writes the database found wrong, by which (row, clock, holder): "
                "each such write then read the entity, a round trip more.",
                ("reason",),
                tuple(((reason,), count) for reason, count in self.misses.items()),
            ),
        )
