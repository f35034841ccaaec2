"""The ``sqlite_inline_sync`` fast path: the WAL sync on the event loop while the disk is fast.

The store syncs the WAL after each commit itself (sqlite/wal.py). Where the
sync runs follows how long syncs took lately (a ``SYNC_WEIGHT``-weighted
moving average of every sync, wherever it ran): under ``INLINE_SYNC_S`` on
the loop, else in the sync thread. A batch of one write after another such
batch (light load) syncs on the loop whatever the average, as does a lone
write committed in its caller (sqlite/lone_write.py): the hop would only add
latency.

- **Buys**: the hand-over to the sync thread and back, which costs more than
  it saves on a fast disk (each side waits for the GIL and for the other core
  to wake). On a 2-core VM whose fdatasync took 0.3 ms at the median and
  0.4 ms at p90 under load, syncing on the loop served 8-10 % more signals at
  a lower p50 (bench/bench_http.py).
- **Risks**: a slow sync on the loop holds every other call for its duration.
  That happens once: one sync of 20 ms lifts the average past the threshold,
  so the next ones go to the thread, and the store moves back as the disk
  speeds up again.
- **Checked by**: tests/test_store.py (a fast disk's syncs on the loop, a
  slow one's in the thread; nothing acknowledged, published or readable
  before its sync), and the store suite run with the switch forced.
- **Switch**: ``sqlite_inline_sync``; forced, every sync runs in the sync
  thread, and a write is never committed in its caller (it would sync there).
"""

from __future__ import annotations

from ..fastpath import switched_on

__all__ = ["INLINE_SYNC_S", "SYNC_WEIGHT", "InlineSync"]

INLINE_SYNC_S = 0.003
SYNC_WEIGHT = 0.2


class InlineSync:
    """See the module docstring. ``average_s``: how long syncs took lately (the first ones run on
    the loop); tests set it to stand for a fast or a slow disk."""

    __slots__ = ("average_s", "enabled")

    def __init__(self) -> None:
        self.enabled = False  # until the store opens
        self.average_s = 0.0

    def open(self) -> None:
        self.enabled = switched_on("sqlite_inline_sync")

    def took(self, seconds: float) -> None:
        """A sync took ``seconds``, wherever it ran."""
        self.average_s += SYNC_WEIGHT * (seconds - self.average_s)

    def ready(self) -> bool:
        """Whether the next sync of a batch runs on the loop: on, and syncs were fast lately."""
        return self.enabled and self.average_s < INLINE_SYNC_S
