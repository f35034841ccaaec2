"""Each entity's commits to one replica's ``Hub`` in commit order, once, whichever replica made them.

Two sources publish on a replica: its writer (its own commits, the moment
they are acknowledged, as with one replica) and its feed reader (the other
replicas' commits, read from the ``commit_feed`` table; postgres/feed.py).
Nothing here does I/O. One rule orders them: a commit is published once the
commit before it on the same entity (``before.txid``) is, and until then it
is held. Txids increase per entity in commit order, so that chain is the
entity's commit order.

When is the commit before published? It is unless it is held here, or it
is this replica's own and its COMMIT is still under way (``committing``), or
it is another replica's that the reader has not read yet. The reader reads
in snapshots (``Snapshot``): every commit a snapshot covers has been read,
so for this replica's own writes, which know the transaction id (``xact``)
of the commit before theirs (the entity row keeps it), "not read yet" is
"not covered by the reader's last snapshot and not ours": such a write is
held and the reader asked to read soon. The commits the reader brings are
in txid order, and the commit before one of them is covered whenever it is,
so theirs is known.

A commit whose COMMIT was cut off (its outcome unknown) is not published by
its writer: its txids are left to the reader (``unknown``), which delivers
them if they committed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from .base import Commit

__all__ = ["FeedOrder", "Snapshot"]


class Snapshot(NamedTuple):
    """A PostgreSQL snapshot (``pg_snapshot``): which transactions had committed when it was taken."""

    xmin: int  # every transaction below it had ended
    xmax: int  # none from it on had
    xip: frozenset[int]  # those between that were in progress

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        """From ``pg_snapshot``'s text form, ``xmin:xmax:xip,xip,...``."""
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def text(self) -> str:
        return f"{self.xmin}:{self.xmax}:{','.join(map(str, sorted(self.xip)))}"

    def covers(self, xact: int) -> bool:
        """Whether the transaction ``xact`` had ended when the snapshot was taken."""
        return xact < self.xmin or (xact < self.xmax and xact not in self.xip)


class _Held(NamedTuple):
    commit: Commit
    # A local commit's: the transaction id of the commit before it (None: unknown or none).
    before_xact: int | None
    local: bool


class FeedOrder:
    """See the module docstring. ``publish`` takes commits in order; ``read_soon`` asks the reader
    for a fresh read (a local commit waits for another replica's that it has not read)."""

    def __init__(self, publish: Callable[[Sequence[Commit]], None], read_soon: Callable[[], None]) -> None:
        self._publish = publish
        self._read_soon = read_soon
        self.snapshot = Snapshot(0, 0, frozenset())
        # This replica's transactions that the last snapshot does not cover yet.
        self._own: set[int] = set()
        # Txids of local commits whose COMMIT is under way.
        self._committing: set[int] = set()
        # Own commits whose COMMIT was cut off: txid → its transaction's id, until a read covers it.
        self.unknown: dict[int, int] = {}
        # Commits waiting for the commit with this txid; and the txids of all held.
        self._held: dict[int, list[_Held]] = {}
        self._held_txids: set[int] = set()

    @property
    def held(self) -> int:
        return len(self._held_txids)

    def is_own(self, xact: int) -> bool:
        return xact in self._own

    def committing(self, xact: int, txids: Iterable[int]) -> None:
        """Before a local COMMIT: its transaction and the txids of its commits."""
        self._own.add(xact)
        self._committing.update(txids)

    def sending(self, txids: Iterable[int]) -> None:
        """Before a lone write's statement, which is its own COMMIT (postgres/one_trip.py), goes out:
        its txid (its transaction's id is known once it has committed: ``committing``)."""
        self._committing.update(txids)

    def forgotten(self, txids: Iterable[int]) -> None:
        """Sent txids that did not commit (a lone write that raced, failed, or was found out)."""
        self._committing.difference_update(txids)

    def committed(self, commits: Sequence[Commit], before_xacts: Sequence[int | None]) -> None:
        """A local COMMIT succeeded: its commits, each with the transaction id of the one before it."""
        self._committing.difference_update(c.txid for c in commits)
        ready: list[Commit] = []
        for commit, before_xact in zip(commits, before_xacts, strict=True):
            self._offer(_Held(commit, before_xact, True), ready)
        if ready:
            self._publish(ready)

    def lost(self, xact: int, txids: Iterable[int]) -> None:
        """A local COMMIT failed with its outcome unknown: the reader delivers what committed."""
        for txid in txids:
            self._committing.discard(txid)
            self.unknown[txid] = xact

    def read(self, snapshot: Snapshot, commits: Sequence[Commit]) -> None:
        """The reader's read: every commit the last snapshot did not cover and ``snapshot`` does
        (the other replicas', and own ones cut off in COMMIT), in txid order."""
        self.snapshot = snapshot
        self._own = {x for x in self._own if not snapshot.covers(x)}
        self.unknown = {t: x for t, x in self.unknown.items() if not snapshot.covers(x)}
        ready: list[Commit] = []
        for commit in commits:
            self._offer(_Held(commit, None, False), ready)
        # A local commit held for a commit the reader had to bring, now covered, whose row the
        # reader did not find (an electric from before the feed made it): nothing more will come.
        for waited, items in list(self._held.items()):
            if waited in self._held_txids or waited in self._committing:
                continue
            if all(self._before_read(item) for item in items):
                del self._held[waited]
                for item in items:
                    self._held_txids.discard(item.commit.txid)
                    self._offer(item, ready)
        if ready:
            self._publish(ready)

    def _before_read(self, item: _Held) -> bool:
        xact = item.before_xact
        return not item.local or xact is None or xact in self._own or self.snapshot.covers(xact)

    def _offer(self, item: _Held, ready: list[Commit]) -> None:
        """Publish ``item`` (into ``ready``) and what waited for it, or hold it."""
        before = item.commit.before
        if before is not None:
            waited = before.txid
            if waited in self._held_txids or waited in self._committing or not self._before_read(item):
                self._held.setdefault(waited, []).append(item)
                self._held_txids.add(item.commit.txid)
                if item.local:
                    self._read_soon()
                return
        ready.append(item.commit)
        for follower in self._held.pop(item.commit.txid, ()):
            self._held_txids.discard(follower.commit.txid)
            self._offer(follower, ready)
