"""`electric backup` and `electric restore`: a consistent copy of a live store, and putting one back.

A backup is taken with SQLite's online backup API from a read-only
connection, in one step: one read transaction, so the copy is the store as of
one commit, while the server goes on writing (WAL readers never block the
writer). It needs no lock and writes nothing in the data directory. The copy
is written as a temporary file beside the output, fsynced and renamed, so an
output file is always a whole backup; it is a single SQLite file in rollback
mode (no ``-wal`` beside it). Every write acknowledged before the backup began
is in it; writes still being synced may be too.

A restore refuses a data directory that a process holds (``LOCK``, see
datadir.py) or that holds anything else, checks the backup (SQLite's
integrity check and the store's tables) before writing, and holds the
directory's lock while it writes ``electric.db`` (temporary file, fsync,
rename, directory fsync), so no server can start on a half-restored
directory. It writes nothing else but ``LOCK``: no WAL, no other state.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..store.sqlite.schema import SELECT_NEXT_TXID
from .datadir import LOCK_NAME, DataDirLock, database_path, lock_path

# The tables every electric store has (store/sqlite/schema.py).
STORE_TABLES = frozenset({"entities", "events", "idempotency", "meta"})
# How long the backup's read-only connection waits on a lock the server holds briefly.
BUSY_TIMEOUT_MS = 10_000


class BackupError(ValueError):
    """A backup or restore that was refused or failed; nothing was written (the CLI exits 2)."""


@dataclass(frozen=True)
class StoreCopy:
    """What a backup or a restore wrote: the file and what it holds."""

    path: Path
    entities: int
    events: int
    head_txid: int  # the highest txid committed in the copy (0: none)
    size_bytes: int


def backup_data_dir(data_dir: Path, out: Path, *, force: bool = False) -> StoreCopy:
    """Copy ``data_dir``'s store, live or not, to the file ``out``.

    Raises BackupError if there is no store to copy, ``out`` exists (unless
    ``force``) or its directory does not, or the copy fails.
    """
    source = database_path(data_dir)
    if not source.is_file():
        what = "no data directory" if not data_dir.is_dir() else "no electric database"
        raise BackupError(f"{what} at {data_dir} (expected {source})")
    if out.is_dir():
        raise BackupError(f"{out} is a directory; name the backup file")
    if out.exists() and not force:
        raise BackupError(f"{out} exists; pass --force to overwrite it")
    if not out.parent.is_dir():
        raise BackupError(f"no directory {out.parent} to write {out.name} in")
    with _connect_readonly(source, "the data directory's store") as src:
        _check_tables(src, source)
        return _copy(src, out, what=f"back up {source} to {out}")


def restore_data_dir(backup: Path, data_dir: Path) -> StoreCopy:
    """Put the backup file ``backup`` back as ``data_dir``'s store.

    Raises DataDirLocked (a ConfigError) if a process holds ``data_dir``, and
    BackupError if it holds anything else, or ``backup`` is not a sound
    electric store.
    """
    if not backup.is_file():
        raise BackupError(f"no backup file at {backup}")
    with _connect_readonly(backup, "the backup") as src:
        _check_tables(src, backup)
        _check_integrity(src, backup)
        if data_dir.is_dir() and not lock_path(data_dir).exists():
            _refuse_unless_empty(data_dir)  # before creating LOCK in a directory that is not ours
        lock = DataDirLock.acquire(data_dir, "electric restore")  # a running server: DataDirLocked
        try:
            _refuse_unless_empty(data_dir)
            return _copy(src, database_path(data_dir), what=f"restore {backup} into {data_dir}")
        finally:
            lock.release()


def _refuse_unless_empty(data_dir: Path) -> None:
    others = sorted(p.name for p in data_dir.iterdir() if p.name != LOCK_NAME)
    if others:
        raise BackupError(
            f"cannot restore into {data_dir}: it is not empty (it holds {', '.join(others[:5])}); "
            "restore into a new directory, or move these away first"
        )


@contextlib.contextmanager
def _connect_readonly(path: Path, what: str) -> Iterator[sqlite3.Connection]:
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    except sqlite3.Error as exc:
        raise BackupError(f"cannot open {what} {path}: {exc}") from exc
    try:
        yield conn
    finally:
        conn.close()


def _check_tables(conn: sqlite3.Connection, path: Path) -> None:
    try:
        tables = {str(row[0]) for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as exc:  # "file is not a database", and the like
        raise BackupError(f"{path} is not an electric store: {exc}") from exc
    missing = STORE_TABLES - tables
    if missing:
        raise BackupError(f"{path} is not an electric store: it has no {', '.join(sorted(missing))} table")


def _check_integrity(conn: sqlite3.Connection, path: Path) -> None:
    try:
        problems = [str(row[0]) for row in conn.execute("PRAGMA integrity_check").fetchall()]
    except sqlite3.Error as exc:  # damaged past what the check itself can read
        problems = [str(exc)]
    if problems != ["ok"]:
        raise BackupError(
            f"{path} is damaged (SQLite's integrity check: {'; '.join(problems[:5])}); "
            "nothing was restored: restore an older backup"
        )


def _copy(src: sqlite3.Connection, out: Path, *, what: str) -> StoreCopy:
    """Copy ``src`` into a new file beside ``out``, make it durable, and rename it to ``out``."""
    tmp = out.with_name(f".{out.name}.{secrets.token_hex(4)}.tmp")
    created = False
    try:
        # O_EXCL: never someone else's file; 0o644 less the umask, as SQLite creates a database.
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
        created = True
        dst = sqlite3.connect(tmp, isolation_level=None)
        try:
            src.backup(dst)  # all pages in one step: one read transaction, one consistent snapshot
            # A single self-contained file: opening it later creates no -wal beside it.
            dst.execute("PRAGMA journal_mode=DELETE")
            entities, events, head_txid = _counts(dst)
        finally:
            dst.close()
        fsync_path(tmp)
        tmp.replace(out)
        fsync_path(out.parent)
    except (sqlite3.Error, OSError) as exc:  # e.g. a full disk: out is as it was
        raise BackupError(f"could not {what}: {exc}") from exc
    finally:
        if created:
            for leftover in (tmp, tmp.with_name(tmp.name + "-journal")):
                leftover.unlink(missing_ok=True)
    return StoreCopy(out, entities, events, head_txid, out.stat().st_size)


def _counts(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """Entities, events, and the highest txid committed."""
    (entities,) = conn.execute("SELECT count(*) FROM entities").fetchone()
    (events,) = conn.execute("SELECT count(*) FROM events").fetchone()
    row = conn.execute(SELECT_NEXT_TXID).fetchone()
    return int(entities), int(events), int(row[0]) - 1 if row else 0


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
