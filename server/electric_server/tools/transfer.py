"""`electric export` and `electric import`: every stream of one store moved, offline, into another.

A store is a data directory's SQLite file or a PostgreSQL database; either
may be exported and either imported into, through the file of
``export_file.py``, record by record (neither side holds the store in memory).

Both refuse a live server's data: on SQLite they take the data directory's
lock (``datadir.py``), which a running server holds; on PostgreSQL they
refuse a database that another electric process is connected to (its
connections carry the application name ``electric``). The export reads one
snapshot (SQLite: one read transaction; PostgreSQL: one REPEATABLE READ
transaction). The import refuses a target that holds anything, and writes in
one transaction (PostgreSQL: locked tables, ``COPY``) or into a temporary
file renamed when whole (SQLite), so a refused, malformed or cut-short file
leaves the target as it was. After the rows, the target's txids are set to
continue above the highest imported one (SQLite: ``meta.next_txid``;
PostgreSQL: the ``electric_txid`` sequence).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar

from ..settings import DATA_DIR
from ..store.base import EntityRecord, StoredEvent, TypeProfile
from ..store.database_url import redacted
from ..store.rows import ENTITY_COLUMNS, EVENT_COLUMNS, entity_from_row, entity_row
from ..store.sqlite import schema as sqlite_schema
from ..store.sqlite.damage import inspect_files
from ..store.sqlite.walcheck import wal_path
from .backup import fsync_path
from .datadir import LOCK_NAME, DataDirLock, database_path
from .export_file import KINDS, EventRow, ExportFormatError, Header, IdempotencyRow, Reader, Record, Writer

__all__ = ["Progress", "TransferError", "Transferred", "export_store", "import_store"]

# Rows written to the target per statement.
_CHUNK = 1_000
_IDEMPOTENCY_COLUMNS = ("type", "id", "key", "request_hash", "response", "created_at")
# Every field, in the record's order (a column left out here would be lost on the way to PostgreSQL).
_PROFILE_COLUMNS = TypeProfile._fields
_ENTITY_ORDER = " ORDER BY type, id"


class TransferError(ValueError):
    """An export or import refused, or one that failed: the target is as it was (the CLI exits 2)."""


# How counts of each kind of record are named for people (export, import, and the CLI's verify,
# backup and restore): (one, many).
_NAMES = {
    "type_profile": ("type profile", "type profiles"),
    "entity": ("entity", "entities"),
    "event": ("event", "events"),
    "idempotency": ("idempotency key", "idempotency keys"),
}


def one(kind: str) -> str:
    """One record of ``kind``, for people: "an entity", "a type profile"."""
    name = _NAMES[kind][0]
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def counted(counts: dict[str, int]) -> str:
    """``counts`` (by kind of record, as an export's) for people: "1 entity, 2,048 events, ..."."""
    return ", ".join(f"{n:,} {_NAMES[kind][n != 1]}" for kind, n in counts.items())


@dataclass
class Transferred:
    counts: dict[str, int]
    head_txid: int

    def __str__(self) -> str:
        return f"{counted(self.counts)} (txids up to {self.head_txid})"


@dataclass
class Progress:
    """Says on ``out`` (stderr) how far a transfer got, at most once per ``interval_s``."""

    command: str
    out: IO[str] = field(default_factory=lambda: sys.stderr)
    interval_s: float = 1.0
    _last: float = 0.0

    def tick(self, counts: dict[str, int], final: bool = False) -> None:
        now = time.monotonic()
        if final or now - self._last >= self.interval_s:
            self._last = now
            self.out.write(f"electric {self.command}: {'done: ' if final else ''}{counted(counts)}\n")
            self.out.flush()


# -- sources -------------------------------------------------------------------------------


class _SQLiteSource:
    """A data directory's store, read in one transaction under the directory's lock."""

    name = "sqlite"

    def __init__(self, data_dir: Path) -> None:
        path = database_path(data_dir)
        if not path.is_file():
            raise TransferError(f"no electric store in {data_dir} (expected {path})")
        problems = inspect_files(path).problems
        if problems:
            raise TransferError(
                f"the store in {data_dir} is damaged ({'; '.join(problems)}): see `electric verify`"
            )
        self._lock = DataDirLock.acquire(data_dir, "electric export")  # a live server: DataDirLocked
        # Read-only, as `electric verify` reads (SQLiteStore(readonly=True)): nothing in the
        # directory changes, not even the WAL a closing read-write connection would fold away.
        immutable = "" if wal_path(path).exists() else "&immutable=1"
        self._conn = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro{immutable}", uri=True, isolation_level=None
        )
        self._conn.execute("BEGIN")

    async def head_txid(self) -> int:
        row = self._conn.execute(sqlite_schema.SELECT_NEXT_TXID).fetchone()
        return int(row[0]) - 1 if row else 0

    async def rows(self, sql: str, *args: object) -> AsyncIterator[Any]:
        for row in self._conn.execute(sql, args):
            yield row

    async def close(self) -> None:
        self._conn.close()
        self._lock.release()


class _PostgresSource:
    """A PostgreSQL database, read in one REPEATABLE READ transaction (one snapshot)."""

    name = "postgresql"

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    @classmethod
    async def open(cls, url: str) -> _PostgresSource:
        from ..store.postgres.schema import SCHEMA_VERSION

        conn = await _connect(url, "electric export")
        try:
            version = await conn.fetchval(
                "SELECT CASE WHEN to_regclass('electric_schema') IS NULL THEN NULL "
                "ELSE (SELECT max(version) FROM electric_schema) END"
            )
            if version is None:
                raise TransferError(f"the database {redacted(url)} holds no electric store")
            if version > SCHEMA_VERSION:
                raise TransferError(
                    f"the database's schema is version {version}, newer than this electric knows "
                    f"({SCHEMA_VERSION}): export it with a newer electric"
                )
            await _refuse_live(conn, url)
            await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        except BaseException:
            conn.terminate()
            raise
        return cls(conn)

    async def head_txid(self) -> int:
        # The sequence's, not the rows': a txid drawn by a write that was then refused is skipped too.
        return int(
            await self._conn.fetchval(
                "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM electric_txid"
            )
        )

    async def rows(self, sql: str, *args: object) -> AsyncIterator[Any]:
        async for row in self._conn.cursor(_numbered(sql), *args, prefetch=_CHUNK):
            yield row

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._conn.execute("ROLLBACK")
        await self._conn.close()


_Source = _SQLiteSource | _PostgresSource


def _numbered(sql: str) -> str:
    """SQLite's ``?`` placeholders as PostgreSQL's ``$1``, ``$2``, ... (none is inside a literal here)."""
    parts = sql.split("?")
    return "".join(p + (f"${i}" if i < len(parts) else "") for i, p in enumerate(parts, 1))


async def _connect(url: str, application_name: str) -> Any:
    try:
        import asyncpg

        from ..store.postgres.faults import refusal
    except ImportError as exc:
        raise TransferError(
            "a PostgreSQL database needs the asyncpg driver: pip install 'electric-sdk[postgres]'"
        ) from exc
    try:
        return await asyncpg.connect(url, timeout=10, server_settings={"application_name": application_name})
    except asyncpg.exceptions.ClientConfigurationError as exc:
        raise TransferError(f"the database URL {redacted(url)} is not one PostgreSQL takes: {exc}") from exc
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise TransferError(
            f"cannot open the database {redacted(url)}: {refusal(exc, redacted(url), 10)}"
        ) from exc


async def _refuse_live(conn: Any, url: str) -> None:
    """Another electric process on the database (a server's pool, or a tool): it must be offline."""
    others = await conn.fetch(
        "SELECT application_name, coalesce(host(client_addr), 'local') AS client FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name LIKE 'electric%'"
    )
    if others:
        who = sorted({f"{r['application_name']} from {r['client']}" for r in others})
        raise TransferError(
            f"the database {redacted(url)} is in use ({len(others)} electric connection(s): {', '.join(who)}): "
            "export and import work offline; stop every server on it first"
        )


async def export_store(
    out: Path,
    *,
    data_dir: Path | None = None,
    database_url: str | None = None,
    retention_ms: int,
    progress: Progress | None = None,
) -> Transferred:
    """Export the store (``database_url``'s, else ``data_dir``'s) to the new file ``out``.
    Idempotency keys older than ``retention_ms`` are expired: left out."""
    if out.exists():  # noqa: ASYNC240 (an offline command: nothing else runs on its loop)
        raise TransferError(f"{out} exists: name a new file")
    if not out.parent.is_dir():
        raise TransferError(f"no directory {out.parent} to write {out.name} in")
    source: _Source = (
        await _PostgresSource.open(database_url)
        if database_url
        else _SQLiteSource(data_dir or DATA_DIR.value)
    )
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        head = await source.head_txid()
        with open(tmp, "w", encoding="utf-8") as text:  # noqa: ASYNC230 (as above)
            writer = Writer(text, Header(source.name, _now_ms(), head))
            tick = (lambda: progress.tick(writer.counts)) if progress else (lambda: None)
            await _read_all(source, writer, _now_ms() - retention_ms, tick)
            writer.end()
            text.flush()
            os.fsync(text.fileno())
        tmp.replace(out)
    except OSError as exc:  # e.g. a full disk, a directory it may not write: nothing is left
        tmp.unlink(missing_ok=True)
        raise TransferError(f"cannot write {out}: {exc.strerror or exc}; nothing was exported") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        await source.close()
    if progress:
        progress.tick(writer.counts, final=True)
    return Transferred(dict(writer.counts), head)


async def _read_all(source: _Source, writer: Writer, keys_since_ms: int, tick: Callable[[], None]) -> None:
    async for row in source.rows(sqlite_schema.SELECT_TYPE_PROFILES + " ORDER BY type, code_version"):
        writer.type_profile(TypeProfile._make(row))
    async for row in source.rows(sqlite_schema.SELECT_ENTITIES + _ENTITY_ORDER):
        writer.entity(entity_from_row(row))
        tick()
    events = ", ".join(f'"{c}"' for c in EVENT_COLUMNS)
    async for row in source.rows(f'SELECT type, id, {events} FROM events ORDER BY type, id, "offset"'):
        writer.event(row[0], row[1], StoredEvent._make(row[2:]))
        tick()
    keys = f"SELECT {', '.join(_IDEMPOTENCY_COLUMNS)} FROM idempotency WHERE created_at >= ? ORDER BY type, id, key"
    async for row in source.rows(keys, keys_since_ms):
        writer.idempotency(IdempotencyRow._make(row))
        tick()


def _now_ms() -> int:
    return int(time.time() * 1000)


# -- targets -------------------------------------------------------------------------------


class _SQLiteTarget:
    """A new data directory's store, written as a temporary file and renamed when whole."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        _refuse_filled(data_dir)  # before the lock: a refused import leaves no LOCK behind
        self._lock = DataDirLock.acquire(data_dir, "electric import")  # a live server: DataDirLocked
        try:
            _refuse_filled(data_dir)  # again, held: nothing came meanwhile
            self._path = database_path(data_dir)
            self._tmp = self._path.with_name(f".{self._path.name}.import")
            self._tmp.unlink(missing_ok=True)
            self._conn = sqlite3.connect(self._tmp, isolation_level=None)
            sqlite_schema.migrate(self._conn)
            self._conn.execute("BEGIN")
        except BaseException:
            self._lock.discard()
            raise

    async def add(self, kind: str, rows: list[tuple[Any, ...]]) -> None:
        try:
            self._conn.executemany(_SQLITE_INSERTS[kind], rows)
        except sqlite3.Error as exc:  # e.g. an event twice in the file
            raise TransferError(f"nothing was imported: {one(kind)} was refused: {exc}") from exc

    async def finish(self, head_txid: int) -> None:
        self._conn.execute(sqlite_schema.SET_NEXT_TXID, (head_txid + 1,))
        self._conn.execute("COMMIT")
        self._conn.close()
        fsync_path(self._tmp)
        self._tmp.replace(self._path)
        fsync_path(self.data_dir)
        self._lock.release()

    async def abort(self) -> None:
        self._conn.close()
        self._tmp.unlink(missing_ok=True)
        self._lock.discard()


def _refuse_filled(data_dir: Path) -> None:
    """An import goes into a new directory, or an empty one (a LOCK alone: a stopped server's)."""
    others = sorted(p.name for p in data_dir.iterdir() if p.name != LOCK_NAME) if data_dir.is_dir() else []
    if others:
        raise TransferError(
            f"cannot import into {data_dir}: it is not empty (it holds {', '.join(others[:5])}); "
            "import into a new directory"
        )


_SQLITE_INSERTS = {
    "type_profile": sqlite_schema.UPSERT_TYPE_PROFILE,
    "entity": sqlite_schema.UPSERT_ENTITY,
    "event": sqlite_schema.INSERT_EVENT,
    "idempotency": sqlite_schema.INSERT_IDEMPOTENCY,
}


class _PostgresTarget:
    """An empty PostgreSQL database (migrated if new), written in one transaction."""

    _TABLES: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {
        "type_profile": ("type_profiles", _PROFILE_COLUMNS),
        "entity": ("entities", ENTITY_COLUMNS),
        "event": ("events", ("type", "id", *EVENT_COLUMNS)),
        "idempotency": ("idempotency", _IDEMPOTENCY_COLUMNS),
    }

    def __init__(self, conn: Any, url: str) -> None:
        self._conn = conn
        self._url = url

    @classmethod
    async def open(cls, url: str) -> _PostgresTarget:
        from ..store.postgres.schema import SchemaTooNew, migrate

        conn = await _connect(url, "electric import")
        try:
            try:
                await migrate(conn)
            except SchemaTooNew as exc:
                raise TransferError(f"the database {redacted(url)}: {exc}") from exc
            await _refuse_live(conn, url)
            await conn.execute("BEGIN")
            tables = ", ".join(table for table, _ in cls._TABLES.values())
            await conn.execute(f"LOCK TABLE {tables} IN EXCLUSIVE MODE")  # readers go on; no writer
            held = [
                t for t, _ in cls._TABLES.values() if await conn.fetchval(f"SELECT EXISTS (SELECT FROM {t})")
            ]
            if held:
                raise TransferError(
                    f"cannot import into the database {redacted(url)}: it is not empty (its {', '.join(held)} "
                    "hold rows); import into a new database"
                )
        except BaseException:
            conn.terminate()
            raise
        return cls(conn, url)

    async def add(self, kind: str, rows: list[tuple[Any, ...]]) -> None:
        import asyncpg

        table, columns = self._TABLES[kind]
        try:
            await self._conn.copy_records_to_table(table, records=rows, columns=list(columns))
        except (asyncpg.PostgresError, asyncpg.DataError) as exc:  # e.g. an event twice in the file
            raise TransferError(f"nothing was imported: {one(kind)} was refused: {exc}") from exc

    async def finish(self, head_txid: int) -> None:
        if head_txid > 0:  # the next txid drawn is above every imported one
            await self._conn.execute("SELECT setval('electric_txid', $1)", head_txid)
        await self._conn.execute("COMMIT")
        await self._conn.close()

    async def abort(self) -> None:
        self._conn.terminate()  # the transaction rolls back with the connection


_Target = _SQLiteTarget | _PostgresTarget


def _row(record: Record) -> tuple[Any, ...]:
    if isinstance(record, EntityRecord):
        return entity_row(record)
    if isinstance(record, EventRow):
        return (record.type, record.id, *record.event)
    return tuple(record)


def _txid(record: Record) -> int:
    if isinstance(record, EntityRecord):
        return record.txid
    return record.event.txid if isinstance(record, EventRow) else 0


async def import_store(
    source: Path,
    *,
    data_dir: Path | None = None,
    database_url: str | None = None,
    progress: Progress | None = None,
) -> Transferred:
    """Import the export file ``source`` into an empty store (``database_url``, else ``data_dir``)."""
    try:
        # Closed below, after the target; blocking is fine: an offline command, alone on its loop.
        text = open(source, encoding="utf-8")  # noqa: SIM115, ASYNC230
    except OSError as exc:
        raise TransferError(f"cannot read {source}: {exc.strerror}") from exc
    with text:
        reader = Reader(text)
        target: _Target = (
            await _PostgresTarget.open(database_url)
            if database_url
            else _SQLiteTarget(data_dir or DATA_DIR.value)
        )
        try:
            head = await _write_all(reader, target, progress)
        except BaseException:
            await target.abort()
            raise
        await target.finish(head)
    if progress:
        progress.tick(reader.counts, final=True)
    return Transferred(dict(reader.counts), head)


async def _write_all(reader: Reader, target: _Target, progress: Progress | None) -> int:
    head = reader.header.head_txid
    chunk: list[tuple[Any, ...]] = []
    chunk_kind = KINDS[0]
    try:
        for kind, record in reader.records():
            if kind != chunk_kind or len(chunk) >= _CHUNK:
                if chunk:
                    await target.add(chunk_kind, chunk)
                    if progress:
                        progress.tick(reader.counts)
                chunk, chunk_kind = [], kind
            head = max(head, _txid(record))
            chunk.append(_row(record))
        if chunk:
            await target.add(chunk_kind, chunk)
    except ExportFormatError as exc:
        raise TransferError(f"nothing was imported: {exc}") from exc
    return head
