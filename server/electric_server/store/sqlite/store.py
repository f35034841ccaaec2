"""The embedded default store: one SQLite file in WAL mode.

``SQLiteStore`` holds its parts, each an object in a module of its own:

- the group committer (store/committer.py), shared with PostgreSQL, whose
  backend here is the ``SQLiteWriter`` (sqlite/writer.py: the one connection
  that writes, its thread, opening and closing the file), each batch an
  ``SQLiteTransaction`` (sqlite/transaction.py, with the entity cache) and
  its txids from ``Txids`` (sqlite/txids.py: the reservation in the state
  file);
- the ``Wal`` (sqlite/wal.py): the sync that makes each commit durable, and
  when to checkpoint;
- the fault policy (store/faults.py), with SQLite's predicates
  (sqlite/faults.py);
- the fast paths (store/fastpath.py): ``LoneWrite`` (sqlite/lone_write.py)
  and the WAL's ``InlineSync`` (sqlite/inline_sync.py);
- the schema and every statement (sqlite/schema.py), the check of the files
  before SQLite opens them (sqlite/damage.py, sqlite/walcheck.py) and the
  state file (sqlite/state_file.py);
- here: opening and closing, and the reads.

Reads use a separate connection on the event loop's thread; WAL lets them run
alongside the writer. Reads are bounded (pages), so they never hold the loop
for long, and they return only what is durable (``Wal.durable``).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from electric_sdk.lifecycle import State

from ...clock import SYSTEM_CLOCK, Clock
from ...lifetime import TaskGroup
from ...settings import COMMIT_DELAY
from ..base import (
    DamagedStore,
    DiskFull,
    EntityRecord,
    FaultListener,
    Ref,
    StoredEvent,
    TypeProfile,
    VersionChoice,
    Write,
    WriteOutcome,
)
from ..committer import GroupCommitter, Outcome
from ..faults import DISK_FULL_RETRY_S, Faults
from ..hub import Hub
from ..outcome import now_ms
from ..rows import entity_from_row, event_from_row
from ..sessions import MemorySessions
from ..sql_reads import SQLReads, cascades_due_sql
from .damage import inspect_settled
from .faults import classify, full_at_start, has_room
from .lone_write import LoneWrite
from .schema import (
    PURGE_IDEMPOTENCY,
    SCHEMA,
    SELECT_AWAITING,
    SELECT_BOUND_RUNS,
    SELECT_CHILDREN_ENDED,
    SELECT_DUE_DEADLINES,
    SELECT_ENDED_OPEN_HOLDERS,
    SELECT_ENTITIES,
    SELECT_ENTITY,
    SELECT_EVENTS,
    SELECT_HELD_BY,
    SELECT_HOLDERS,
    SELECT_IDEMPOTENCY,
    SELECT_INTERRUPTS_DUE,
    SELECT_NEXT_TXID,
    SELECT_STOPPING_DEADLINES,
    SELECT_TYPE_PROFILES,
    SELECT_VERSION_CHOICES,
    SELECT_WAITING_RUNS,
    UPSERT_TYPE_PROFILE,
    UPSERT_VERSION_CHOICE,
)
from .wal import RESUME_ROOM, Wal
from .writer import SQLiteWriter, connect

# SCHEMA and now_ms are here too for the benchmarks, which build files the store's way.
__all__ = ["MAX_COMMIT_DELAY_MS", "SCHEMA", "SQLiteStore", "now_ms"]

MAX_COMMIT_DELAY_MS = COMMIT_DELAY.highest()
# The problems SQLite's integrity check lists at most (it stops there).
INTEGRITY_ROWS = 20

log = logging.getLogger(__name__)

T = TypeVar("T")


class SQLiteStore(SQLReads):
    """See the module docstring. ``path`` is the database file."""

    select_stopping_deadlines = SELECT_STOPPING_DEADLINES
    select_type_profiles = SELECT_TYPE_PROFILES
    select_version_choices = SELECT_VERSION_CHOICES
    select_bound_runs = SELECT_BOUND_RUNS
    select_children_ended = SELECT_CHILDREN_ENDED
    select_interrupts_due = SELECT_INTERRUPTS_DUE
    select_awaiting = SELECT_AWAITING
    select_cascades_due = cascades_due_sql("?")

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
        self.path = Path(path)
        self.synchronous = synchronous.upper()
        # Read-only: no writer at all, so `electric verify` can run beside a live server.
        self.readonly = readonly
        # Open a damaged store anyway, dropping what the damage cut off (see SQLiteWriter.open).
        self.accept_data_loss = accept_data_loss
        self.hub = Hub()
        # What time it is for the writes, deadlines and sessions (clock.py): a test's may jump.
        self.clock = clock
        # One server: its sessions live in its memory, the book its writes judge holders by.
        self.sessions = self._sessions = MemorySessions(clock)
        where = str(self.path.parent)
        self.faults = Faults(where, lambda exc: classify(exc, where), disk_full_retry_ms / 1000)
        self.wal = Wal(self.path, self.synchronous, self.faults)
        self.writer = SQLiteWriter(
            self.path,
            self.synchronous,
            hub=self.hub,
            faults=self.faults,
            wal=self.wal,
            clock=clock,
            live=self._sessions,
        )
        self.committer = GroupCommitter(
            self.writer,
            self.faults,
            name="electric-sqlite-writer",
            commit_delay_s=commit_delay_ms / 1000,
            batches_in_caller=True,
        )
        self.lone_write = LoneWrite(self.committer, self.wal, self.faults, self.writer)
        self.committer.here = self.lone_write
        self._rconn: sqlite3.Connection | None = None
        # Opened read-only on a full disk: the task that opens the writer once there is room.
        self._reopening: TaskGroup | None = None

    @property
    def disk_full_retry_s(self) -> float:
        return self.faults.retry_s

    @property
    def commit_delay_s(self) -> float:
        return self.committer.commit_delay_s

    @property
    def batches_committed(self) -> int:
        """Batches committed (lone writes included): for tests and benchmarks."""
        return self.committer.batches_committed

    @property
    def checkpoints(self) -> int:
        """Checkpoints run: for tests and benchmarks."""
        return self.wal.checkpoints

    # -- lifecycle -----------------------------------------------------------

    async def open(self) -> None:
        if self.readonly:
            if not self.path.exists():
                raise FileNotFoundError(f"no electric database at {self.path}")
            self._rconn = connect(self.path, self.synchronous, readonly=True)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            await self.writer.open(self.accept_data_loss)
        except Exception as exc:
            fault = classify(exc, str(self.path.parent))
            if fault is None:
                raise
            full = full_at_start(fault, self.path.parent, RESUME_ROOM)
            if full is None:
                raise fault from exc
            self._open_read_only(full, exc)
            return
        self._rconn = connect(self.path, self.synchronous)
        self.wal.open()
        self.lone_write.open(asyncio.get_running_loop())
        self.committer.start()

    def _open_read_only(self, full: DiskFull, exc: BaseException) -> None:
        """The disk was full at the opening: serve reads from the file opened read-only, with
        every write refused (DISK_FULL), if SQLite can read it without writing (after a clean
        stop: no WAL to replay), else raise ``full``. Every ``retry_s`` the writer's opening is
        tried again, once the disk has room: then writes resume (``_reopen``)."""
        if not self.path.exists():
            raise full from exc
        try:
            conn = connect(self.path, self.synchronous, readonly=True, alone=True)
            conn.execute(SELECT_NEXT_TXID).fetchone()
        except sqlite3.Error as read_exc:
            raise DiskFull(f"{full}; nor can it be read without writing ({read_exc})") from exc
        self._rconn = conn
        log.error(
            "%s: the server starts read-only, every write refused (UNAVAILABLE/DISK_FULL). Free at "
            "least %.1f MB on the file system of %s; writes resume by themselves (the store tries "
            "every %g s)",
            full,
            RESUME_ROOM / 1e6,
            self.path.parent,
            self.faults.retry_s,
        )
        self.faults.full_from_the_start(full)
        self._reopening = TaskGroup("the store's opening once the disk has room")
        self._reopening.start_soon(self._reopen(), name="electric-sqlite-reopen")

    async def _reopen(self) -> None:
        """Read-only on a full disk: once ``RESUME_ROOM`` fits, open the writer as ``open`` does,
        and the reads' connection anew (the immutable one would not see the writes); writes resume."""
        while True:
            await asyncio.sleep(self.faults.retry_s)
            if not has_room(self.path.parent, RESUME_ROOM):
                continue
            try:
                await self.writer.open(self.accept_data_loss)
            except Exception as exc:
                fault = classify(exc, str(self.path.parent))
                if fault is not None and full_at_start(fault, self.path.parent, RESUME_ROOM) is not None:
                    continue  # the room went again meanwhile
                self.faults.stop(exc, "the store's opening once the disk had room", exc_info=exc)
                return
            reads, self._rconn = self._rconn, connect(self.path, self.synchronous)
            if reads is not None:
                reads.close()
            self.wal.open()
            self.lone_write.open(asyncio.get_running_loop())
            self.committer.start()
            self.faults.resume()
            return

    async def close(self) -> None:
        if self._reopening is not None:
            reopening, self._reopening = self._reopening, None
            await reopening.aclose()
        if not self.committer.writer_tasks:
            if self._rconn is not None:
                self._rconn.close()
                self._rconn = None
            return
        await self.committer.close()  # the queued writes are committed first
        self.lone_write.close()
        await self.writer.close()
        self.wal.close()
        if self._rconn is not None:
            self._rconn.close()
            self._rconn = None

    # -- writes --------------------------------------------------------------

    async def write(self, write: Write) -> WriteOutcome:
        return await self.committer.write(write)

    async def write_many(self, writes: Sequence[Write]) -> list[Outcome]:
        return await self.committer.write_many(writes)

    def subscribe_faults(self, callback: FaultListener) -> Callable[[], None]:
        return self.faults.subscribe(callback)

    async def on_writer(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` with the writer's connection, in the writer thread, between batches: for tests
        and operators' tools that ask the connection that writes (its PRAGMAs, its schema)."""
        return await self.writer.run(fn)

    async def damage(self) -> list[str]:
        """The damage ``inspect_files`` finds, then what SQLite's integrity check finds.

        Read-only (it may run beside a live server). Raises OSError where a file
        cannot be read, and StoreBusy where the database is locked.
        """
        problems = list((await asyncio.to_thread(inspect_settled, self.path)).problems)
        try:
            rows = self.reader().execute(f"PRAGMA integrity_check({INTEGRITY_ROWS})").fetchall()
        except sqlite3.Error as exc:
            fault = self.faults.read_fault(exc)
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

    def reader(self) -> sqlite3.Connection:
        """The readers' connection, on the loop's thread (also for tests: a statement's plan)."""
        if self._rconn is None:
            raise RuntimeError("store is closed")
        return self._rconn

    async def fetch(self, sql: str, args: Sequence[object] = ()) -> list[Any]:
        """Every row a read returns, once what it read is durable."""
        try:
            rows = self.reader().execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise self.faults.read_fault(exc) from exc
        await self.wal.durable()
        return rows

    async def get_entity(self, ref: Ref) -> EntityRecord | None:
        try:
            row = self.reader().execute(SELECT_ENTITY, ref).fetchone()
        except sqlite3.Error as exc:
            raise self.faults.read_fault(exc) from exc
        await self.wal.durable()
        return entity_from_row(row) if row else None

    async def list_entities(
        self, type: str | None, states: Sequence[State], after: Ref | None, limit: int, parent: str = ""
    ) -> list[EntityRecord]:
        where, args = [], []
        if parent:
            where.append("parent = ?")
            args.append(parent)
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
        return [entity_from_row(r) for r in await self.fetch(sql, args)]

    async def read_events(self, ref: Ref, from_offset: int, limit: int) -> list[StoredEvent]:
        return [
            event_from_row(r) for r in await self.fetch(SELECT_EVENTS, (ref[0], ref[1], from_offset, limit))
        ]

    async def idempotent_response(self, ref: Ref, key: str) -> tuple[bytes, bytes] | None:
        try:
            row = self.reader().execute(SELECT_IDEMPOTENCY, (ref[0], ref[1], key)).fetchone()
        except sqlite3.Error as exc:
            raise self.faults.read_fault(exc) from exc
        await self.wal.durable()
        return (bytes(row[0]), bytes(row[1])) if row else None

    async def store_type_profile(self, profile: TypeProfile) -> None:
        await self.writer.aside(UPSERT_TYPE_PROFILE, tuple(profile), "a type profile's announcement")

    async def store_version_choice(self, choice: VersionChoice) -> None:
        await self.writer.aside(UPSERT_VERSION_CHOICE, tuple(choice), "a version choice")

    async def head_txid(self) -> int:
        try:
            row = self.reader().execute(SELECT_NEXT_TXID).fetchone()
        except sqlite3.Error as exc:
            raise self.faults.read_fault(exc) from exc
        await self.wal.durable()
        return (int(row[0]) if row else 1) - 1

    # -- the deadline sweeps' reads (store/base.py) --------------------------------------------

    async def due_deadlines(self, limit: int) -> list[tuple[Ref, int]]:
        # One writer: no row is locked by another transaction, so there is nothing to skip.
        rows = await self.fetch(SELECT_DUE_DEADLINES, (self.clock.now_ms(), limit))
        return [((str(t), str(i)), int(d)) for t, i, d in rows]

    async def lost_leases(self, limit: int) -> list[tuple[Ref, int]]:
        lost: list[tuple[Ref, int]] = []
        for (holder,) in await self.fetch(SELECT_HOLDERS):
            if len(lost) >= limit:
                break
            if holder in self._sessions:
                continue
            rows = await self.fetch(SELECT_HELD_BY, (holder, limit - len(lost)))
            lost.extend(((str(t), str(i)), int(e)) for t, i, e in rows)
        return lost

    async def settled_streams(self, settle_ms: int, limit: int) -> list[Ref]:
        settled = self.clock.now_ms() - settle_ms
        rows = await self.fetch(SELECT_ENDED_OPEN_HOLDERS)
        return [(str(t), str(i)) for t, i, s, at in rows if s not in self._sessions or at <= settled][:limit]

    async def unleased(self, types: Sequence[str], states: Sequence[State], limit: int) -> list[EntityRecord]:
        # One server: every change is its own commit, and each commit offers what it leaves
        # without a runtime (runtime/hosting.py). What no commit offers is a run waiting for a
        # worker of its code version, whose wait has a bound (runtime/versions.py): the poll
        # offers those again, so the bound fires within a poll of its end.
        wanted = set(types)
        rows = await self.fetch(SELECT_WAITING_RUNS, (limit,))
        return [r for r in map(entity_from_row, rows) if r.type in wanted]

    async def purge_idempotency(self, retention_ms: int, prefix: str = "") -> int:
        if self.faults.refusal is not None:
            return 0  # nothing is purged while writes are refused: the store said why when it began
        args = (self.clock.now_ms() - retention_ms, prefix + "%")
        return await self.writer.aside(PURGE_IDEMPOTENCY, args, "a purge of old idempotency keys")
