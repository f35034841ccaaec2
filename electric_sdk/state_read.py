"""Reading an entity's durable state from its stream: the latest snapshot plus the tail after it.

The worker (at each lease) and the client (``client.state(ref)``) both load
the state here, with the rules of ``durable_state``: search back from the
head for the newest snapshot or state-bearing event (its ``snap`` names the
latest snapshot), read that snapshot, then fold the ops of the events after
its ``upto``. A wake therefore reads the snapshot and the tail, never the
whole history (unless the entity has no snapshot yet).

It reads pages of any event type with an ``offset`` and a ``type`` (the SDK's
``models.Event``, the wire's ``pb.Event``), so the server's HTTP door (``GET
/{type}/{id}/state``) rebuilds the state here too, from its own pages: one
rebuild for the worker, the client and the door. ``data`` says where an event
keeps its JSON data (by default ``event.value["data"]``, the SDK's events).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .durable_state import SNAPSHOT_EVENT, Collections, bears_state, rebuild

__all__ = ["Loaded", "PageReader", "StreamEvent", "StreamPage", "load_state", "read_range"]

# ReadEvents' own bound on a page; the backward search starts with a smaller one.
_PAGE = 1000
_FIRST_PAGE = 16


class StreamEvent(Protocol):
    @property
    def offset(self) -> int: ...
    @property
    def type(self) -> str: ...


E = TypeVar("E", bound=StreamEvent)
E_co = TypeVar("E_co", bound=StreamEvent, covariant=True)


class StreamPage(Protocol[E_co]):
    @property
    def events(self) -> Sequence[E_co]: ...
    @property
    def next_offset(self) -> int: ...


PageReader = Callable[[int, int], Awaitable[StreamPage[E]]]  # (from_offset, limit) -> page


@dataclass(frozen=True, slots=True)
class Loaded:
    state: Collections
    # The newest event the state includes: every event before ``head`` (-1: none); and the
    # snapshot it was rebuilt from (-1: none).
    upto: int
    snapshot: int
    # How many events the backward search read before it found the state's newest event.
    scanned: int
    # The stream's next offset when read: a watch of later changes starts there.
    head: int


def _value_data(event: Any) -> Any:
    return event.value.get("data")


async def read_range(read: PageReader[E], start: int, end: int) -> list[E]:
    """Events at offsets start..end-1 (a page may end early at 1 MiB: continue from next_offset)."""
    events: list[E] = []
    offset = start
    while offset < end:
        page = await read(offset, min(_PAGE, end - offset))
        events.extend(e for e in page.events if e.offset < end)
        if not page.events or page.next_offset <= offset:
            break
        offset = page.next_offset
    return events


async def load_state(read: PageReader[E], head: int, data: Callable[[E], Any] = _value_data) -> Loaded:
    """The state of a stream whose next offset is ``head``; ``data``: an event's JSON data."""
    end, scanned, size = head, 0, _FIRST_PAGE
    newest: E | None = None
    while end > 0 and newest is None:
        # Small pages first: the newest state event is usually near the head (a run's own records).
        start, size = max(0, end - size), min(size * 4, _PAGE)
        page = await read_range(read, start, end)
        for event in reversed(page):
            scanned += 1
            if event.type == SNAPSHOT_EVENT or bears_state(event.type):
                newest = event
                break
        end = start
    if newest is None:
        return Loaded({}, head - 1, -1, scanned, head)
    snapshot: dict[str, Any] | None = None
    snap_offset = newest.offset if newest.type == SNAPSHOT_EVENT else int(data(newest).get("snap", -1))
    if snap_offset >= 0:
        found = await read_range(read, snap_offset, snap_offset + 1)
        if found and found[0].type == SNAPSHOT_EVENT:
            snapshot = data(found[0])
    begin = int(snapshot["upto"]) + 1 if snapshot is not None else 0
    tail = await read_range(read, begin, head)
    state = rebuild(snapshot, ((e.offset, e.type, data(e)) for e in tail))
    # ``upto`` is the whole stream read, not its newest state event: a snapshot taken from this
    # state then lets the next wake start its tail here, not at an old state event.
    return Loaded(state, head - 1, snap_offset if snapshot is not None else -1, scanned, head)
