"""The SQLite store's WAL: the sync that makes each commit durable, and when to checkpoint.

``synchronous=FULL`` by default: an acknowledged append survives a crash or
power loss. SQLite runs at NORMAL and the store syncs the WAL after each
commit itself (``sync``), so the commit (page-cache writes only) runs on the
event loop; a commit is acknowledged, published and readable only once
synced. Where the sync runs, on the loop or in the sync thread, is the
``sqlite_inline_sync`` fast path's to say (sqlite/inline_sync.py). With
EXTRA, SQLite syncs inside COMMIT, so commits run in the writer thread.

The store checkpoints the WAL itself, in the writer thread (sqlite/writer.py),
as often as SQLite would (its default wal_autocheckpoint is 1,000 pages):
after ``CHECKPOINT_FRAMES`` frames appended since the last checkpoint, as the
``wal_index`` seam counts them (fastpaths/wal_index.py). SQLite's own
automatic checkpoint is off in every mode: it runs inside COMMIT, and when it
fails (a full disk) COMMIT reports the failure although the transaction was
committed, so the store could not tell whom to acknowledge.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...fastpaths.wal_index import Estimate, FrameCounter, frame_counter
from ..faults import Faults
from .inline_sync import INLINE_SYNC_S, InlineSync

__all__ = ["CHECKPOINT_FRAMES", "INLINE_SYNC_S", "RESUME_ROOM", "Wal"]

CHECKPOINT_FRAMES = 1000
# What a disk that was full must have room for before writes resume (sqlite/writer.py): about
# what the WAL grows between two checkpoints.
RESUME_ROOM = CHECKPOINT_FRAMES * 4096


class Wal:
    """See the module docstring: the WAL of the database at ``path``."""

    __slots__ = (
        "_committed",
        "_faults",
        "_fd",
        "_frames",
        "_frames_since_checkpoint",
        "_sync_thread",
        "_synced",
        "_syncing",
        "checkpoints",
        "inline",
        "path",
        "synchronous",
    )

    def __init__(self, path: Path, synchronous: str, faults: Faults) -> None:
        self.path = path
        self.synchronous = synchronous
        self._faults = faults
        self.inline = InlineSync()
        # With synchronous=FULL the store syncs the WAL itself (see sync): the file it syncs,
        # batches committed and batches synced, and the sync in flight.
        self._fd: int | None = None
        self._sync_thread: ThreadPoolExecutor | None = None
        self._committed = 0
        self._synced = 0
        self._syncing: asyncio.Future[None] | None = None
        self._frames_since_checkpoint = 0
        self._frames: FrameCounter = Estimate()  # until open
        # Checkpoints run: for tests and benchmarks.
        self.checkpoints = 0

    def open(self) -> None:
        """Once the writer's connection is open: what syncs and checkpoints need."""
        if self.synchronous == "FULL":
            self._fd = os.open(f"{self.path}-wal", os.O_RDONLY | os.O_CLOEXEC)
            self._sync_thread = ThreadPoolExecutor(1, thread_name_prefix="electric-sqlite-sync")
        self._frames = frame_counter(self.path)
        self.inline.open()

    def close(self) -> None:
        if self._sync_thread is not None:
            self._sync_thread.shutdown(wait=True)
            self._sync_thread = None
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        self._frames.close()
        self._frames = Estimate()

    # -- what tests, benchmarks and the fast paths read -----------------------------------------

    @property
    def syncs_itself(self) -> bool:
        """Whether the store syncs the WAL after each commit (FULL), rather than SQLite."""
        return self._fd is not None

    @property
    def fd(self) -> int | None:
        """The WAL file the store syncs (None: SQLite syncs); tests close it to fail a sync."""
        return self._fd

    @property
    def committed(self) -> int:
        """Batches committed (not all of them synced yet)."""
        return self._committed

    @property
    def synced(self) -> int:
        """Batches committed and synced."""
        return self._synced

    @property
    def frames_since_checkpoint(self) -> int:
        return self._frames_since_checkpoint

    @property
    def checkpoint_due(self) -> bool:
        return self._frames_since_checkpoint >= CHECKPOINT_FRAMES

    def use_sync_thread(self, executor: ThreadPoolExecutor) -> None:
        """Run syncs in ``executor`` from now on, the old sync thread shut down (for tests that
        hold a sync at the door)."""
        if self._sync_thread is not None:
            self._sync_thread.shutdown()
        self._sync_thread = executor

    # -- syncs ---------------------------------------------------------------------------------

    def counted(self, writes: int) -> None:
        """A batch of this many writes was committed (not yet synced)."""
        self._committed += 1
        self._frames_since_checkpoint = self._frames.appended(self._frames_since_checkpoint, writes)

    def sync_here(self) -> None:
        """fdatasync the WAL on this thread: every commit so far is durable after it."""
        target = self._committed
        self._fdatasync()
        self._synced = target

    def _fdatasync(self) -> None:
        """fdatasync the WAL on the calling thread (the loop's or the sync thread), timed."""
        assert self._fd is not None
        started = time.perf_counter()
        os.fdatasync(self._fd)
        self.inline.took(time.perf_counter() - started)

    def syncs_here(self, lone: bool) -> bool:
        """Whether the next sync runs on the loop (``sync_here``), else in the sync thread
        (``sync_in_thread``).

        With synchronous=FULL SQLite would sync inside COMMIT; the store runs
        SQLite at NORMAL and syncs the WAL after each commit instead, which is the
        same guarantee (the WAL holds every commit since the last checkpoint, and
        a checkpoint syncs it first). On the loop when the ``sqlite_inline_sync``
        fast path is ready, or for a batch of one after another (``lone``: light
        load, where the hop would only add latency); else in the sync thread, so
        the loop keeps serving while the disk works and the writes that arrive
        meanwhile form the next batch. A commit is acknowledged, published to
        watchers and shown to reads (``durable``) only after its sync.
        """
        inline = self.inline
        return inline.ready() or (lone and inline.enabled)

    async def sync_in_thread(self) -> None:
        """``sync_here``, in the sync thread: the loop serves meanwhile, and a read that saw a
        commit it covers waits for it (``durable``)."""
        assert self._sync_thread is not None
        target = self._committed
        loop = asyncio.get_running_loop()
        self._syncing = done = loop.create_future()
        try:
            await loop.run_in_executor(self._sync_thread, self._fdatasync)
        except BaseException as exc:
            done.set_exception(
                exc if isinstance(exc, Exception) else RuntimeError("the WAL sync was cancelled")
            )
            done.exception()  # marked retrieved: a reader waiting on it gets it raised
            raise
        finally:
            self._syncing = None
        self._synced = target
        done.set_result(None)

    async def durable(self) -> None:
        """Return once everything a read may have seen is durable.

        A read sees what SQLite has committed, and a commit precedes its WAL sync:
        a read that ran between the two waits for that sync, so nobody is shown a
        change that a power loss could still take back.
        """
        if self._synced < self._committed:
            if self._syncing is not None:
                try:
                    await asyncio.shield(self._syncing)
                except OSError as exc:
                    raise self._faults.stop(exc, "a WAL sync") from exc
            elif self._faults.failed is not None:  # what the read saw may never reach the disk
                raise self._faults.failed.again()

    # -- checkpoints (run by the writer: sqlite/writer.py) ------------------------------------

    def checkpointing(self) -> int:
        """A checkpoint is about to run: count from the WAL as it is now. Returns the count
        before, for ``checkpoint_failed``."""
        counted = self._frames_since_checkpoint
        self.checkpointed()
        self.checkpoints += 1
        return counted

    def checkpointed(self) -> None:
        self._frames_since_checkpoint = 0
        self._frames.checkpointed()

    def checkpoint_failed(self, counted: int) -> None:
        self._frames_since_checkpoint = counted  # still due
