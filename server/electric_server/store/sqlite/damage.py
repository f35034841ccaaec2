"""What counts as damage in the store's files, found before SQLite opens them.

SQLite opens a damaged store without a word: it replays its WAL up to the
first frame that fails and drops the rest, and it starts on a database
missing its WAL or half its pages, failing only later, on a read. So the
store looks first, at open and in `electric verify`:

- the WAL (sqlite/walcheck.py): a header that fails its checksum, or a
  failing frame followed by a commit that verifies, is damage; failures only
  after the last commit are a torn tail, and accepted;
- a WAL missing after an unclean shutdown (the state file says the store was
  running, and the database is in WAL mode): the commits since the last
  checkpoint are gone;
- the database file: every page up to its size (the size after the WAL's last
  commit, else the header's page count, which is valid when the "version
  valid for" number at offset 92 matches the change counter at 24) must be
  in the file or in the WAL's replayed frames;
- the state file (sqlite/state_file.py): there, but unreadable; or the database
  gone while the state file says it held data.

What cannot be told apart is documented in docs/server.md, "Damage".
"""

from __future__ import annotations

import logging
import shutil
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from .state_file import StateFile, StoreState
from .walcheck import WalReport, read_wal, wal_path

__all__ = ["Inspection", "inspect_files", "inspect_settled", "keep_damaged_wal"]

_SQLITE_MAGIC = b"SQLite format 3\x00"

log = logging.getLogger(__name__)


@dataclass
class Inspection:
    """The store's files as found: what is damaged, and what SQLite and the store will start from."""

    problems: list[str] = field(default_factory=list)
    state: StoreState | None = None  # the state file's record, if it was readable
    wal: WalReport | None = None

    @property
    def snapshot(self) -> tuple[object, ...]:
        """What changes when a live server restarts its WAL or closes (verify looks twice):
        not the WAL's length, since appends do not move what was read before them."""
        return (self.state, self.wal.generation if self.wal is not None else None)


def _database_problems(db: Path, wal: WalReport | None, state: StoreState | None) -> list[str]:
    try:
        size = db.stat().st_size
        with db.open("rb") as f:
            header = f.read(100)
    except FileNotFoundError:
        if state is None:
            return []  # a new store
        return [
            f"{db.name} is missing, yet {StateFile(db).path.name} says the store held data "
            f"(to start afresh on purpose, remove {StateFile(db).path.name} too)"
        ]
    if size == 0:
        if state is None or (wal is not None and wal.commits):
            return []  # a new store, or one whose whole content is still in the WAL
        return [f"{db.name} is empty, yet {StateFile(db).path.name} says the store held data"]
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        return [f"{db.name} is not an SQLite database: its header is unreadable"]
    page_size = struct.unpack_from(">H", header, 16)[0]
    page_size = 65536 if page_size == 1 else page_size
    change_counter, header_pages = struct.unpack_from(">II", header, 24)
    valid_for = struct.unpack_from(">I", header, 92)[0]
    if page_size < 512 or page_size & (page_size - 1):
        return [f"{db.name}'s header names a page size of {page_size}"]
    if wal is not None and wal.commits and wal.page_size == page_size:
        expected, source = wal.db_pages, "its size after the WAL's last commit"
    elif header_pages and change_counter == valid_for:
        expected, source = header_pages, "its header's page count"
    else:
        return []  # the header's count is stale and the WAL says nothing: nothing to compare
    present = size // page_size
    in_wal = wal.pages if wal is not None else set()
    missing = [page for page in range(present + 1, expected + 1) if page not in in_wal]
    if not missing:
        return []
    return [
        f"{db.name} holds {present} of its {expected} pages ({source}), and {len(missing)} of the "
        "missing ones are not in the WAL either: what they held is lost"
    ]


def inspect_files(db: Path) -> Inspection:
    """Look at the database, its WAL and its state file (read-only). Raises OSError if one is unreadable."""
    found = Inspection()
    try:
        found.state = StateFile(db).read()
    except ValueError as exc:
        found.problems.append(str(exc))
    found.wal = read_wal(wal_path(db))
    if found.wal is not None:
        found.problems.extend(found.wal.damage)
    elif found.state is not None and not found.state.clean and _in_wal_mode(db):
        found.problems.append(
            f"{wal_path(db).name} is missing after an unclean shutdown: the commits since the last "
            "checkpoint are lost"
        )
    found.problems.extend(_database_problems(db, found.wal, found.state))
    return found


def _in_wal_mode(db: Path) -> bool:
    """Whether the database's header says WAL mode (its read and write versions are 2)."""
    try:
        with db.open("rb") as f:
            header = f.read(20)
    except FileNotFoundError:
        return False
    return len(header) == 20 and header.startswith(_SQLITE_MAGIC) and header[18:20] == b"\x02\x02"


def inspect_settled(db: Path, attempts: int = 3) -> Inspection:
    """``inspect_files`` beside a live server: a look that found damage counts only if
    the files did not change under it (the WAL restarted, the server closed)."""
    found = inspect_files(db)
    for _ in range(attempts - 1):
        if not found.problems:
            break
        again = inspect_files(db)
        if again.snapshot == found.snapshot:
            break
        found = again
    return found


def keep_damaged_wal(db: Path) -> None:
    """Copy a damaged WAL aside before SQLite reads it and the store folds it away."""
    wal = wal_path(db)
    if not wal.exists():
        return
    kept = wal.with_name(f"{wal.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
    try:
        shutil.copyfile(wal, kept)
    except OSError as exc:
        log.warning("the damaged WAL could not be kept (%s): it is folded into the database as it is", exc)
    else:
        log.warning("the damaged WAL is kept as %s", kept)
