"""The in-process fan-out of a store's commits to live subscribers (the watches, the metrics,
the runtime), and of its acknowledged batches to the batch listeners."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from .base import Commit, Ref

__all__ = ["BatchListener", "Hub"]

log = logging.getLogger(__name__)


# A committed batch: its commits, how many writes it held (refused and replayed ones too), and
# the seconds from the start of its commit to its acknowledgement.
BatchListener = Callable[[Sequence[Commit], int, float], None]


class Hub:
    """In-process fan-out of commits to live subscribers (a doorbell).

    Subscribers are plain callables run on the event loop after a commit;
    they must not block (they put into their own queues).
    """

    def __init__(self) -> None:
        # Per entity, in the order they are called (a dict as an ordered set).
        self._entity: dict[Ref, dict[Callable[[Commit], None], None]] = {}
        self._all: set[Callable[[Commit], None]] = set()
        self._batches: set[BatchListener] = set()

    def subscribe(
        self, ref: Ref, callback: Callable[[Commit], None], first: bool = False
    ) -> Callable[[], None]:
        """``callback`` on each of ``ref``'s commits; ``first``: before the others (a call that
        waits on the commit to answer, ahead of the watches it would queue behind)."""
        subs = self._entity.get(ref, {})
        self._entity[ref] = {callback: None, **subs} if first else {**subs, callback: None}

        def unsubscribe() -> None:
            subs = self._entity.get(ref)
            if subs is not None:
                subs.pop(callback, None)
                if not subs:
                    del self._entity[ref]

        return unsubscribe

    def subscribers(self, ref: Ref) -> int:
        """How many callbacks follow ``ref``'s commits (for tests: watchers share one feed)."""
        return len(self._entity.get(ref, ()))

    def subscribe_all(self, callback: Callable[[Commit], None]) -> Callable[[], None]:
        self._all.add(callback)
        return lambda: self._all.discard(callback)

    def subscribe_batches(self, callback: BatchListener) -> Callable[[], None]:
        self._batches.add(callback)
        return lambda: self._batches.discard(callback)

    def committed(self, commits: Sequence[Commit], writes: int, started: float) -> None:
        """A batch the store acknowledged, whose commit began at ``started`` (``perf_counter``):
        told to the batch listeners, then its commits published."""
        self.acknowledged(commits, writes, started)
        self.publish_many(commits)

    def acknowledged(self, commits: Sequence[Commit], writes: int, started: float) -> None:
        """A batch the store acknowledged, told to the batch listeners only (a store that
        orders its commits with other replicas' publishes them itself)."""
        if self._batches:
            seconds = time.perf_counter() - started
            for listener in tuple(self._batches):
                try:
                    listener(commits, writes, seconds)
                except Exception:
                    log.exception("a batch listener failed")

    def publish(self, commit: Commit) -> None:
        self.publish_many((commit,))

    def publish_many(self, commits: Sequence[Commit]) -> None:
        """A batch's commits, in order (subscribers are looked up once per commit, not copied)."""
        everyone = tuple(self._all)
        by_entity = self._entity
        # A subscriber's bug must not stop the others, nor the writer that
        # publishes (the commits are acknowledged already): it is logged.
        for commit in commits:
            # Every commit's subscribers first: the runtime's, which sends a worker the signal
            # it is to act on, queue their sends ahead of the watches an entity's commit wakes.
            for callback in everyone:
                try:
                    callback(commit)
                except Exception:
                    log.exception("a subscriber to every commit failed on txid %d", commit.txid)
            if by_entity:
                for callback in tuple(by_entity.get(commit.ref, ())):
                    try:
                        callback(commit)
                    except Exception:
                        log.exception("a subscriber to %s/%s failed on txid %d", *commit.ref, commit.txid)
