"""What SQLite's errors are: the SQLite store's fault predicates (store/faults.py acts on them).

- **Full**: ``SQLITE_FULL``; ``ENOSPC`` or ``EDQUOT`` from the store's own
  files (``DiskFull``: writes pause until there is room again).
- **Failed**: ``SQLITE_IOERR``, ``SQLITE_READONLY``, ``SQLITE_CANTOPEN``,
  ``SQLITE_PERM``, ``SQLITE_NOLFS``; any other ``OSError``
  (``StorageFailed``, for good). SQLite returns these codes when the file or
  the file system stopped accepting writes (a file system remounted read-only
  after an error fails writes with an I/O error). A failed WAL sync is a
  failure for good whatever its errno (the committer's durability step).
- **Full at start**: a fault opening the store (often ``SQLITE_IOERR_SHMSIZE``:
  SQLite cannot size the WAL's shared-memory file) while the file system has
  less room than writes resume at (``full_at_start``): a ``DiskFull``, named so;
  the store then serves reads from the file opened read-only, if it can.
- **Damaged**: ``SQLITE_CORRUPT``, ``SQLITE_NOTADB`` (``DamagedStore``, for
  good too; the server exits 65).
- **Busy**: ``SQLITE_BUSY``, ``SQLITE_LOCKED``, after the 10 s busy timeout
  (``StoreBusy``): another process holds the database locked (no server can:
  the data directory's lock keeps a second one out).
- anything else is none of these: a bug or something unforeseen.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from ..base import DamagedStore, DiskFull, StorageFailed, StorageFault, StoreBusy

__all__ = ["DAMAGED_REMEDY", "classify", "full_at_start", "has_room", "roll_back"]

DAMAGED_REMEDY = (
    'what to do: restore a backup (docs/server.md, "Backups and restore"), or start the server with '
    "--accept-data-loss to drop what the damage cut off and go on"
)
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_FAILED_CODES = frozenset(
    {
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PERM,
        sqlite3.SQLITE_NOLFS,
    }
)
_DAMAGED_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


def classify(exc: BaseException, where: str) -> StorageFault | None:
    """The storage fault ``exc`` is (see the module docstring); None for anything else.

    ``where``: the data directory, named in the messages.
    """
    if isinstance(exc, StorageFault):
        return exc
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        name = getattr(exc, "sqlite_errorname", "") or "SQLite error"
        if code == sqlite3.SQLITE_FULL:
            return DiskFull(f"the disk holding {where} is full ({name}: {exc})")
        if code in _FAILED_CODES:
            return StorageFailed(f"the storage of {where} failed ({name}: {exc})")
        if code in _DAMAGED_CODES:
            return DamagedStore(f"the store in {where}", [f"SQLite reports {name}: {exc}"], DAMAGED_REMEDY)
        if code in _BUSY_CODES:
            return StoreBusy(f"another process holds the database in {where} locked ({name}: {exc})")
        return None
    if isinstance(exc, OSError):
        if exc.errno in _FULL_ERRNOS:
            return DiskFull(f"the disk holding {where} is full ({exc})")
        return StorageFailed(f"the storage of {where} failed ({exc})")
    return None


def full_at_start(fault: StorageFault, directory: Path, room: int) -> DiskFull | None:
    """The full disk ``fault`` is, when it met the store's opening while ``directory``'s file
    system has less than ``room`` bytes free; None otherwise (a fault of another kind, or a disk
    with room: then it is what it says)."""
    if isinstance(fault, DiskFull):
        return fault
    if not isinstance(fault, StorageFailed):
        return None
    free = _free(directory)
    if free is None or free >= room:
        return None
    return DiskFull(
        f"the disk holding {directory} is full ({free} bytes free) at the store's opening: {fault}"
    )


def has_room(directory: Path, room: int) -> bool:
    """Whether ``room`` bytes fit on ``directory``'s file system (unknown: try, and see)."""
    free = _free(directory)
    return free is None or free >= room


def _free(directory: Path) -> int | None:
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def roll_back(conn: sqlite3.Connection) -> None:
    """End a failed transaction, unless SQLite already did (it rolls back by itself after
    SQLITE_FULL and some I/O errors, and a ROLLBACK then fails). A connection left inside
    a transaction could write nothing more: that is a failure for good."""
    if not conn.in_transaction:
        return
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        if conn.in_transaction:
            raise StorageFailed(f"a failed transaction could not be rolled back ({exc})") from exc
