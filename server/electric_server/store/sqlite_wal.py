"""The SQLite store's WAL: the sync that makes each commit durable, and the checkpoints.

``synchronous=FULL`` by default: an acknowledged append survives a crash or
power loss. SQLite runs at NORMAL and the store syncs the WAL after each
commit itself (``_sync``), so the commit (page-cache writes only) runs on the
event loop and the disk's round trip does not hold it; a commit is
acknowledged, published and readable only once synced. With EXTRA, SQLite
syncs inside COMMIT, so commits run in the writer thread, and SQLite
checkpoints as it always does.

Otherwise the store checkpoints the WAL itself, in the writer thread
(``_checkpoint``), as often as SQLite would (its default wal_autocheckpoint
is 1,000 pages): after ``CHECKPOINT_FRAMES`` frames appended since the last
checkpoint, as the ``wal_index`` seam counts them (internals/wal_index.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..internals.wal_index import Estimate, FrameCounter, frame_counter

__all__ = ["CHECKPOINT_FRAMES", "SQLiteWal"]

CHECKPOINT_FRAMES = 1000


class SQLiteWal:
    """The WAL half of ``SQLiteStore``: syncing it after commits and checkpointing it."""

    # The store's (store/sqlite.py): the database, whether commits run on the loop,
    # and the writer's connection, its thread and the lock that keeps the
    # connection unshared mid-statement.
    path: Path
    synchronous: str
    _commits_on_loop: bool
    _wconn: sqlite3.Connection | None
    _executor: ThreadPoolExecutor | None
    _conn_lock: asyncio.Lock

    def __init__(self) -> None:
        super().__init__()
        # With synchronous=FULL the store syncs the WAL itself (see _sync): the
        # file it syncs, batches committed and batches synced, and the sync in flight.
        self._wal_fd: int | None = None
        self._sync_executor: ThreadPoolExecutor | None = None
        self._committed = 0
        self._synced = 0
        self._syncing: asyncio.Future[None] | None = None
        self._frames_since_checkpoint = 0
        self._frames: FrameCounter = Estimate()  # until open: see _open_wal
        # Checkpoints run: exposed for tests and benchmarks.
        self.checkpoints = 0

    def _open_wal(self) -> None:
        """Once the writer's connection is open: what syncs and checkpoints need."""
        if self.synchronous == "FULL":
            self._wal_fd = os.open(f"{self.path}-wal", os.O_RDONLY | os.O_CLOEXEC)
            self._sync_executor = ThreadPoolExecutor(1, thread_name_prefix="electric-sqlite-sync")
        if self._commits_on_loop:  # the store checkpoints itself (see _checkpoint)
            self._frames = frame_counter(self.path)

    def _close_wal(self) -> None:
        if self._sync_executor is not None:
            self._sync_executor.shutdown(wait=True)
            self._sync_executor = None
        if self._wal_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._wal_fd)
            self._wal_fd = None
        self._frames.close()
        self._frames = Estimate()

    def _counted(self, writes: int) -> None:
        """A batch of this many writes was committed (not yet synced)."""
        self._committed += 1
        self._frames_since_checkpoint = self._frames.appended(self._frames_since_checkpoint, writes)

    def _sync_here(self) -> None:
        """fdatasync the WAL on this thread: every commit so far is durable after it."""
        assert self._wal_fd is not None
        target = self._committed
        os.fdatasync(self._wal_fd)
        self._synced = target

    async def _sync(self, *, inline: bool) -> None:
        """Make every commit so far durable: fdatasync the WAL.

        With synchronous=FULL SQLite would sync inside COMMIT; the store runs
        SQLite at NORMAL and syncs the WAL here instead, which is the same
        guarantee (the WAL holds every commit since the last checkpoint, and a
        checkpoint syncs it first). A burst's sync runs in the sync thread, so the
        loop keeps serving while the disk works and the writes that arrive
        meanwhile form the next batch; a batch of one write after another such
        batch (light load that did not qualify for _write_now, e.g. a worker
        session's write_many) syncs right here, where the thread hop would only
        add latency. A
        commit is acknowledged, published to watchers and shown to reads
        (_durable) only after its sync.
        """
        if inline:
            self._sync_here()
            return
        assert self._wal_fd is not None
        assert self._sync_executor is not None
        target = self._committed
        loop = asyncio.get_running_loop()
        self._syncing = done = loop.create_future()
        try:
            await loop.run_in_executor(self._sync_executor, os.fdatasync, self._wal_fd)
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

    async def _durable(self) -> None:
        """Return once everything a read may have seen is durable.

        A read sees what SQLite has committed, and a commit precedes its WAL sync
        (_sync): a read that ran between the two waits for that sync, so nobody
        is shown a change that a power loss could still take back.
        """
        if self._synced < self._committed and self._syncing is not None:
            await asyncio.shield(self._syncing)

    async def _checkpoint(self) -> None:
        """Copy the WAL back into the database file, in the writer thread.

        SQLite's own automatic checkpoint would run inside a COMMIT, on the
        loop, with two fsyncs and megabytes of copying; here the loop keeps
        serving and writes queue up meanwhile. PASSIVE: readers are never
        blocked. Once the WAL is fully copied, the next commit rewrites it from
        the start, so the file stops growing and its blocks are reused.
        """
        self._frames_since_checkpoint = 0
        self.checkpoints += 1
        self._frames.checkpointed()
        conn = self._wconn
        assert conn is not None
        loop = asyncio.get_running_loop()

        def checkpoint() -> None:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()  # fetched: the statement ends

        async with self._conn_lock:
            await loop.run_in_executor(self._executor, checkpoint)
