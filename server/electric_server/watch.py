"""Live watches: one entity's events, and state changes across entities.

Both follow the same rule: subscribe to the hub first, then read what is
already stored, so nothing committed in between is missed; then deliver live
commits, skipping what the catch-up already sent, so nothing is repeated.

A watcher whose queue overflows (a slow client) does not block writers: an
event watch falls back to reading the store; an entity watch ends with
ABORTED / WATCH_LAGGING and the client reconnects for a fresh snapshot.
Draining ends every watch with UNAVAILABLE / SERVER_DRAINING so clients
reconnect elsewhere and resume from their last offset.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import cast

import grpc

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.entities import entity_to_pb
from electric_sdk._wire.enums import STATE_TO_PB
from electric_sdk._wire.events import event_to_pb
from electric_sdk._wire.times import timestamp_from_ms
from electric_sdk.lifecycle import State

from .errors import ApiError, not_found
from .store.base import Commit, Ref, Store

READ_PAGE = 500
SNAPSHOT_CHUNK = 500
QUEUE_LIMIT = 10_000
CHANGES_BATCH = 500  # changes per message at most (an EntityChange is a few hundred bytes)

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
    def __init__(self, store: Store, queue_limit: int = QUEUE_LIMIT) -> None:
        self.store = store
        self.queue_limit = queue_limit
        self._queues: set[_Queue] = set()
        self._entity_watchers: set[tuple[_Queue, str | None, frozenset[State]]] = set()
        self._draining = False
        self._unsubscribe = store.hub.subscribe_all(self._on_commit)

    def drain(self) -> None:
        """End every watch (UNAVAILABLE) and refuse new ones."""
        self._draining = True
        for queue in self._queues:
            queue.items.put_nowait(_DRAIN)

    def close(self) -> None:
        self._unsubscribe()

    @property
    def active(self) -> int:
        return len(self._queues)

    # -- entity state changes ------------------------------------------------------

    def _on_commit(self, commit: Commit) -> None:
        after, before = commit.after, commit.before
        if not self._entity_watchers or after is None:
            return
        if before is not None and before.state is after.state and before.closed == after.closed:
            return
        # Built once and shared by every watcher: serialization is per stream anyway.
        response = api.WatchEntitiesResponse(
            change=api.EntityChange(
                entity=entity_to_pb(after),
                previous_state=STATE_TO_PB[before.state] if before else pb.STATE_UNSPECIFIED,
                changed_at=timestamp_from_ms(commit.timestamp_ms),
            )
        )
        for queue, type_, states in self._entity_watchers:
            if type_ is not None and after.type != type_:
                continue
            if states and after.state not in states and (before is None or before.state not in states):
                continue
            queue.put((commit.txid, after.ref, response))

    async def entities(
        self, type_: str | None, states: Sequence[State], batches: bool = False
    ) -> AsyncIterator[api.WatchEntitiesResponse]:
        """A snapshot, then live changes; ``batches``: the client takes several changes at once."""
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
                txid, ref, response = cast(tuple[int, Ref, api.WatchEntitiesResponse], item)
                if sent and txid <= sent.get(ref, 0):
                    continue  # the snapshot already showed this or a later state
                if not batches or queue.items.empty():
                    yield response
                    continue
                # A burst (a fan-out changed many entities): what is waiting goes as one message.
                changes = [response.change]
                while len(changes) < CHANGES_BATCH and not queue.items.empty():
                    held = queue.items.get_nowait()
                    if held is _DRAIN or held is _OVERFLOW:
                        break
                    txid, ref, response = cast(tuple[int, Ref, api.WatchEntitiesResponse], held)
                    held = None
                    if not sent or txid > sent.get(ref, 0):
                        changes.append(response.change)
                yield api.WatchEntitiesResponse(changes=api.EntityChanges(changes=changes))
        finally:
            self._entity_watchers.discard(watcher)
            self._queues.discard(queue)

    # -- one entity's events ---------------------------------------------------------

    async def events(self, ref: Ref, from_offset: int) -> AsyncIterator[api.WatchEventsResponse]:
        if self._draining:
            raise draining_error()
        record = await self.store.get_entity(ref)
        if record is None:
            raise not_found(*ref)
        queue = _Queue(self.queue_limit)
        self._queues.add(queue)
        unsubscribe = self.store.hub.subscribe(ref, queue.put)
        offset = from_offset
        try:
            while True:
                # Catch up from the store until the head, then follow the tail.
                while True:
                    stored = await self.store.read_events(ref, offset, READ_PAGE)
                    for event in stored:
                        yield api.WatchEventsResponse(event=event_to_pb(event))
                    if stored:
                        offset = stored[-1].offset + 1
                    if len(stored) < READ_PAGE:
                        break
                record = await self.store.get_entity(ref)
                assert record is not None
                if record.closed and offset >= record.head_offset:
                    yield api.WatchEventsResponse(
                        end_of_stream=api.EndOfStream(head_offset=record.head_offset)
                    )
                    return
                # Live: take commits straight from the hub while they are contiguous.
                while True:
                    item = await queue.items.get()
                    if item is _DRAIN:
                        raise draining_error()
                    if item is _OVERFLOW:
                        queue = self._replace_queue(queue, ref)
                        unsubscribe()
                        unsubscribe = self.store.hub.subscribe(ref, queue.put)
                        break  # read what was missed from the store
                    commit: Commit = item  # type: ignore[assignment]
                    if commit.events and commit.events[0].offset > offset:
                        break  # a gap: read it from the store
                    for event in commit.events:
                        if event.offset == offset:
                            yield api.WatchEventsResponse(event=event_to_pb(event))
                            offset += 1
                    if (
                        commit.after is not None
                        and commit.after.closed
                        and offset >= commit.after.head_offset
                    ):
                        yield api.WatchEventsResponse(
                            end_of_stream=api.EndOfStream(head_offset=commit.after.head_offset)
                        )
                        return
        finally:
            unsubscribe()
            self._queues.discard(queue)

    def _replace_queue(self, old: _Queue, ref: Ref) -> _Queue:
        self._queues.discard(old)
        new = _Queue(self.queue_limit)
        self._queues.add(new)
        return new
