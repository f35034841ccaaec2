"""The SQLite lone write: a write alone commits in its caller's task, skipping the writer task.

At light load a write has nobody to share a commit with, and handing it to
the writer task and back costs two turns of the event loop. So when
``LoneWrite.ready()``, the committer runs the write's batch of one right in
the caller's task (store/committer.py): its commit and its WAL sync on the
loop, its answer and its publication as any batch's.

- **Buys**: those two turns of the loop, on the latency path of a write at
  light load (a signal, a worker's step record): bench/bench_signal.py's
  one-caller p50.
- **Risks**: the batch run in the caller must never wait inside (nothing may
  run between its commit and its sync, and a cancelled caller must not cut
  it), must not share the writer's connection mid-statement, and must not
  race the writer task or a sync in flight. And under load it would give
  every write its own fsync. ``ready()`` holds each of these off, asking the
  part that owns the state: the committer (idle, the last batch alone), the
  WAL (the store syncs it, on the loop, and no checkpoint is due), the fault
  policy (writes not refused), the writer (its connection free), and the
  loop (nothing else ready to run: light load). New state that can hold a
  write back answers here.
- **Checked by**: tests/test_store.py (a lone write is published from its
  caller's task; with the fallback, from the writer task), and the store
  suite run with ``ELECTRIC_FORCE_FALLBACKS=ready_queue``.
- **Switch**: the ``ready_queue`` seam (fastpaths/ready_queue.py), which says
  whether anything else is ready on the loop: its fallback is never empty,
  so every write then goes through the writer task. The
  ``sqlite_inline_sync`` switch turns it off too (the write syncs where it
  commits).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sized

from ...fastpaths.ready_queue import BUSY, ready_queue
from ..committer import GroupCommitter
from ..faults import Faults
from .wal import Wal
from .writer import SQLiteWriter

__all__ = ["LoneWrite"]


class LoneWrite:
    """See the module docstring."""

    __slots__ = ("_committer", "_faults", "_loop_ready", "_wal", "_writer")

    def __init__(self, committer: GroupCommitter, wal: Wal, faults: Faults, writer: SQLiteWriter) -> None:
        self._committer = committer
        self._wal = wal
        self._faults = faults
        self._writer = writer
        # The loop's callbacks ready to run, from the ready_queue seam once the store is open.
        self._loop_ready: Sized = BUSY

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop_ready = ready_queue(loop)

    def close(self) -> None:
        self._loop_ready = BUSY

    def ready(self) -> bool:
        """Light load, and nothing in the store that a write committed here could race. Under
        load some other call is always about to run on the loop (at 64 concurrent callers, 99 %
        of writes find two or more callbacks ready; one caller's find none), and those calls'
        writes must wait for the writer to batch them."""
        committer, wal = self._committer, self._wal
        return (
            committer.idle()  # no batch running or queued, the store open
            and committer.last_batch_writes <= 1  # the last batch was alone too
            and wal.syncs_itself  # FULL: commits run on the loop, and the store syncs
            and wal.inline.enabled  # ... and may sync on the loop
            and not wal.checkpoint_due  # the writer task checkpoints after its next batch
            and self._faults.refusal is None
            and not self._writer.busy()  # no statement aside, checkpoint or probe on the connection
            and not self._loop_ready  # nothing else to run on the loop
        )
