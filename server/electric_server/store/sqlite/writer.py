"""The SQLite store's writer: the one connection that writes the file, its thread, and how a batch
runs on it (the group committer's backend, store/transaction.py).

The connection is used on the event loop (batches: their commits run there
unless SQLite syncs inside them, EXTRA) and in the writer thread (opening and
closing the file, checkpoints, statements aside from the batches, the probe
of a full disk); its lock keeps it unshared mid-statement.

Opening, the writer looks at the files first (sqlite/damage.py) and refuses
damaged ones with ``DamagedStore``, unless ``accept_data_loss``: then it keeps
a copy of the damaged WAL, opens what SQLite can read, folds it into the
database (so the next start finds a whole WAL) and logs what was dropped.
Closing, it folds the WAL into the database and records the clean shutdown.

While the disk is full (store/faults.py), the committer tries again every
``retry_s`` with ``probe_room``: writes resume once ``RESUME_ROOM`` bytes fit
on the disk (about what the WAL grows between two checkpoints: a byte freed
is not room enough, and writes refused again at once would only make the log
flap), the checkpoint succeeds if one is due (else the next batch would only
fail it again), and a commit of one page does.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import sqlite3
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from ...clock import Clock
from ..base import DamagedStore, Write
from ..faults import Faults
from ..hub import Hub
from .damage import inspect_files, keep_damaged_wal
from .faults import DAMAGED_REMEDY, roll_back
from .schema import SELECT_NEXT_TXID, SET_NEXT_TXID, migrate
from .transaction import EntityCache, SQLiteTransaction
from .txids import Txids
from .wal import RESUME_ROOM, Wal
from .walcheck import wal_path

__all__ = ["SQLiteWriter", "connect"]

# A WAL's header; its frames follow it.
_WAL_HEADER_BYTES = 32

log = logging.getLogger(__name__)

T = TypeVar("T")


def connect(path: Path, synchronous: str, readonly: bool = False, alone: bool = False) -> sqlite3.Connection:
    """A connection to the database at ``path``: the writer's, or a reader's. ``alone`` (read-only):
    nothing else may write the file (this server holds its data directory's lock), so a WAL with
    no frame in it (one a failed opening left) is as good as none."""
    if readonly:
        # SQLite would create a missing WAL (empty), even read-only, hiding its loss from the
        # next start (sqlite/damage.py); without one there is nothing to read in it anyway. Immutable,
        # SQLite needs no shared memory: it reads a file on a full disk.
        wal = wal_path(path)
        no_frames = not wal.exists() or (alone and wal.stat().st_size <= _WAL_HEADER_BYTES)
        immutable = "&immutable=1" if no_frames else ""
        # As a URI: as_uri() escapes what a file name may hold and a URI may not ('?', '#', '%').
        uri = f"{path.resolve().as_uri()}?mode=ro{immutable}"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=10000")
        return conn
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    # The store checkpoints itself (sqlite/wal.py), so no commit ever reports a checkpoint's failure.
    conn.execute("PRAGMA wal_autocheckpoint=0")
    # Up to 64 MiB of pages a connection (SQLite's default: 2 MiB): a write touches its
    # entity's row and the tail of its stream, and once a thousand entities' tails outgrow
    # 2 MiB each batch reads pages back from the WAL (2.6 reads a signal after 25 s of
    # bench_http's load, 1.3 with this).
    conn.execute("PRAGMA cache_size=-65536")
    # FULL is kept by syncing the WAL after each commit (sqlite/wal.py), not inside COMMIT.
    conn.execute(f"PRAGMA synchronous={'NORMAL' if synchronous == 'FULL' else synchronous}")
    conn.execute("PRAGMA busy_timeout=10000")
    return conn


class _Session:
    """A batch's turn on the connection: its lock, taken without a wait when it is free."""

    __slots__ = ("_writer",)

    def __init__(self, writer: SQLiteWriter) -> None:
        self._writer = writer

    async def __aenter__(self) -> SQLiteWriter:
        await self._writer.lock.acquire()
        return self._writer

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._writer.lock.release()


class SQLiteWriter:
    """See the module docstring."""

    durable_step = "a WAL sync"
    holds = False  # one writer: its batches run in order

    __slots__ = (
        "_cache",
        "_clock",
        "_commits_on_loop",
        "_faults",
        "_hub",
        "_live",
        "_session",
        "_thread",
        "conn",
        "lock",
        "path",
        "synchronous",
        "txids",
        "wal",
    )

    def __init__(
        self,
        path: Path,
        synchronous: str,
        *,
        hub: Hub,
        faults: Faults,
        wal: Wal,
        clock: Clock,
        live: Collection[str],
    ) -> None:
        self.path = path
        self.synchronous = synchronous
        self._hub = hub
        self._faults = faults
        self.wal = wal
        self._clock = clock
        self._live = live  # the live sessions a write judges lease holders by
        self.txids = Txids(path)
        self._cache = EntityCache()
        self.conn: sqlite3.Connection | None = None
        self._thread: ThreadPoolExecutor | None = None
        self.lock = asyncio.Lock()
        # Commits run on the loop unless SQLite itself must sync inside them (EXTRA).
        self._commits_on_loop = synchronous != "EXTRA"
        self._session = _Session(self)

    # -- the connection and its thread ----------------------------------------------------------

    def busy(self) -> bool:
        """Whether a statement holds the connection (a batch, a checkpoint, a statement aside)."""
        return self.lock.locked()

    async def open(self, accept_data_loss: bool) -> None:
        """Start the writer thread and open the file there (see the module docstring)."""
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="electric-sqlite-writer")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._thread, self._open, accept_data_loss)
        except BaseException:
            self.abandon()
            raise

    def _open(self, accept_data_loss: bool) -> None:
        found = inspect_files(self.path)
        if found.problems:
            if not accept_data_loss:
                raise DamagedStore(f"the store in {self.path.parent}", found.problems, DAMAGED_REMEDY)
            keep_damaged_wal(self.path)
            for problem in found.problems:
                log.warning("starting on a damaged store (--accept-data-loss): %s", problem)
        conn = self.conn = connect(self.path, self.synchronous)
        migrate(conn)
        row = conn.execute(SELECT_NEXT_TXID).fetchone()
        stored = int(row[0]) if row else 1
        next_txid = self.txids.first(found, stored)
        if found.problems:
            # What SQLite could read goes into the database, and the WAL restarts empty, so
            # the frames it dropped are not found (and refused) again at the next start.
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        self.txids.start(next_txid)  # recorded as running: until a clean close, a crash is assumed

    def abandon(self) -> None:
        """After a failed open: let go of what it opened."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self._thread is not None:
            self._thread.shutdown(wait=False)
            self._thread = None

    async def close(self) -> None:
        """Fold the WAL into the database and close, in the writer thread; the thread ends."""
        if self._thread is None:
            return
        await asyncio.get_running_loop().run_in_executor(self._thread, self._close)
        self._thread.shutdown(wait=True)
        self._thread = None

    def _close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is None:
            return
        if self._faults.failed is None:  # after a failure for good, the disk gets nothing more
            try:
                # Fold the WAL into the database, so the file is complete on its own.
                busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            except sqlite3.Error as exc:
                log.warning(
                    "the WAL could not be folded into the database at close (%s): it is kept, and the "
                    "next start reads it",
                    exc,
                )
            else:
                if not busy:  # folded whole (a reader's snapshot, e.g. `electric verify`'s, can hold it)
                    self.txids.closed_cleanly()
        try:
            conn.close()
        except sqlite3.Error as exc:
            log.warning("closing the database failed: %s", exc)

    async def _in_thread(self, fn: Callable[[], None]) -> None:
        """``fn`` in the writer thread, by a caller that holds the lock."""
        await asyncio.get_running_loop().run_in_executor(self._thread, fn)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` with the connection, in the writer thread, once the connection is free (for
        statements aside from batches, and for tests and tools that ask the writer's connection)."""
        conn = self.conn
        if conn is None:  # closed; or never opened, the disk being full at the start (sqlite/store.py)
            refusal = self._faults.refusal
            raise refusal.again() if refusal is not None else RuntimeError("store is closed")
        async with self.lock:
            return await asyncio.get_running_loop().run_in_executor(self._thread, fn, conn)

    async def aside(self, sql: str, args: tuple[object, ...], what: str) -> int:
        """One statement outside the entities' batches (its own transaction, synced with the next
        batch's WAL sync); returns the rows it changed."""
        try:
            return await self.run(lambda conn: conn.execute(sql, args).rowcount)
        except Exception as exc:  # e.g. a full disk: a write like any other
            error = self._faults.write_fault(exc, what)
            if error is exc:
                raise
            raise error from exc

    # -- the committer's backend ----------------------------------------------------------------

    def hold(self, writes: Sequence[Write]) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def session(self) -> _Session:
        return self._session

    async def begin(self, writes: Sequence[Write]) -> SQLiteTransaction:
        conn = self.conn
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        in_thread = None if self._commits_on_loop else self._in_thread
        return SQLiteTransaction(
            conn, self.txids, self._cache, self._hub, self._clock.now_ms(), self._live, in_thread
        )

    async def durable(self, writes: int, lone: bool) -> None:
        wal = self.wal
        wal.counted(writes)
        if not wal.syncs_itself:
            return
        if wal.syncs_here(lone):
            wal.sync_here()
        else:
            await wal.sync_in_thread()

    async def maintain(self) -> None:
        """Checkpoint the WAL when due (sqlite/wal.py), in the writer thread.

        SQLite's own automatic checkpoint would run inside a COMMIT, on the loop,
        with two fsyncs and megabytes of copying; here the loop keeps serving and
        writes queue up meanwhile. PASSIVE: readers are never blocked. Once the
        WAL is fully copied, the next commit rewrites it from the start, so the
        file stops growing and its blocks are reused. If it fails (a full disk),
        nothing is lost: the WAL still holds every commit.
        """
        wal = self.wal
        if not wal.checkpoint_due or self._faults.refusal is not None:
            return
        counted = wal.checkpointing()
        try:
            await self.run(_checkpoint)
        except BaseException as exc:
            wal.checkpoint_failed(counted)
            if not isinstance(exc, Exception):
                raise
            self._faults.write_fault(exc, "a checkpoint")

    async def probe_room(self) -> None:
        due = self.wal.checkpoint_due
        await self.run(lambda conn: self._probe(conn, due))
        if due:
            self.wal.checkpointed()

    def _probe(self, conn: sqlite3.Connection, checkpoint: bool) -> None:
        """Room for ``RESUME_ROOM`` bytes, the checkpoint if due, then a commit of one page (the
        next txid, unchanged): what the next batches need room for."""
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
            _checkpoint(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(SET_NEXT_TXID, (self.txids.next,))
            conn.execute("COMMIT")
        except BaseException:
            roll_back(conn)
            raise

    def retryable(self, exc: BaseException) -> str | None:
        return None  # one writer: nothing to deadlock with


def _checkpoint(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()  # fetched: the statement ends
