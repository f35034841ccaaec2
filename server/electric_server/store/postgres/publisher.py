"""How a PostgreSQL replica's commits reach its ``Hub``: straight, or through the ``FeedOrder`` with
every other replica's, in each entity's commit order, and the doorbell that tells the others.

Without the commit feed (a tool's store) a batch's commits go straight to the
hub, as SQLite's do. With it, the hub's batch listeners hear of the batch at
once, and its commits go to the ``FeedOrder`` (store/feed_order.py), which
publishes each once the commit before it on its entity is published, this
replica's or another's; the doorbell then rings, off the commit's path
(postgres/feed.py). Every commit this replica sees, its own or read from the
feed, is also what it knows of the entity (postgres/known.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from ..base import REMOTE_COMMIT, Commit
from ..feed_order import FeedOrder
from ..hub import Hub
from .known import Known

__all__ = ["Publisher"]


class Doorbell(Protocol):
    def ring(self, xact: int) -> None: ...


class Reader(Protocol):
    def read_soon(self) -> None: ...


class Publisher:
    """See the module docstring. ``took_writes``: told when a write commits (the database takes
    writes: postgres/reachability.py)."""

    __slots__ = ("doorbell", "hub", "known", "order", "reader", "took_writes")

    def __init__(self, hub: Hub, known: Known, took_writes: Callable[[], None]) -> None:
        self.hub = hub
        self.known = known
        self.took_writes = took_writes
        # With the commit feed open (set by the store): the order, what rings, what reads.
        self.order: FeedOrder | None = None
        self.doorbell: Doorbell | None = None
        self.reader: Reader | None = None

    def committed(
        self,
        commits: Sequence[Commit],
        writes: int,
        started: float,
        xact: int,
        before_xacts: Mapping[int, int | None],
    ) -> None:
        """A batch's commits, in its transaction ``xact``; ``before_xacts``: by txid, the transaction
        that wrote each commit's entity before it."""
        for commit in commits:
            assert commit.after is not None
            self.known.learn(commit.after, xact)
        order = self.order
        if order is None:
            self.hub.committed(commits, writes, started)
            return
        self.hub.acknowledged(commits, writes, started)
        order.committed(commits, [before_xacts[c.txid] for c in commits])
        if commits and self.doorbell is not None:
            self.doorbell.ring(xact)

    def alone(self, commit: Commit | None, started: float, xact: int | None, before_xact: int | None) -> None:
        """A lone write's end (postgres/one_trip.py): its commit, if it made one, and its
        transaction (None: nothing was committed)."""
        self.hub.acknowledged([commit] if commit is not None else [], 1, started)
        if commit is not None and xact is not None:
            self.late(commit, xact, before_xact)

    def late(self, commit: Commit, xact: int, before_xact: int | None) -> None:
        """A lone write's commit, once its statement has committed (or was found to have)."""
        order = self.order
        assert order is not None
        order.committing(xact, ())
        order.committed([commit], [before_xact])
        if self.doorbell is not None:
            self.doorbell.ring(xact)

    def forgotten(self, txid: int) -> None:
        """A lone write found not to have committed: the entity's later commits wait no more."""
        if self.order is not None:
            self.order.forgotten((txid,))

    def remote(self, commits: Sequence[Commit]) -> None:
        """The ``FeedOrder``'s publication: commits to this replica's hub, in order; the other
        replicas' are known from then."""
        for commit in commits:
            if commit.result is REMOTE_COMMIT and commit.after is not None:
                self.known.learn(commit.after, None)  # read by the feed: nothing to wait for
        self.hub.publish_many(commits)

    def read_soon(self) -> None:
        """The ``FeedOrder`` asks for a read (a local commit waits for another replica's)."""
        if self.reader is not None:
            self.reader.read_soon()
