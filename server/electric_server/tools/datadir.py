"""A data directory: its layout (the database, ``LOCK``) and the lock that keeps it to one process.

Two servers on one directory would both write and hand out the same txids, so
every process that writes a data directory (``ElectricServer.start``, and so
``electric server``, ``electric dev``, ``TestServer``; and ``electric
restore``) first takes an exclusive ``flock`` on ``DIR/LOCK`` and holds it for
as long as it may write. ``flock`` rather than SQLite's exclusive locking mode,
which would also shut out the read-only readers (``electric verify``,
``electric backup``) that may run beside a live server.

- The lock belongs to one open file description: a second ``DataDirLock`` in
  the same process conflicts as a second process does, and closing the file
  (``release``) or the process ending, even by kill -9, frees it. The file
  stays behind; a stale ``LOCK`` holds no lock.
- The descriptor is close-on-exec, so processes the server starts (exec
  entities' commands) never inherit the lock.
- ``LOCK`` holds one JSON line naming the holder (pid, what it is, since when,
  where it listens), for the message the next process prints. It is never
  unlinked: a process that opened the old file could then lock it while a
  third locks a new one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from ..config_error import ConfigError

log = logging.getLogger("electric.server")

DATABASE_NAME = "electric.db"
LOCK_NAME = "LOCK"
# What a holder writes into LOCK stays well below this.
MAX_HOLDER_BYTES = 4096


def database_path(data_dir: Path) -> Path:
    """The SQLite database in a data directory."""
    return data_dir / DATABASE_NAME


def lock_path(data_dir: Path) -> Path:
    return data_dir / LOCK_NAME


class DataDirError(ConfigError):
    """A data directory that cannot be used: missing and not creatable, read-only, not a directory."""


@dataclass(frozen=True)
class Holder:
    """Who holds a data directory's lock, as its ``LOCK`` file says."""

    pid: int | None
    by: str = ""
    since: str = ""
    address: str = ""

    @classmethod
    def parse(cls, text: bytes) -> Holder:
        try:
            fields = json.loads(text)
            pid = fields["pid"]
            if not isinstance(pid, int):
                raise TypeError(pid)
            return cls(
                pid, str(fields.get("by", "")), str(fields.get("since", "")), str(fields.get("address", ""))
            )
        except (ValueError, TypeError, KeyError):  # empty or mid-rewrite: the lock itself is what counts
            return cls(None)

    def __str__(self) -> str:
        parts = [self.by or "a process", f"pid {self.pid}" if self.pid is not None else "pid unknown"]
        if self.since:
            parts.append(f"since {self.since}")
        if self.address:
            parts.append(f"listening on {self.address}")
        return ", ".join(parts)


class DataDirLocked(DataDirError):
    """Another process holds the data directory's lock (a server is running on it)."""

    def __init__(self, data_dir: Path, holder: Holder) -> None:
        self.data_dir = data_dir
        self.holder = holder
        super().__init__(
            f"the data directory {data_dir} is in use by another process ({holder}): "
            "only one server may use a data directory; stop that one first, or use another --data"
        )


class DataDirLock:
    """An exclusive ``flock`` on ``DIR/LOCK``, held until ``release()`` or the process ends."""

    def __init__(self, data_dir: Path, fd: int, holder: Holder, created: bool = False) -> None:
        self.data_dir = data_dir
        self._fd: int | None = fd
        self.holder = holder
        self.created = created  # the directory was made by ``acquire``

    @classmethod
    def acquire(cls, data_dir: Path, by: str) -> DataDirLock:
        """Create the directory if missing and lock it for ``by`` (e.g. "electric server").

        Raises DataDirLocked if another process (or another lock in this one)
        holds it, and DataDirError if the directory cannot be made or locked.
        """
        if data_dir.exists() and not data_dir.is_dir():
            raise DataDirError(f"the data directory {data_dir} is not a directory")
        created = not data_dir.exists()
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DataDirError(f"cannot create the data directory {data_dir}: {exc.strerror}") from exc
        path = lock_path(data_dir)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            hint = " (the directory is read-only)" if exc.errno in (errno.EROFS, errno.EACCES) else ""
            raise DataDirError(
                f"cannot lock the data directory {data_dir}: {path}: {exc.strerror}{hint}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Holder.parse(os.pread(fd, MAX_HOLDER_BYTES, 0))
            os.close(fd)
            raise DataDirLocked(data_dir, holder) from None
        except OSError as exc:  # e.g. ENOLCK: a filesystem without locks
            os.close(fd)
            raise DataDirError(f"cannot lock the data directory {data_dir}: {path}: {exc.strerror}") from exc
        holder = Holder(os.getpid(), by, datetime.now(UTC).isoformat(timespec="seconds"))
        lock = cls(data_dir, fd, holder, created)
        lock._write_holder()
        return lock

    def listening_on(self, address: str) -> None:
        """Add the holder's address to ``LOCK`` once it is known (after the bind)."""
        self.holder = replace(self.holder, address=address)
        self._write_holder()

    def _write_holder(self) -> None:
        if self._fd is None:
            return
        holder = self.holder
        text = json.dumps({k: v for k, v in asdict(holder).items() if v}).encode() + b"\n"
        try:
            # Over the old text, then cut to length: a reader never sees an empty file mid-rewrite.
            os.pwrite(self._fd, text, 0)
            os.ftruncate(self._fd, len(text))
        except OSError as exc:  # only a message depends on it (a full disk must not stop the server)
            log.warning("could not write the lock holder into %s: %s", lock_path(self.data_dir), exc)

    def release(self) -> None:
        """Free the lock; safe to call more than once."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # a stale LOCK names nobody
        os.close(fd)  # closing the last descriptor of the file description frees the flock

    def discard(self) -> None:
        """Release, and remove the directory if ``acquire`` made it and it holds nothing else: a
        command that failed (an import refused) leaves no directory behind. Made moments ago by
        this process, it is known to no other (one that opened its LOCK meanwhile would lock a
        file no longer there)."""
        self.release()
        if not self.created:
            return
        with contextlib.suppress(OSError):
            if [p.name for p in self.data_dir.iterdir()] == [LOCK_NAME]:
                lock_path(self.data_dir).unlink()
                self.data_dir.rmdir()

    @property
    def held(self) -> bool:
        return self._fd is not None
