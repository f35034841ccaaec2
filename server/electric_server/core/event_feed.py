"""One entity's live events, shared by every watcher of that entity.

The writer publishes a commit to the feed and goes on: appending to a deque
and waking the waiters is all it does, however many watchers there are.
Each event is converted and encoded once, by the first watcher that sends
it (``watch_frames``); every watcher's message is a join of those bytes.
The feed keeps the events its slowest watcher has yet to send, at most
``keep`` of them (and ``keep_bytes``): a watcher that falls further behind
reads the store instead, in pages, and comes back to the feed once it is
within reach, so it skips nothing.
"""

from __future__ import annotations

import asyncio
from collections import deque

from electric_sdk._wire.limits import PAGE_BYTES
from electric_sdk._wire.watch_frames import event_entry

from ..store.base import Commit, Ref, StoredEvent

FEED_BYTES = 64 * 1024 * 1024


class Feed:
    def __init__(self, ref: Ref, keep: int, keep_bytes: int = FEED_BYTES) -> None:
        self.ref = ref
        self.keep = max(1, keep)
        self.keep_bytes = keep_bytes
        self._events: deque[StoredEvent] = deque()
        self._entries: deque[bytes | None] = deque()  # each event encoded once, when first sent
        self._bytes = 0
        # The offset of the first event held (or, with none held, of the next one); None
        # until the first commit: the feed does not know the stream's head by itself.
        self.start: int | None = None
        self.end_of_stream: int | None = None  # the head, once a commit closed the stream
        self.positions: dict[object, int] = {}  # each watcher's next offset, for trimming
        self._wake = asyncio.Event()

    @property
    def next_offset(self) -> int | None:
        return None if self.start is None else self.start + len(self._events)

    def publish(self, commit: Commit) -> None:
        """Called by the writer (through the hub): O(events), nothing per watcher."""
        for event in commit.events:
            if self.start is None or event.offset != self.start + len(self._events):
                # The first commit seen, or (never expected: one writer, offsets gap-free) a
                # discontinuity: start over from here; watchers behind it read the store.
                self._events.clear()
                self._entries.clear()
                self._bytes = 0
                self.start = event.offset
            self._events.append(event)
            self._entries.append(None)
            self._bytes += len(event.body)
        if commit.after is not None and commit.after.closed:
            self.end_of_stream = commit.after.head_offset
        if len(self._events) > self.keep + self.keep // 4 or self._bytes > self.keep_bytes:
            self._trim()
        self.wake()

    def wake(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    async def wait(self) -> None:
        """Until the next publish (or ``wake``)."""
        await self._wake.wait()

    def next_wake(self) -> asyncio.Event:
        """Set by the next publish (or ``wake``) from now on, however long before it is awaited."""
        return self._wake

    def holds(self, offset: int) -> bool:
        """Whether the event at ``offset`` is here (an offset below the window is in the store)."""
        return self.start is not None and self.start <= offset < self.start + len(self._events)

    def behind(self, offset: int) -> bool:
        """Whether ``offset`` is before the window: the store has it, the feed no longer does."""
        return self.start is not None and offset < self.start

    def entries(self, offset: int, max_bytes: int = PAGE_BYTES) -> list[bytes]:
        """Encoded events from ``offset`` (held), at most ``max_bytes`` of them but at least one."""
        assert self.start is not None
        first = offset - self.start
        out: list[bytes] = []
        size = 0
        for i in range(first, len(self._events)):
            entry = self._entries[i]
            if entry is None:
                entry = self._entries[i] = event_entry(self._events[i])
            if out and size + len(entry) > max_bytes:
                break
            out.append(entry)
            size += len(entry)
        return out

    def _trim(self) -> None:
        """Drop what every watcher has sent, and beyond that the oldest past the limits."""
        assert self.start is not None
        slowest = min(self.positions.values(), default=self.start + len(self._events))
        drop = max(0, min(slowest - self.start, len(self._events)), len(self._events) - self.keep)
        while self._events and (drop > 0 or self._bytes > self.keep_bytes):
            self._bytes -= len(self._events.popleft().body)
            self._entries.popleft()
            self.start += 1
            drop -= 1
