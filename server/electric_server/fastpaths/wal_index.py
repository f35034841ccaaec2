"""The ``wal_index`` seam: how many frames SQLite has appended to the WAL since a checkpoint.

The SQLite store checkpoints the WAL itself, every ``CHECKPOINT_FRAMES``
frames (store/sqlite/wal.py), so it must know how many a commit appended.
SQLite says so in the header of its WAL index, the ``-shm`` file beside the
database: a documented part of its file format (walformat.html, "The
WAL-Index Header"; unchanged since 3.7.0), but not an interface SQLite
promises to keep. ``WalIndex`` reads it; a count read wrong costs an early or
late checkpoint, never data.

The fallback, where the header is not one ``WalIndex`` reads or
``ELECTRIC_FORCE_FALLBACKS`` names ``wal_index``, is ``Estimate``: a write
counted as ``FRAMES_PER_WRITE`` frames, as the store counted before it read
the header. It checkpoints more often than needed under group commit (a batch
of 256 signals to one entity appends 13 frames, not 768), never less. The
size of the WAL file would not do instead: after a checkpoint SQLite writes
the WAL again from its start without shrinking it, so its size tells how
large it has ever been, not what was appended since.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import struct
from pathlib import Path
from typing import Protocol

from . import ENV, forced

__all__ = ["FRAMES_PER_WRITE", "Estimate", "FrameCounter", "WalIndex", "frame_counter"]

log = logging.getLogger(__name__)

# The pages a lone write changes: its event's, its entity's, an index's.
FRAMES_PER_WRITE = 3


class FrameCounter(Protocol):
    """Counts the frames appended to the WAL since the last checkpoint."""

    def appended(self, counted: int, writes: int) -> int:
        """The count after a commit of ``writes`` writes; ``counted``: the count before it."""
        ...

    def checkpointed(self) -> None:
        """A checkpoint is about to run: count from the WAL as it is now."""
        ...

    def close(self) -> None: ...


class Estimate:
    """The fallback: ``FRAMES_PER_WRITE`` frames per write (see the module docstring)."""

    def appended(self, counted: int, writes: int) -> int:
        return counted + writes * FRAMES_PER_WRITE

    def checkpointed(self) -> None:
        pass

    def close(self) -> None:
        pass


class WalIndex:
    """Reads the frame count from the header of SQLite's WAL index.

    The header: iVersion (u32, 3007000) at 0, mxFrame (u32, the last valid
    frame) at 16, and the salts at 32, which change whenever the WAL restarts
    from its beginning; native byte order. Read with pread, not mmap, so a
    truncated file can only fail a read, never fault the process.
    """

    _HEADER = struct.Struct("=I12xI12xII")  # iVersion, mxFrame, aSalt[0], aSalt[1]
    _VERSION = 3007000

    def __init__(self, fd: int, salts: tuple[int, int]) -> None:
        self._fd = fd
        # The WAL as the last checkpoint left it (frames, salts): frames appended
        # since are counted from there, or from zero once the WAL has restarted.
        # Frames already in the WAL when it is opened (the schema's, or a previous
        # run's) count too.
        self._checkpointed_at = (0, salts)

    @classmethod
    def open(cls, db_path: Path) -> WalIndex | None:
        """The database's WAL index, or None where its header is not one this reads."""
        try:
            fd = os.open(f"{db_path}-shm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        index = cls(fd, (0, 0))
        wal = index.read()
        if wal is None:
            index.close()
            return None
        index._checkpointed_at = (0, wal[1])
        return index

    def read(self) -> tuple[int, tuple[int, int]] | None:
        """(frames in the WAL, the WAL's salts), or None if the header is unreadable."""
        try:
            data = os.pread(self._fd, self._HEADER.size, 0)
        except OSError:
            return None
        if len(data) < self._HEADER.size:
            return None
        version, frames, salt1, salt2 = self._HEADER.unpack(data)
        return (frames, (salt1, salt2)) if version == self._VERSION else None

    def appended(self, counted: int, writes: int) -> int:
        # read(), inlined: this runs once per commit.
        try:
            data = os.pread(self._fd, self._HEADER.size, 0)
        except OSError:
            data = b""
        if len(data) == self._HEADER.size:
            frames: int
            version, frames, salt1, salt2 = self._HEADER.unpack(data)
            if version == self._VERSION:
                at_frames, at_salts = self._checkpointed_at
                # The same salts: the WAL still holds what the last checkpoint saw (it
                # may not have copied all of it, e.g. for a reader's snapshot); new
                # ones, or fewer frames: it restarted.
                restarted = (salt1, salt2) != at_salts or frames < at_frames
                return frames if restarted else frames - at_frames
        return counted + writes * FRAMES_PER_WRITE  # unreadable this once: the estimate

    def checkpointed(self) -> None:
        self._checkpointed_at = self.read() or self._checkpointed_at

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


@functools.cache
def _announce(level: int, message: str) -> None:
    """Log ``message`` the first time only: every store a process opens takes the same path."""
    log.log(level, message)


def frame_counter(db_path: Path) -> FrameCounter:
    """The frame counter for the SQLite database at ``db_path`` (in WAL mode, open)."""
    if forced("wal_index"):
        _announce(logging.INFO, f"{ENV}: checkpoints follow an estimate of the frames written")
        return Estimate()
    index = WalIndex.open(db_path)
    if index is None:
        # Checkpoints then run more often than needed: news for an operator.
        _announce(
            logging.WARNING,
            "the WAL index header is not one this reads: checkpoints follow an estimate of the frames written",
        )
        return Estimate()
    _announce(logging.DEBUG, "checkpoints follow the frames the WAL index header counts")
    return index
