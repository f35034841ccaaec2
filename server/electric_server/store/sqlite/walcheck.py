"""SQLite's WAL file read by its documented format, to tell damage from a torn tail.

The format (sqlite.org/fileformat2.html, "The Write-Ahead Log File"): a
32-byte header (magic 0x377f0682 or 0x377f0683, format version 3007000, page
size, checkpoint sequence, two salts, a checksum of the first 24 bytes), then
frames of a 24-byte header (page number; for the last frame of a
transaction, its commit frame, the database's size in pages; the salts; a
checksum) and one page. Checksums are cumulative: each frame's covers its
first 8 header bytes and its page, starting from the previous frame's (the
header's for the first), in 32-bit words, big-endian if the magic's low bit
is set and little-endian otherwise.

Opening a database, SQLite replays the frames up to the first whose salts or
checksum fail, through the last commit frame before it, and silently drops
everything after. That is right for a torn tail (a commit cut short by a
crash was never acknowledged), and wrong for damage: one flipped byte in the
middle would drop every commit after it. The two differ in what follows the
failing frame: after damage, a later commit frame with the current salts
still verifies, checked from the checksum stored in the frame before it;
after a torn tail, nothing does (frames of an older generation of the WAL
carry other salts). So does etcd tell a damaged WAL from a torn one.

Read only before the store opens its database and by `electric verify`:
never on the write path.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["WalReport", "read_wal", "wal_path"]

_MAGIC = (0x377F0682, 0x377F0683)
_VERSION = 3007000
_HEADER = struct.Struct(">8I")  # magic, version, page size, checkpoint seq, salt 1, salt 2, checksum 1, 2
_FRAME = struct.Struct(">6I")  # page, commit size, salt 1, salt 2, checksum 1, 2
_MASK = 0xFFFFFFFF


def wal_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + "-wal")


def _checksum(data: bytes, s0: int, s1: int, big_endian: bool) -> tuple[int, int]:
    """SQLite's WAL checksum of ``data`` (a multiple of 8 bytes), continuing from (s0, s1)."""
    words = iter(struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data))
    for x0, x1 in zip(words, words, strict=True):
        s0 = (s0 + x0 + s1) & _MASK
        s1 = (s1 + x1 + s0) & _MASK
    return s0, s1


@dataclass
class WalReport:
    """What a WAL file holds, as SQLite will read it and as it was written."""

    name: str
    size: int
    # Why the header cannot be read ("" when it can); a header that fails drops every frame.
    header_problem: str = ""
    # The header's checkpoint sequence and salts: they change whenever SQLite restarts the WAL.
    generation: tuple[int, int, int] = (0, 0, 0)
    page_size: int = 0
    frames: int = 0  # whole frames in the file
    # The frames SQLite replays (through the last commit of the prefix that verifies), their
    # commits, the database's size in pages after the last one, and the pages they hold.
    valid_frames: int = 0
    commits: int = 0
    db_pages: int = 0
    pages: set[int] = field(default_factory=set)
    # The first frame SQLite stops at, if any (0-based), and the commit frames with the
    # current salts that verify after it: damage, not a torn tail, when there are any.
    first_failure: int | None = None
    commits_after_failure: int = 0
    last_commit_after_failure: int = 0

    @property
    def damage(self) -> list[str]:
        """What is damaged, and what SQLite would drop because of it."""
        if self.header_problem:
            frames = f"its {self.frames} frame(s)" if self.frames else "the frames after it"
            return [
                f"{self.name}: {self.header_problem}, so none of {frames} can be read: every commit "
                "since the last checkpoint would be dropped"
            ]
        if self.commits_after_failure and self.first_failure is not None:
            return [
                f"{self.name}: frame {self.first_failure + 1} of {self.frames} fails its checksum, yet "
                f"{self.commits_after_failure} later commit(s) verify (the last in frame "
                f"{self.last_commit_after_failure + 1}): SQLite would stop at frame "
                f"{self.first_failure + 1} and drop frames {self.first_failure + 1}-{self.frames}"
            ]
        return []


def read_wal(path: Path) -> WalReport | None:
    """The report on the WAL at ``path``; None when there is none. Raises OSError if unreadable."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return None
    with f:
        data = f.read()
    report = WalReport(path.name, len(data))
    if len(data) < _HEADER.size:
        return report  # empty, or a first write cut short: nothing was committed in it
    magic, version, page_size, sequence, salt1, salt2, c1, c2 = _HEADER.unpack_from(data)
    report.generation = (sequence, salt1, salt2)
    if magic not in _MAGIC:
        report.header_problem = "the header is not a WAL header"
        return report
    big_endian = bool(magic & 1)
    if _checksum(data[:24], 0, 0, big_endian) != (c1, c2):
        report.header_problem = "the header's checksum fails"
    elif version != _VERSION or page_size < 512 or page_size > 65536 or page_size & (page_size - 1):
        report.header_problem = f"the header names format {version} and page size {page_size}"
    if report.header_problem:
        # Count the frames as if the page size were the usual one, for the message.
        report.frames = (len(data) - _HEADER.size) // (4096 + _FRAME.size)
        return report
    report.page_size = page_size
    frame_size = _FRAME.size + page_size
    report.frames = (len(data) - _HEADER.size) // frame_size
    salts = (salt1, salt2)
    previous = (c1, c2)  # the checksum stored before the frame at hand
    pending: set[int] = set()  # pages of the transaction not yet committed
    for i in range(report.frames):
        at = _HEADER.size + i * frame_size
        page, commit_size, s1, s2, k1, k2 = _FRAME.unpack_from(data, at)
        if report.first_failure is None:
            body = data[at : at + 8] + data[at + _FRAME.size : at + frame_size]
            if (s1, s2) == salts and page and _checksum(body, *previous, big_endian) == (k1, k2):
                pending.add(page)
                if commit_size:
                    report.valid_frames = i + 1
                    report.commits += 1
                    report.db_pages = commit_size
                    report.pages |= pending
                    pending = set()
            else:
                report.first_failure = i
        elif commit_size and (s1, s2) == salts and page:
            # Past the failure only a commit frame with the current salts matters; it is
            # checked from the checksum stored in the frame before it, as it was written.
            body = data[at : at + 8] + data[at + _FRAME.size : at + frame_size]
            if _checksum(body, *previous, big_endian) == (k1, k2):
                report.commits_after_failure += 1
                report.last_commit_after_failure = i
        previous = (k1, k2)
    return report
