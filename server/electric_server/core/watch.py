"""Live watches: one entity's events, and state changes across entities.

Both follow the same rule: subscribe to the hub first, then read what is
already stored, so nothing committed in between is missed; then deliver live
commits, skipping what the catch-up already sent, so nothing is repeated.

A slow watcher does not block writers: an event watch that falls behind its
entity's feed (``event_feed``) reads the store in pages until it catches up;
an entity watch whose queue overflows ends with ABORTED / WATCH_LAGGING and
the client reconnects for a fresh snapshot. Event watches share a message
bandwidth (``Watches.bandwidth``), so thousands of them on a busy entity leave the
loop to writers and to every other call; a watcher that waited its turn
sends what arrived meanwhile in one message.
Draining ends every watch with UNAVAILABLE / SERVER_DRAINING so clients
reconnect elsewhere and resume from their last offset.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from types import TracebackType
from typing import cast

import grpc

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.entities import entity_to_pb
from electric_sdk._wire.enums import STATE_TO_PB
from electric_sdk._wire.limits import PAGE_BYTES
from electric_sdk._wire.times import timestamp_from_ms
from electric_sdk._wire.watch_frames import (
    change_batch,
    event_batch,
    event_entry,
    single_change,
    single_event,
)
from electric_sdk.lifecycle import State

from ..settings import WATCH_BANDWIDTH, WATCH_FEED_EVENTS, WATCH_QUEUE_LIMIT
from ..store.base import Commit, Ref, Store, StoredEvent
from .errors import ApiError, not_found
from .event_feed import Feed

READ_PAGE = 500
SNAPSHOT_CHUNK = 500
CHANGES_BATCH = 500  # changes per message at most (an EntityChange is a few hundred bytes)
# The bandwidth (``Watches.bandwidth``, `--watch-bandwidth`): bytes per second that every event
# watch together is paced to once there are many of them: a watcher sends its next message no
# sooner than (watchers x its last one's size / bandwidth) after
# its last, a message costing at least MESSAGE_COST, and what arrives meanwhile goes in that next
# one (batched, for a client that takes batches); it waits only with something to send, so a watcher
# whose commits come further apart than that never waits. Below a millisecond's pause no watcher
# waits at all, so a few watchers are never slowed. Without it, 2,000 watchers of an entity taking
# 4,000 writes a second ask for a gigabyte a second: the server would do nothing but send, and
# writes would wait their turn behind the sends (bench_fanout: at 64 MiB/s writes keep a quarter to
# a third of their rate, at 16 MiB/s half). A watcher that falls behind catches up from the feed, or
# from the store, once the burst is over: the bandwidth trades the writes' rate for the watchers'
# lag.
MESSAGE_COST = 16 * 1024  # grpc's cost per message, in bytes of bandwidth
# With no commit for QUIET_S, nothing waits on the loop but the watchers: they share
# QUIET_FACTOR times the bandwidth and catch up. A watcher never waits longer than
# MAX_PAUSE_S, its messages shrinking instead (to MESSAGE_COST at least), so a burst's end is
# noticed within a second.
QUIET_S = 0.25
QUIET_FACTOR = 16
MAX_PAUSE_S = 1.0
_MIN_PAUSE_S = 0.001

# A queued state change: its txid and entity, the encoded EntityChange, and it as a message.
_Change = tuple[int, Ref, bytes, bytes]
_DRAIN = object()
_OVERFLOW = object()


def draining_error() -> ApiError:
    return ApiError(grpc.StatusCode.UNAVAILABLE, "SERVER_DRAINING", "server is shutting down; reconnect")


class _Queue:
    """A bounded queue that never blocks the publisher."""

    def __init__(self, limit: int) -> None:
        self.items: asyncio.Queue[object] = asyncio.Queue()
        self.limit = limit
        self.overflowed = False

    def put(self, item: object) -> None:
        if self.overflowed:
            return
        if self.items.qsize() >= self.limit:
            self.overflowed = True
            self.items.put_nowait(_OVERFLOW)
            return
        self.items.put_nowait(item)


class Watches:
    def __init__(
        self,
        store: Store,
        queue_limit: int = WATCH_QUEUE_LIMIT.value,
        bandwidth: float = WATCH_BANDWIDTH.value,
        # Events a feed keeps for watchers behind (and at most FEED_BYTES).
        feed_events: int = WATCH_FEED_EVENTS.value,
    ) -> None:
        self.store = store
        self.queue_limit = queue_limit
        self.bandwidth = bandwidth
        self.feed_events = feed_events
        self._queues: set[_Queue] = set()
        self._feeds: dict[Ref, Feed] = {}
        self._feed_unsubscribe: dict[Ref, Callable[[], None]] = {}
        self._event_watchers = 0
        self._last_commit = 0.0
        self._entity_watchers: set[tuple[_Queue, str | None, frozenset[State]]] = set()
        self._draining = False
        self._unsubscribe = store.hub.subscribe_all(self._on_commit)

    def drain(self) -> None:
        """End every watch (UNAVAILABLE) and refuse new ones."""
        self._draining = True
        for queue in self._queues:
            queue.items.put_nowait(_DRAIN)
        for feed in self._feeds.values():
            feed.wake()

    def close(self) -> None:
        self._unsubscribe()

    async def __aenter__(self) -> Watches:
        return self  # a component of the server (app.py): it runs no task, it follows the hub

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def active(self) -> int:
        return len(self._queues) + self._event_watchers

    def feed(self, ref: Ref) -> Feed | None:
        """The feed its open event watches share, while any watches ``ref`` (tests look at it)."""
        return self._feeds.get(ref)

    def watching(self) -> dict[str, int]:
        """Open watches by kind: one entity's events, or entities' state changes."""
        return {"events": self._event_watchers, "entities": len(self._entity_watchers)}

    # -- entity state changes ------------------------------------------------------

    def _on_commit(self, commit: Commit) -> None:
        self._last_commit = time.monotonic()
        after, before = commit.after, commit.before
        if not self._entity_watchers or after is None:
            return
        if before is not None and before.state is after.state and before.closed == after.closed:
            return
        # Converted and encoded once for every watcher; a message is built from the bytes.
        change = api.EntityChange(
            entity=entity_to_pb(after),
            previous_state=STATE_TO_PB[before.state] if before else pb.STATE_UNSPECIFIED,
            changed_at=timestamp_from_ms(commit.timestamp_ms),
        ).SerializeToString()
        item = (commit.txid, after.ref, change, single_change(change))
        for queue, type_, states in self._entity_watchers:
            if type_ is not None and after.type != type_:
                continue
            if states and after.state not in states and (before is None or before.state not in states):
                continue
            queue.put(item)

    async def entities(
        self, type_: str | None, states: Sequence[State], batches: bool = False
    ) -> AsyncIterator[api.WatchEntitiesResponse | bytes]:
        """A snapshot, then live changes; ``batches``: the client takes several changes at once.
        Changes come as bytes, encoded once for every watcher (see ``_on_commit``)."""
        if self._draining:
            raise draining_error()
        queue = _Queue(self.queue_limit)
        watcher = (queue, type_, frozenset(states))
        self._queues.add(queue)
        self._entity_watchers.add(watcher)
        try:
            snapshot_txid = await self.store.head_txid()
            sent: dict[Ref, int] = {}
            after: Ref | None = None
            while True:
                page = await self.store.list_entities(type_, states, after, SNAPSHOT_CHUNK)
                if page:
                    for record in page:
                        sent[record.ref] = record.txid
                    yield api.WatchEntitiesResponse(
                        snapshot=api.EntitySnapshot(entities=[entity_to_pb(r) for r in page])
                    )
                if len(page) < SNAPSHOT_CHUNK:
                    break
                after = page[-1].ref
            yield api.WatchEntitiesResponse(snapshot_complete=api.SnapshotComplete(txid=snapshot_txid))
            held: object = None  # taken from the queue while batching, not yet handled
            while True:
                item, held = (held if held is not None else await queue.items.get()), None
                if item is _DRAIN:
                    raise draining_error()
                if item is _OVERFLOW:
                    raise ApiError(
                        grpc.StatusCode.ABORTED,
                        "WATCH_LAGGING",
                        "watcher fell behind; reconnect for a fresh snapshot",
                    )
                txid, ref, change, single = cast(_Change, item)
                if sent and txid <= sent.get(ref, 0):
                    continue  # the snapshot already showed this or a later state
                if not batches or queue.items.empty():
                    yield single
                    continue
                # A burst (a fan-out changed many entities): what is waiting goes as one message.
                changes = [change]
                while len(changes) < CHANGES_BATCH and not queue.items.empty():
                    held = queue.items.get_nowait()
                    if held is _DRAIN or held is _OVERFLOW:
                        break
                    txid, ref, change, single = cast(_Change, held)
                    held = None
                    if not sent or txid > sent.get(ref, 0):
                        changes.append(change)
                yield change_batch(changes)
        finally:
            self._entity_watchers.discard(watcher)
            self._queues.discard(queue)

    # -- one entity's events ---------------------------------------------------------

    def _feed(self, ref: Ref) -> Feed:
        feed = self._feeds.get(ref)
        if feed is None:
            feed = self._feeds[ref] = Feed(ref, self.feed_events)
            self._feed_unsubscribe[ref] = self.store.hub.subscribe(ref, feed.publish)
        return feed

    def _leave(self, feed: Feed, token: object) -> None:
        feed.positions.pop(token, None)
        self._event_watchers -= 1
        if not feed.positions and self._feeds.get(feed.ref) is feed:
            del self._feeds[feed.ref]
            self._feed_unsubscribe.pop(feed.ref)()

    def _bandwidth(self) -> float:
        quiet = time.monotonic() - self._last_commit > QUIET_S
        return self.bandwidth * QUIET_FACTOR if quiet else self.bandwidth

    def _message_bytes(self) -> int:
        """How large a watcher's next message may be: its share of a MAX_PAUSE_S's bandwidth."""
        share = self._bandwidth() * MAX_PAUSE_S / max(1, self._event_watchers)
        return int(min(PAGE_BYTES, max(MESSAGE_COST, share)))

    def _next_send(self, sent: bytes | api.WatchEventsResponse) -> float:
        """When (``time.monotonic``) a watcher that just sent ``sent`` may send again: its share
        of the bandwidth among every event watch (see ``Watches.bandwidth``)."""
        size = len(sent) if isinstance(sent, bytes) else sent.ByteSize()
        pause = min(MAX_PAUSE_S, self._event_watchers * max(size, MESSAGE_COST) / self._bandwidth())
        if pause < _MIN_PAUSE_S:
            return 0.0
        # Jittered, so watchers woken by one commit do not stay in step.
        return time.monotonic() + pause * random.uniform(0.5, 1.5)

    async def events(
        self, ref: Ref, from_offset: int, batches: bool = False
    ) -> AsyncIterator[api.WatchEventsResponse | bytes]:
        """The entity's events from ``from_offset``: the store's, then the feed's.

        Yields messages already encoded (bytes) where they come from the feed, and
        ``batches``: the client takes several events per message (``EventBatch``).
        """
        if self._draining:
            raise draining_error()
        record = await self.store.get_entity(ref)
        if record is None:
            raise not_found(*ref)
        # Join the feed before reading the store: whatever is committed after the
        # read began reaches the feed, so the two together miss nothing.
        feed = self._feed(ref)
        token = object()
        feed.positions[token] = from_offset
        self._event_watchers += 1
        offset = from_offset
        turn = 0.0  # the watcher sends nothing before (see _next_send)
        try:
            while True:
                if self._draining:
                    raise draining_error()
                if feed.end_of_stream is not None and offset >= feed.end_of_stream:
                    yield api.WatchEventsResponse(
                        end_of_stream=api.EndOfStream(head_offset=feed.end_of_stream)
                    )
                    return
                if feed.holds(offset):
                    if turn > time.monotonic():
                        await _until(turn)  # then again from the top: a drain, what came meanwhile
                        continue
                    entries = feed.entries(offset, self._message_bytes() if batches else 0)
                    message = event_batch(entries) if batches else single_event(entries[0])
                    yield message
                    offset += len(entries)
                    feed.positions[token] = offset
                    turn = self._next_send(message)
                    continue
                if feed.start is not None and not feed.behind(offset):
                    await feed.wait()  # up to date: until the next commit (or a drain)
                    continue
                # Behind the feed, or no commit seen yet: the store has what is committed.
                # A commit published while the store is read still wakes this watcher below.
                published = feed.next_wake()
                stored = await self.store.read_events(ref, offset, READ_PAGE)
                if stored:
                    for page in _pages(stored, self._message_bytes() if batches else 0):
                        await _until(turn)
                        yield page
                        turn = self._next_send(page)
                    offset = stored[-1].offset + 1
                    feed.positions[token] = offset
                    continue
                record = await self.store.get_entity(ref)
                assert record is not None
                if record.closed and offset >= record.head_offset:
                    yield api.WatchEventsResponse(
                        end_of_stream=api.EndOfStream(head_offset=record.head_offset)
                    )
                    return
                await published.wait()
        finally:
            self._leave(feed, token)


async def _until(when: float) -> None:
    """Wait for a watcher's turn (``Watches._next_send``). Waited for when there is something to
    send, not after each message: a watcher whose next commit comes later than its turn (one a
    second to a thousand watchers) never sleeps at all, and costs no timer per message."""
    pause = when - time.monotonic()
    if pause > 0:
        await asyncio.sleep(pause)


def _pages(stored: list[StoredEvent], max_bytes: int) -> Iterator[bytes]:
    """Events read from the store as messages: batches of at most ``max_bytes`` (at least one
    event each), or one event each for ``max_bytes`` 0 (a client that takes no batches)."""
    if not max_bytes:
        for event in stored:
            yield single_event(event_entry(event))
        return
    entries: list[bytes] = []
    size = 0
    for event in stored:
        entry = event_entry(event)
        if entries and size + len(entry) > max_bytes:
            yield event_batch(entries)
            entries, size = [], 0
        entries.append(entry)
        size += len(entry)
    if entries:
        yield event_batch(entries)
