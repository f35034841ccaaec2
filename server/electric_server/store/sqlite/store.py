"""The embedded default store: one SQLite file in WAL mode.

``SQLiteStore`` is the entry point; its parts, each in its own module:

- ``rows``: the entity's and events' columns and the row ↔ record mappings,
  derived from the records' fields (shared with any other SQL store);
- ``sqlite_schema``: the file's schema, how an older file is brought up to
  it, and every statement the store runs;
- ``sqlite_wal``: the WAL sync that makes each commit durable
  (``synchronous=FULL`` by default), and the checkpoints;
- ``sqlite_writer``: group commit, the lone-write path, and how a batch of
  writes is applied;
- ``sqlite_faults``: what a full, failed or damaged disk means for writes;
- ``sqlite_damage`` (with ``sqlite_walcheck``) and ``state_file``: the check
  of the files before SQLite opens them, and the record of clean shutdowns
  and reserved txids;
- here: opening and closing the file, and the reads.

Opening, the store looks at its files first (``inspect_files``) and refuses
damaged ones with ``DamagedStore``, unless ``accept_data_loss``: then it
keeps a copy of the damaged WAL, opens what SQLite can read, folds it into
the database (so the next start finds a whole WAL) and logs what was
dropped. After an unclean shutdown, txids continue above the reservation.

Reads use a separate connection on the event loop's thread; WAL lets them run
alongside the writer. Reads are bounded (pages), so they never hold the loop
for long.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sqlite3
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from electric_sdk.lifecycle import State

from ...clock import SYSTEM_CLOCK, Clock
from ...internals.ready_queue import BUSY, ready_queue
from ..base import DamagedStore, EntityRecord, Hub, Ref, Store, StoredEvent, TypeProfile
from ..rows import entity_from_row, event_from_row
from ..sessions import MemorySessions
from ..sql_reads import SQLReads
from .damage import Inspection, inspect_files, inspect_settled
from .faults import DAMAGED_REMEDY, DISK_FULL_RETRY_S, classify
from .schema import (
    PURGE_IDEMPOTENCY,
    SCHEMA,
    SELECT_DUE_DEADLINES,
    SELECT_ENDED_OPEN_HOLDERS,
    SELECT_ENTITIES,
    SELECT_ENTITY,
    SELECT_EVENTS,
    SELECT_HELD_BY,
    SELECT_HOLDERS,
    SELECT_IDEMPOTENCY,
    SELECT_NEXT_TXID,
    SELECT_STOPPING_DEADLINES,
    SELECT_TYPE_PROFILES,
    UPSERT_TYPE_PROFILE,
    migrate,
)
from .state_file import StateFile, StoreState
from .walcheck import wal_path
from .writer import SQLiteWriter, now_ms

# SCHEMA and now_ms are here too for the benchmarks, which build files the store's way.
__all__ = ["MAX_COMMIT_DELAY_MS", "SCHEMA", "SQLiteStore", "now_ms"]

MAX_COMMIT_DELAY_MS = 100
# The problems SQLite's integrity check lists at most (it stops there).
INTEGRITY_ROWS = 20

log = logging.getLogger(__name__)


class SQLiteStore(SQLReads, SQLiteWriter, Store):
    """See the module docstring. ``path`` is the database file."""

    select_stopping_deadlines = SELECT_STOPPING_DEADLINES
    select_type_profiles = SELECT_TYPE_PROFILES

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "FULL",
        readonly: bool = False,
        commit_delay_ms: float = 0.0,
        accept_data_loss: bool = False,
        disk_full_retry_ms: float = DISK_FULL_RETRY_S * 1000,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if synchronous.upper() not in {"FULL", "NORMAL", "EXTRA", "OFF"}:
            raise ValueError(f"synchronous must be FULL, NORMAL, EXTRA or OFF, not {synchronous!r}")
        if not 0 <= commit_delay_ms <= MAX_COMMIT_DELAY_MS:
            raise ValueError(f"the commit delay must be 0-{MAX_COMMIT_DELAY_MS} ms, not {commit_delay_ms} ms")
        if disk_full_retry_ms <= 0:  # 0 would retry without pause: the spin refusing writes avoids
            raise ValueError(
                f"the retry interval on a full disk must be positive, not {disk_full_retry_ms} ms"
            )
        super().__init__(commit_delay_ms / 1000)
        self.path = Path(path)
        self.synchronous = synchronous.upper()
        # Read-only: no writer at all, so `electric verify` can run beside a live server.
        self.readonly = readonly
        # Open a damaged store anyway, dropping what the damage cut off (see open).
        self.accept_data_loss = accept_data_loss
        self.disk_full_retry_s = disk_full_retry_ms / 1000
        self.hub = Hub()
        # What time it is for the writes, deadlines and sessions (clock.py): a test's may jump.
        self.clock = clock
        # One server: its sessions live in its memory, the book its writes judge holders by.
        self.sessions = self._sessions = MemorySessions(clock)
        self._executor: ThreadPoolExecutor | None = None
        self._conn_lock = asyncio.Lock()
        # Commits run on the loop unless SQLite itself must sync inside them (EXTRA).
        self._commits_on_loop = self.synchronous != "EXTRA"
        self._wconn: sqlite3.Connection | None = None
        self._rconn: sqlite3.Connection | None = None

    # -- lifecycle -----------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self.readonly:
            # SQLite would create a missing WAL (empty), even read-only, hiding its loss from the
            # next start (sqlite_damage.py); without one there is nothing to read in it anyway.
            immutable = "" if wal_path(self.path).exists() else "&immutable=1"
            # As a URI: as_uri() escapes what a file name may hold and a URI may not ('?', '#', '%').
            uri = f"{self.path.resolve().as_uri()}?mode=ro{immutable}"
            conn = sqlite3.connect(uri, uri=True, isolation_level=None)
            conn.execute("PRAGMA busy_timeout=10000")
            return conn
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # The store checkpoints itself (sqlite_wal.py), so no commit ever reports a checkpoint's failure.
        conn.execute("PRAGMA wal_autocheckpoint=0")
        # Up to 64 MiB of pages a connection (SQLite's default: 2 MiB): a write touches its
        # entity's row and the tail of its stream, and once a thousand entities' tails outgrow
        # 2 MiB each batch reads pages back from the WAL (2.6 reads a signal after 25 s of
        # bench_http's load, 1.3 with this).
        conn.execute("PRAGMA cache_size=-65536")
        # FULL is kept by syncing the WAL after each commit in _sync, not inside COMMIT.
        conn.execute(f"PRAGMA synchronous={'NORMAL' if self.synchronous == 'FULL' else self.synchronous}")
        conn.execute("PRAGMA busy_timeout=10000")
        return conn

    def _open_writer(self) -> None:
        found = inspect_files(self.path)
        if found.problems:
            if not self.accept_data_loss:
                raise DamagedStore(f"the store in {self.path.parent}", found.problems, DAMAGED_REMEDY)
            self._keep_damaged_wal()
            for problem in found.problems:
                log.warning("starting on a damaged store (--accept-data-loss): %s", problem)
        conn = self._wconn = self._connect()
        migrate(conn)
        row = conn.execute(SELECT_NEXT_TXID).fetchone()
        stored = int(row[0]) if row else 1
        self._next_txid = self._first_txid(found, stored)
        if found.problems:
            # What SQLite could read goes into the database, and the WAL restarts empty, so
            # the frames it dropped are not found (and refused) again at the next start.
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        self._state_file = StateFile(self.path)
        self._reserve(self._next_txid)  # recorded as running: until a clean close, a crash is assumed

    def _first_txid(self, found: Inspection, stored: int) -> int:
        """The next txid: the database's after a clean shutdown; else above every txid that
        may have been handed out (the reservation), even if their commits were lost."""
        state = found.state
        if state is None:
            if found.problems:
                log.warning(
                    "no readable state file: txids continue from the database's, %d; ones handed out "
                    "before the damage may be handed out again",
                    stored,
                )
            return stored
        if state.clean and not found.problems:
            return stored
        first = max(stored, state.reserved_below)
        if found.problems and first > stored:
            log.warning(
                "txids %d-%d are skipped: some may have been acknowledged in what was dropped, so no new "
                "write takes one (new txids start at %d)",
                stored,
                first - 1,
                first,
            )
        elif first > stored:
            log.info("the last shutdown was not clean: txids continue from %d, above the reservation", first)
        return first

    def _keep_damaged_wal(self) -> None:
        """Copy a damaged WAL aside before SQLite reads it and the store folds it away."""
        wal = wal_path(self.path)
        if not wal.exists():
            return
        kept = wal.with_name(f"{wal.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            shutil.copyfile(wal, kept)
        except OSError as exc:
            log.warning(
                "the damaged WAL could not be kept (%s): it is folded into the database as it is", exc
            )
        else:
            log.warning("the damaged WAL is kept as %s", kept)

    async def open(self) -> None:
        if self.readonly:
            if not self.path.exists():
                raise FileNotFoundError(f"no electric database at {self.path}")
            self._rconn = self._connect()
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="electric-sqlite-writer")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._open_writer)
        except Exception as exc:
            self._abandon()
            fault = classify(exc, str(self.path.parent))
            if fault is None:
                raise
            raise fault from exc
        self._rconn = self._connect()
        self._open_wal()
        self._loop_ready = ready_queue(loop)
        self._writer_task = asyncio.create_task(self._writer_loop(), name="electric-sqlite-writer")

    def _abandon(self) -> None:
        """After a failed open: let go of what it opened."""
        if self._wconn is not None:
            self._wconn.close()
            self._wconn = None
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    async def close(self) -> None:
        if self._writer_task is None:
            if self._rconn is not None:
                self._rconn.close()
                self._rconn = None
            return
        self._closing = True
        self._wakeup.set()
        await self._writer_task  # it ends on its own; never raises but for a cancellation
        self._writer_task = None
        self._loop_ready = BUSY
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close_writer)
        self._executor.shutdown(wait=True)
        self._close_wal()
        if self._rconn is not None:
            self._rconn.close()
            self._rconn = None

    def _close_writer(self) -> None:
        conn, self._wconn = self._wconn, None
        if conn is None:
            return
        if self._failed is None:  # after a failure for good, the disk gets nothing more from the store
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
                    self._record_clean_close()
        try:
            conn.close()
        except sqlite3.Error as exc:
            log.warning("closing the database failed: %s", exc)

    def _record_clean_close(self) -> None:
        assert self._state_file is not None
        try:
            self._state_file.write(StoreState(clean=True, reserved_below=self._reserved_below))
        except OSError as exc:
            # The next start takes the shutdown for a crash: txids skip a block, and the WAL,
            # which SQLite removes at close, is reported missing (--accept-data-loss: nothing is lost).
            log.warning("the clean shutdown could not be recorded in %s: %s", self._state_file.path, exc)

    async def damage(self) -> list[str]:
        """The damage ``inspect_files`` finds, then what SQLite's integrity check finds.

        Read-only (it may run beside a live server). Raises OSError where a file
        cannot be read, and StoreBusy where the database is locked.
        """
        problems = list((await asyncio.to_thread(inspect_settled, self.path)).problems)
        try:
            rows = self._reader().execute(f"PRAGMA integrity_check({INTEGRITY_ROWS})").fetchall()
        except sqlite3.Error as exc:
            fault = self._read_fault(exc)
            if isinstance(fault, DamagedStore):
                problems.extend(fault.problems)
            elif fault is exc:
                raise
            else:
                raise fault from exc
        else:
            found = [str(row[0]) for row in rows if row[0] != "ok"]
            problems.extend(f"SQLite's integrity check: {line}" for line in found)
        return problems

    # -- reads -----------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        if self._rconn is None:
            raise RuntimeError("store is closed")
        return self._rconn

    async def _rows(self, sql: str, args: Sequence[object] = ()) -> list[Any]:
        """Every row a read returns, once what it read is durable."""
        try:
            rows = self._reader().execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise self._read_fault(exc) from exc
        await self._durable()
        return rows

    async def get_entity(self, ref: Ref) -> EntityRecord | None:
        try:
            row = self._reader().execute(SELECT_ENTITY, ref).fetchone()
        except sqlite3.Error as exc:
            raise self._read_fault(exc) from exc
        await self._durable()
        return entity_from_row(row) if row else None

    async def list_entities(
        self, type: str | None, states: Sequence[State], after: Ref | None, limit: int
    ) -> list[EntityRecord]:
        where, args = [], []
        if type:
            where.append("type = ?")
            args.append(type)
        if states:
            where.append(f"state IN ({', '.join('?' * len(states))})")
            args.extend(s.value for s in states)
        if after is not None:
            where.append("(type, id) > (?, ?)")
            args.extend(after)
        sql = SELECT_ENTITIES
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY type, id LIMIT ?"
        args.append(str(limit))
        return [entity_from_row(r) for r in await self._rows(sql, args)]

    async def read_events(self, ref: Ref, from_offset: int, limit: int) -> list[StoredEvent]:
        return [
            event_from_row(r) for r in await self._rows(SELECT_EVENTS, (ref[0], ref[1], from_offset, limit))
        ]

    async def idempotent_response(self, ref: Ref, key: str) -> tuple[bytes, bytes] | None:
        try:
            row = self._reader().execute(SELECT_IDEMPOTENCY, (ref[0], ref[1], key)).fetchone()
        except sqlite3.Error as exc:
            raise self._read_fault(exc) from exc
        await self._durable()
        return (bytes(row[0]), bytes(row[1])) if row else None

    async def store_type_profile(self, profile: TypeProfile) -> None:
        await self._write_aside(UPSERT_TYPE_PROFILE, tuple(profile), "a type profile's announcement")

    async def head_txid(self) -> int:
        try:
            row = self._reader().execute(SELECT_NEXT_TXID).fetchone()
        except sqlite3.Error as exc:
            raise self._read_fault(exc) from exc
        await self._durable()
        return (int(row[0]) if row else 1) - 1

    # -- the deadline sweeps' reads (store/base.py) --------------------------------------------

    async def due_deadlines(self, limit: int) -> list[tuple[Ref, int]]:
        # One writer: no row is locked by another transaction, so there is nothing to skip.
        rows = await self._rows(SELECT_DUE_DEADLINES, (self.clock.now_ms(), limit))
        return [((str(t), str(i)), int(d)) for t, i, d in rows]

    async def lost_leases(self, limit: int) -> list[tuple[Ref, int]]:
        lost: list[tuple[Ref, int]] = []
        for (holder,) in await self._rows(SELECT_HOLDERS):
            if len(lost) >= limit:
                break
            if holder in self._sessions:
                continue
            rows = await self._rows(SELECT_HELD_BY, (holder, limit - len(lost)))
            lost.extend(((str(t), str(i)), int(e)) for t, i, e in rows)
        return lost

    async def settled_streams(self, settle_ms: int, limit: int) -> list[Ref]:
        settled = self.clock.now_ms() - settle_ms
        rows = await self._rows(SELECT_ENDED_OPEN_HOLDERS)
        return [(str(t), str(i)) for t, i, s, at in rows if s not in self._sessions or at <= settled][:limit]

    async def unleased(self, types: Sequence[str], states: Sequence[State], limit: int) -> list[EntityRecord]:
        # One server: every change is its own commit, and each commit offers what it leaves
        # without a runtime (runtime_service.py), so there is nothing for a poll to find.
        return []

    async def purge_idempotency(self, retention_ms: int, prefix: str = "") -> int:
        if self._refusal is not None:
            return 0  # nothing is purged while writes are refused: the store said why when it began
        args = (self.clock.now_ms() - retention_ms, prefix + "%")
        return await self._write_aside(PURGE_IDEMPOTENCY, args, "a purge of old idempotency keys")

    async def _write_aside(self, sql: str, args: tuple[object, ...], what: str) -> int:
        """One statement on the writer's connection, outside the entities' batches (its own
        transaction, synced with the next batch's WAL sync); returns the rows it changed."""

        def execute() -> int:
            assert self._wconn is not None
            return self._wconn.execute(sql, args).rowcount

        loop = asyncio.get_running_loop()
        try:
            async with self._conn_lock:  # the writer connection is not shared mid-statement
                return await loop.run_in_executor(self._executor, execute)
        except Exception as exc:  # e.g. a full disk: a write like any other
            error = self._fault(exc, what)
            if error is exc:
                raise
            raise error from exc
