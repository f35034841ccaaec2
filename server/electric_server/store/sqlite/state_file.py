"""The store's state file: was the last shutdown clean, and which txids may have been handed out.

``electric.state`` sits beside ``electric.db``: a small JSON object, e.g.
``{"format": 1, "state": "running", "txids_reserved_below": 30001}``. It is
written at open (``running``), at a clean close (``clean``) and once per block
of ``TXID_BLOCK`` txids, always whole and durably: a temporary file is
written and fsynced, renamed over the old one, and the directory fsynced, so
a crash leaves the old state or the new one, never a mix.

Why the store keeps it (as etcd keeps its own records beside its WAL):

- The txid reservation. Every txid handed out is below
  ``txids_reserved_below``; the store writes a higher one before it hands out
  a txid beyond it, so after a crash new txids start above the reservation,
  and none is ever handed out twice, even if the WAL (the commits since the
  last checkpoint) was lost.
- The clean shutdown. After a clean one the WAL was folded into the database
  and may be gone; after any other, a WAL must be there, so a missing one is
  damage (sqlite/damage.py).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["STATE_FORMAT", "TXID_BLOCK", "StateFile", "StoreState", "state_path"]

STATE_FORMAT = 1
# Txids reserved at a time: the state file is rewritten once per this many txids,
# and a crash skips at most this many.
TXID_BLOCK = 10_000


@dataclass(frozen=True, slots=True)
class StoreState:
    clean: bool  # the last shutdown was clean: the WAL was folded into the database
    reserved_below: int  # every txid ever handed out is below this


def state_path(db_path: Path) -> Path:
    """The state file of the database at ``db_path`` (``electric.db`` → ``electric.state``)."""
    return db_path.with_suffix(".state")


class StateFile:
    def __init__(self, db_path: Path) -> None:
        self.path = state_path(db_path)

    def read(self) -> StoreState | None:
        """The recorded state; None when there is no state file (a new or restored store).

        Raises ValueError, saying why, when the file is there but unreadable.
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{self.path.name} cannot be read: {exc}") from exc
        try:
            data = json.loads(text)
            if data.get("format") != STATE_FORMAT or data.get("state") not in ("running", "clean"):
                raise ValueError(f"unknown format or state: {text.strip()[:200]!r}")
            reserved = data["txids_reserved_below"]
            if not isinstance(reserved, int) or isinstance(reserved, bool) or reserved < 1:
                raise ValueError(f"txids_reserved_below is not a txid: {reserved!r}")
        except (ValueError, KeyError, AttributeError) as exc:
            raise ValueError(f"{self.path.name} is not a state file this server wrote ({exc})") from exc
        return StoreState(clean=data["state"] == "clean", reserved_below=reserved)

    def write(self, state: StoreState) -> None:
        """Replace the state file durably (see the module docstring); raises OSError."""
        data = {
            "format": STATE_FORMAT,
            "state": "clean" if state.clean else "running",
            "txids_reserved_below": state.reserved_below,
        }
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, (json.dumps(data) + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, self.path)
        except OSError:
            with contextlib.suppress(OSError):  # e.g. a full disk: leave no half-written file behind
                temporary.unlink()
            raise
        directory = os.open(self.path.parent, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
