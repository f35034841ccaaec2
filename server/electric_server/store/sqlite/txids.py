"""The SQLite store's txids: handed out in commit order, gap-free, and never twice, even after a
crash that lost the WAL.

Every txid handed out is below the reservation in the state file
(sqlite/state_file.py): a batch that needs a txid beyond it reserves the next
block, durably, before it commits, once per ``TXID_BLOCK`` txids. After an
unclean shutdown the next txid starts above the reservation (``first``), so
a txid a lost commit had acknowledged is never handed out again.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .damage import Inspection
from .state_file import TXID_BLOCK, StateFile, StoreState

__all__ = ["Txids"]

log = logging.getLogger(__name__)


class Txids:
    """The next txid and the reservation above it, for the database at ``path``."""

    __slots__ = ("_state_file", "next", "reserved_below")

    def __init__(self, path: Path) -> None:
        self._state_file = StateFile(path)
        self.next = 1
        # Every txid handed out is below this; the state file records it (see reserve).
        self.reserved_below = 1

    def start(self, next_txid: int) -> None:
        """At open: the next txid (``first``), recorded as running: until a clean close, a crash
        is assumed."""
        self.next = next_txid
        self.reserve(next_txid)

    @staticmethod
    def first(found: Inspection, stored: int) -> int:
        """The next txid: the database's (``stored``) after a clean shutdown; else above every txid
        that may have been handed out (the reservation), even if their commits were lost."""
        state = found.state
        if state is None:
            if found.problems:
                log.warning(
                    "no readable state file: txids continue from the database's, %d; ones handed out "
                    "before the damage may be handed out again",
                    stored,
                )
            return stored
        if state.clean and not found.problems:
            return stored
        first = max(stored, state.reserved_below)
        if found.problems and first > stored:
            log.warning(
                "txids %d-%d are skipped: some may have been acknowledged in what was dropped, so no new "
                "write takes one (new txids start at %d)",
                stored,
                first - 1,
                first,
            )
        elif first > stored:
            log.info("the last shutdown was not clean: txids continue from %d, above the reservation", first)
        return first

    def reserve(self, next_txid: int) -> None:
        """Record in the state file, durably, that txids below ``next_txid`` + a block may be handed
        out, before any of them commits (raises OSError, failing the batch)."""
        reserved = next_txid + TXID_BLOCK
        self._state_file.write(StoreState(clean=False, reserved_below=reserved))
        self.reserved_below = reserved

    def closed_cleanly(self) -> None:
        """The database is whole on its own at close: the next start continues from its txid."""
        try:
            self._state_file.write(StoreState(clean=True, reserved_below=self.reserved_below))
        except OSError as exc:
            # The next start takes the shutdown for a crash: txids skip a block, and the WAL,
            # which SQLite removes at close, is reported missing (--accept-data-loss: nothing is lost).
            log.warning("the clean shutdown could not be recorded in %s: %s", self._state_file.path, exc)
