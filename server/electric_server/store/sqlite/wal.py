"""The SQLite store's WAL: the sync that makes each commit durable, and the checkpoints.

``synchronous=FULL`` by default: an acknowledged append survives a crash or
power loss. SQLite runs at NORMAL and the store syncs the WAL after each
commit itself (``_sync``), so the commit (page-cache writes only) runs on the
event loop; a commit is acknowledged, published and readable only once
synced. A sync the disk answers quickly runs on the loop too; a slow disk's
runs in the sync thread, so its round trip does not hold the loop (``_sync``).
With EXTRA, SQLite syncs inside COMMIT, so commits run in the writer thread.

The store checkpoints the WAL itself, in the writer thread
(``_checkpoint``), as often as SQLite would (its default wal_autocheckpoint
is 1,000 pages): after ``CHECKPOINT_FRAMES`` frames appended since the last
checkpoint, as the ``wal_index`` seam counts them (internals/wal_index.py).
SQLite's own automatic checkpoint is off in every mode: it runs inside
COMMIT, and when it fails (a full disk) COMMIT reports the failure although
the transaction was committed, so the store could not tell whom to
acknowledge.

While the disk is full (store/sqlite_faults.py), the writer tries again
every ``disk_full_retry_s`` (``_try_again``): writes resume once
``RESUME_ROOM`` bytes fit on the disk (about what the WAL grows between two
checkpoints: a byte freed is not room enough, and writes refused again at
once would only make the log flap), the checkpoint succeeds if one is due
(else the next batch would only fail it again), and a commit of one page
does.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...internals.wal_index import Estimate, FrameCounter, frame_counter
from .faults import SQLiteFaults, roll_back
from .schema import SET_NEXT_TXID

__all__ = ["CHECKPOINT_FRAMES", "RESUME_ROOM", "SQLiteWal"]

CHECKPOINT_FRAMES = 1000
RESUME_ROOM = CHECKPOINT_FRAMES * 4096
# While syncs take less than this lately (a SYNC_WEIGHT-weighted moving average), they run on the
# loop; slower ones in the sync thread. The hand-over to the thread and back costs more than it
# saves on a disk this fast: each side waits for the GIL and for the other core to wake. On a
# 2-core VM whose fdatasync took 0.3 ms at the median and 0.4 ms at p90 under load, syncing on the
# loop served 8-10 % more signals at a lower p50 (bench/bench_http.py). A disk slower than this
# keeps the loop serving while it works; a slow sync on the loop holds it that once and lifts
# the average (one of 20 ms lifts it past this), so the next ones go to the thread.
INLINE_SYNC_S = 0.003
SYNC_WEIGHT = 0.2


class SQLiteWal(SQLiteFaults):
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
    _next_txid: int  # the writer's (sqlite_writer.py)

    def __init__(self) -> None:
        super().__init__()
        # With synchronous=FULL the store syncs the WAL itself (see _sync): the
        # file it syncs, batches committed and batches synced, and the sync in flight.
        self._wal_fd: int | None = None
        self._sync_executor: ThreadPoolExecutor | None = None
        self._committed = 0
        self._synced = 0
        self._syncing: asyncio.Future[None] | None = None
        # How long syncs took lately (see INLINE_SYNC_S); the first ones run on the loop.
        self._sync_seconds = 0.0
        self._frames_since_checkpoint = 0
        self._frames: FrameCounter = Estimate()  # until open: see _open_wal
        # Checkpoints run: exposed for tests and benchmarks.
        self.checkpoints = 0

    def _open_wal(self) -> None:
        """Once the writer's connection is open: what syncs and checkpoints need."""
        if self.synchronous == "FULL":
            self._wal_fd = os.open(f"{self.path}-wal", os.O_RDONLY | os.O_CLOEXEC)
            self._sync_executor = ThreadPoolExecutor(1, thread_name_prefix="electric-sqlite-sync")
        self._frames = frame_counter(self.path)  # the store checkpoints itself (see _checkpoint)

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
        target = self._committed
        self._fdatasync()
        self._synced = target

    def _fdatasync(self) -> None:
        """fdatasync the WAL on the calling thread, timed (the loop's or the sync thread)."""
        assert self._wal_fd is not None
        started = time.perf_counter()
        os.fdatasync(self._wal_fd)
        took = time.perf_counter() - started
        self._sync_seconds += SYNC_WEIGHT * (took - self._sync_seconds)

    async def _sync(self, *, inline: bool) -> None:
        """Make every commit so far durable: fdatasync the WAL.

        With synchronous=FULL SQLite would sync inside COMMIT; the store runs
        SQLite at NORMAL and syncs the WAL here instead, which is the same
        guarantee (the WAL holds every commit since the last checkpoint, and a
        checkpoint syncs it first).

        Where it runs depends on how long syncs take. On a disk that answers
        within INLINE_SYNC_S it runs right here, on the loop: the hand-over to
        the sync thread and back would cost the loop more than the sync does.
        On a slower disk a burst's sync runs in the sync thread, so the loop
        keeps serving while the disk works and the writes that arrive meanwhile
        form the next batch; a batch of one write after another such batch
        (``inline``: light load that did not qualify for _write_now, e.g. a
        worker session's write_many) syncs here all the same, where the hop
        would only add latency. Each sync's duration, wherever it ran, updates
        the average that decides, so the store moves between the two as the
        disk speeds up or slows down. A commit is acknowledged, published to
        watchers and shown to reads (_durable) only after its sync.
        """
        if inline or self._sync_seconds < INLINE_SYNC_S:
            self._sync_here()
            return
        assert self._wal_fd is not None
        assert self._sync_executor is not None
        target = self._committed
        loop = asyncio.get_running_loop()
        self._syncing = done = loop.create_future()
        try:
            await loop.run_in_executor(self._sync_executor, self._fdatasync)
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
        if self._synced < self._committed:
            if self._syncing is not None:
                try:
                    await asyncio.shield(self._syncing)
                except OSError as exc:
                    raise self._fail(exc, "a WAL sync") from exc
            elif self._failed is not None:  # what the read saw may never reach the disk
                raise self._failed.again()

    async def _checkpoint(self) -> None:
        """Copy the WAL back into the database file, in the writer thread.

        SQLite's own automatic checkpoint would run inside a COMMIT, on the
        loop, with two fsyncs and megabytes of copying; here the loop keeps
        serving and writes queue up meanwhile. PASSIVE: readers are never
        blocked. Once the WAL is fully copied, the next commit rewrites it from
        the start, so the file stops growing and its blocks are reused. If it
        fails (a full disk), nothing is lost: the WAL still holds every commit.
        """
        counted = self._frames_since_checkpoint
        self._checkpointed()
        self.checkpoints += 1
        conn = self._wconn
        assert conn is not None
        loop = asyncio.get_running_loop()

        def checkpoint() -> None:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()  # fetched: the statement ends

        try:
            async with self._conn_lock:
                await loop.run_in_executor(self._executor, checkpoint)
        except BaseException:
            self._frames_since_checkpoint = counted  # still due
            raise

    def _checkpointed(self) -> None:
        self._frames_since_checkpoint = 0
        self._frames.checkpointed()

    # -- a full disk: trying again ------------------------------------------------------

    async def _wait_for_room(self, wakeup: asyncio.Event) -> None:
        """While the disk is full, try again every ``disk_full_retry_s`` until it works, or
        ``wakeup`` is set (the store closes or failed: no write is queued meanwhile)."""
        while self._refusal is not None and self._failed is None and not wakeup.is_set():
            try:
                await asyncio.wait_for(wakeup.wait(), self.disk_full_retry_s)
            except TimeoutError:
                await self._try_again()

    async def _try_again(self) -> None:
        loop = asyncio.get_running_loop()
        due = self._frames_since_checkpoint >= CHECKPOINT_FRAMES
        try:
            async with self._conn_lock:
                await loop.run_in_executor(self._executor, self._probe, due)
        except Exception as exc:
            self._fault(exc, "a retry after the disk was full")  # still full, or worse
            return
        if due:
            self._checkpointed()
        self._resume()

    def _probe(self, checkpoint: bool) -> None:
        """Room for ``RESUME_ROOM`` bytes, the checkpoint if due, then a commit of one
        page (the next txid, unchanged): what the next batches need room for."""
        conn = self._wconn
        assert conn is not None
        scratch = self.path.with_name(f".{self.path.name}.room")
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESUME_ROOM)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            # A file system that cannot tell this way (EOPNOTSUPP): the commit below does.
        finally:
            os.close(fd)
            scratch.unlink()
        if checkpoint:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(SET_NEXT_TXID, (self._next_txid,))
            conn.execute("COMMIT")
        except BaseException:
            roll_back(conn)
            raise
