"""How the SQLite store meets a failing disk: a full one pauses writes, a failed one stops them.

Every error a write meets (a commit, a WAL sync, a checkpoint, a purge) goes
through ``_fault``, which decides what it means, once, here:

- **Full** (``SQLITE_FULL``; ``ENOSPC`` or ``EDQUOT`` from the store's own
  files): the batch was rolled back, so nobody in it is acknowledged,
  published or shown to reads. Writes are refused at once with ``DiskFull``
  (the server answers ``UNAVAILABLE``/``DISK_FULL``) and reads go on. Every
  ``disk_full_retry_s`` the writer tries again by itself, off the loop
  (``SQLiteWal._try_again``), and once that works writes resume. A refused
  write costs nothing, so a flood of them cannot make the store spin. Logged
  once when it starts, once when it clears (``_resume``).
- **Failed** (a failed WAL sync, whatever its errno; ``SQLITE_IOERR``,
  ``SQLITE_READONLY``, ``SQLITE_CANTOPEN``, ``SQLITE_PERM``, ``SQLITE_NOLFS``;
  any other ``OSError``): ``StorageFailed``, for good. After a failed sync the
  kernel may already have dropped the data, and SQLite returns these codes
  when the file or the file system stopped accepting writes (a file system
  remounted read-only after an error fails writes with an I/O error), so
  retrying could report a write durable that is not: as PostgreSQL does on a
  failed fsync, the store acknowledges nothing more and the server stops
  (exit 74). Logged once, as critical.
- **Damaged** (``SQLITE_CORRUPT``, ``SQLITE_NOTADB``): ``DamagedStore``, for
  good too (exit 65).
- **Busy** (``SQLITE_BUSY``, ``SQLITE_LOCKED``, after the 10 s busy timeout):
  ``StoreBusy``; another process holds the database locked (no server can:
  the data directory's lock keeps a second one out). The batch fails, logged,
  and the writer goes on.
- **Anything else** is a bug or something unforeseen: logged with its
  traceback, the batch's writes fail with it (``INTERNAL``), and the writer
  goes on.

A read meets the same kinds (``_read_fault``) but changes nothing: only
writes can tell a full disk has room again.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from ..base import DamagedStore, DiskFull, FaultListener, StorageFailed, StorageFault, StoreBusy

__all__ = ["DAMAGED_REMEDY", "DISK_FULL_RETRY_S", "SQLiteFaults", "classify", "roll_back"]

log = logging.getLogger(__name__)

DISK_FULL_RETRY_S = 1.0
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


class SQLiteFaults:
    """The fault half of ``SQLiteStore``: what writes are refused with, and getting them back."""

    path: Path  # the database (store/sqlite.py)

    def __init__(self) -> None:
        super().__init__()
        # What writes are refused with right now (a full disk, or a failure for good), and
        # the failure for good if there was one: the store then takes no more writes.
        self._refusal: StorageFault | None = None
        self._failed: StorageFault | None = None
        self._full_since = 0.0
        self.disk_full_retry_s = DISK_FULL_RETRY_S
        self._fault_listeners: list[FaultListener] = []
        self._read_faults_logged: set[type[StorageFault]] = set()

    @property
    def _where(self) -> str:
        return str(self.path.parent)

    def subscribe_faults(self, callback: FaultListener) -> Callable[[], None]:
        self._fault_listeners.append(callback)
        return lambda: self._fault_listeners.remove(callback)

    def _notify(self, fault: StorageFault | None) -> None:
        for callback in tuple(self._fault_listeners):
            try:
                callback(fault)
            except Exception:
                log.exception("a listener to the store's faults failed")

    def _refuse_queued(self, error: BaseException) -> None:
        """Fail every write queued and not yet applied: a hook the writer class overrides (this
        mixin holds no queue); reaching it here would be a class built without its writer."""
        raise NotImplementedError("the store's writer provides _refuse_queued")

    def _fault(self, exc: BaseException, during: str) -> BaseException:
        """``exc`` met ``during`` a write's work: act on it (see the module docstring), and
        return what the writes it failed are told."""
        fault = classify(exc, self._where)
        if fault is None:
            log.error(
                "unexpected error in the store's writer during %s; the writer goes on", during, exc_info=exc
            )
            return exc
        if isinstance(fault, StoreBusy):  # another process's lock: this batch only
            log.error("%s during %s: its writes failed; the writer goes on", fault, during)
            return fault
        if isinstance(fault, DiskFull):
            return self._disk_full(fault, during)
        return self._fail(fault, during)

    def _disk_full(self, fault: DiskFull, during: str) -> StorageFault:
        if self._failed is not None:
            return self._failed.again()
        if self._refusal is None:
            log.error(
                "%s during %s: writes are refused (UNAVAILABLE/DISK_FULL) and reads go on. Free space "
                "on the file system of %s; writes resume by themselves (the store tries every %g s)",
                fault,
                during,
                self._where,
                self.disk_full_retry_s,
            )
            self._refusal = fault
            self._full_since = time.monotonic()
            self._refuse_queued(fault)
            self._notify(fault)
        return fault.again()

    def _fail(self, exc: BaseException, during: str, exc_info: BaseException | None = None) -> StorageFault:
        """Stop taking writes, for good: see the module docstring."""
        if self._failed is not None:
            return self._failed.again()
        fault = classify(exc, self._where)
        if fault is None or isinstance(fault, DiskFull):  # e.g. a failed WAL sync: never retried
            fault = StorageFailed(f"the storage of {self._where} failed ({type(exc).__name__}: {exc})")
        log.critical(
            "%s during %s: the store acknowledges no more writes, and the server stops. Check the "
            "disk and the file system of %s, then start the server again: it checks the files first",
            fault,
            during,
            self._where,
            exc_info=exc_info,
        )
        self._failed = self._refusal = fault
        self._refuse_queued(fault)
        self._notify(fault)
        return fault.again()

    def _read_fault(self, exc: BaseException) -> BaseException:
        """What a read that met ``exc`` raises: a storage fault, logged once per kind."""
        fault = classify(exc, self._where)
        if fault is None:
            return exc
        if type(fault) not in self._read_faults_logged:
            self._read_faults_logged.add(type(fault))
            log.error("a read failed: %s", fault)
        return fault

    def _resume(self) -> None:
        """The disk has room again: writes go on."""
        log.warning(
            "writes resume: the disk holding %s has room again (writes were refused for %.1f s)",
            self._where,
            time.monotonic() - self._full_since,
        )
        self._refusal = None
        self._notify(None)
