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
- here: opening and closing the file, and the reads.

Reads use a separate connection on the event loop's thread; WAL lets them run
alongside the writer. Reads are bounded (pages), so they never hold the loop
for long.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from electric_sdk.lifecycle import State

from ..internals.ready_queue import BUSY, ready_queue
from .base import EntityRecord, Hub, Ref, Store, StoredEvent
from .rows import entity_from_row, event_from_row
from .sqlite_schema import (
    PURGE_IDEMPOTENCY,
    SCHEMA,
    SELECT_ENTITIES,
    SELECT_ENTITY,
    SELECT_EVENTS,
    SELECT_IDEMPOTENCY,
    SELECT_NEXT_TXID,
    SELECT_STOPPING_DEADLINES,
    migrate,
)
from .sqlite_writer import SQLiteWriter, now_ms

# SCHEMA and now_ms are here too for the benchmarks, which build files the store's way.
__all__ = ["MAX_COMMIT_DELAY_MS", "SCHEMA", "SQLiteStore", "now_ms"]

MAX_COMMIT_DELAY_MS = 100


class SQLiteStore(SQLiteWriter, Store):
    """See the module docstring. ``path`` is the database file."""

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "FULL",
        readonly: bool = False,
        commit_delay_ms: float = 0.0,
    ) -> None:
        if synchronous.upper() not in {"FULL", "NORMAL", "EXTRA", "OFF"}:
            raise ValueError(f"synchronous must be FULL, NORMAL, EXTRA or OFF, not {synchronous!r}")
        if not 0 <= commit_delay_ms <= MAX_COMMIT_DELAY_MS:
            raise ValueError(f"the commit delay must be 0-{MAX_COMMIT_DELAY_MS} ms, not {commit_delay_ms} ms")
        super().__init__(commit_delay_ms / 1000)
        self.path = Path(path)
        self.synchronous = synchronous.upper()
        # Read-only: no writer at all, so `electric verify` can run beside a live server.
        self.readonly = readonly
        self.hub = Hub()
        self._executor: ThreadPoolExecutor | None = None
        self._conn_lock = asyncio.Lock()
        # Commits run on the loop unless SQLite itself must sync inside them (EXTRA).
        self._commits_on_loop = self.synchronous != "EXTRA"
        self._wconn: sqlite3.Connection | None = None
        self._rconn: sqlite3.Connection | None = None

    # -- lifecycle -----------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self.readonly:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None)
            conn.execute("PRAGMA busy_timeout=10000")
            return conn
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # FULL is kept by syncing the WAL after each commit in _sync, not inside COMMIT.
        conn.execute(f"PRAGMA synchronous={'NORMAL' if self.synchronous == 'FULL' else self.synchronous}")
        conn.execute("PRAGMA busy_timeout=10000")
        return conn

    def _open_writer(self) -> None:
        conn = self._connect()
        if self._commits_on_loop:
            conn.execute("PRAGMA wal_autocheckpoint=0")  # _checkpoint does it, off the loop
        migrate(conn)
        row = conn.execute(SELECT_NEXT_TXID).fetchone()
        self._next_txid = int(row[0]) if row else 1
        self._wconn = conn

    async def open(self) -> None:
        if self.readonly:
            if not self.path.exists():
                raise FileNotFoundError(f"no electric database at {self.path}")
            self._rconn = self._connect()
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="electric-sqlite-writer")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._open_writer)
        self._rconn = self._connect()
        self._open_wal()
        self._loop_ready = ready_queue(loop)
        self._writer_task = asyncio.create_task(self._writer_loop(), name="electric-sqlite-writer")

    async def close(self) -> None:
        if self._writer_task is None:
            if self._rconn is not None:
                self._rconn.close()
                self._rconn = None
            return
        self._closing = True
        self._wakeup.set()
        await self._writer_task
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
        if self._wconn is not None:
            # Fold the WAL back into the database so the file is complete on its own.
            self._wconn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._wconn.close()
            self._wconn = None

    # -- reads -----------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        if self._rconn is None:
            raise RuntimeError("store is closed")
        return self._rconn

    async def get_entity(self, ref: Ref) -> EntityRecord | None:
        row = self._reader().execute(SELECT_ENTITY, ref).fetchone()
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
        rows = self._reader().execute(sql, args).fetchall()
        await self._durable()
        return [entity_from_row(r) for r in rows]

    async def read_events(self, ref: Ref, from_offset: int, limit: int) -> list[StoredEvent]:
        rows = self._reader().execute(SELECT_EVENTS, (ref[0], ref[1], from_offset, limit)).fetchall()
        await self._durable()
        return [event_from_row(r) for r in rows]

    async def idempotent_response(self, ref: Ref, key: str) -> tuple[bytes, bytes] | None:
        row = self._reader().execute(SELECT_IDEMPOTENCY, (ref[0], ref[1], key)).fetchone()
        await self._durable()
        return (bytes(row[0]), bytes(row[1])) if row else None

    async def stopping_deadlines(self) -> list[tuple[Ref, int]]:
        rows = self._reader().execute(SELECT_STOPPING_DEADLINES).fetchall()
        await self._durable()
        return [((str(t), str(i)), int(d)) for t, i, d in rows]

    async def head_txid(self) -> int:
        row = self._reader().execute(SELECT_NEXT_TXID).fetchone()
        await self._durable()
        return (int(row[0]) if row else 1) - 1

    async def purge_idempotency(self, older_than_ms: int) -> int:
        def purge() -> int:
            assert self._wconn is not None
            return self._wconn.execute(PURGE_IDEMPOTENCY, (older_than_ms,)).rowcount

        loop = asyncio.get_running_loop()
        async with self._conn_lock:  # the writer connection is not shared mid-statement
            return await loop.run_in_executor(self._executor, purge)
