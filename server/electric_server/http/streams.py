"""Live reads over HTTP: an entity's stream as the Durable Streams protocol reads it, and entities'
state changes as server-sent events.

``GET /{type}/{id}/stream`` is the read side of the Durable Streams protocol (``PROTOCOL.md`` of
durable-streams/durable-streams) for a JSON-mode stream: catch-up reads, ``live=long-poll`` and
``live=sse``, each body (or SSE ``data`` event) a JSON array of State Protocol change messages,
the position in ``Stream-Next-Offset`` (or the SSE ``control`` event). ``GET /entities?live=sse``
streams WatchEntities: a snapshot, then each state change.

Nothing here decides what a stream holds or who may read it. The routes are admitted as the door's
other GET routes are (``admitted_endpoint``: token, ``read`` scope, type limits, the error body);
a catch-up read is the service's ReadEvents and a live tail its WatchEvents / WatchEntities
(watch.py: in order, exactly once, ended on drain). So draining ends these responses cleanly (a
long-poll answers 204, an SSE body ends) and the client resumes from its last offset here after a
restart, or on another replica of the same PostgreSQL database.

A caller bounds a live read with ``timeout``: a long-poll answers 204 once it passes, an SSE
response ends as a drain ends it (so every call the OpenAPI document describes returns, and it
can be fuzzed).

Offsets are the entity's gap-free event offsets as 20 decimal digits: they sort as text, as the
protocol asks, and keep their meaning across restarts and servers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, cast

import grpc
from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.rendering import change_message_json, entity_change_json, entity_json

from ..core.auth import current_principal
from ..core.errors import ApiError, DoorContext, invalid_argument
from ..core.service import EntityService
from ..core.validation import MAX_INT64, MAX_PAGE
from ..core.watch import draining_error
from ..lifetime import TaskGroup
from . import body
from .admission import Endpoint, admitted_endpoint
from .handlers import DoorParts
from .query import Query, page_form, parse_states, query_duration, query_one, ref
from .waits import MAX_WAIT_MS as MAX_HOLD_MS

log = logging.getLogger("electric.http")

OFFSET_DIGITS = 20
START = "-1"  # the protocol's sentinel for the stream's beginning
NOW = "now"  # and for its tail
LIVE_MODES = ("long-poll", "sse")
# The protocol's cursor (section 10.1): 20-second intervals counted from 2024-10-09T00:00:00Z.
CURSOR_EPOCH_S = 1_728_432_000
CURSOR_INTERVAL_S = 20
# Offsets name immutable ranges, so a page with events may be cached; by the reader only: a
# stream is only readable with a token. An empty page at the tail changes with the next commit.
CACHEABLE = "private, max-age=60, stale-while-revalidate=300"
SECURITY = {"X-Content-Type-Options": "nosniff", "Cross-Origin-Resource-Policy": "cross-origin"}
RENDER_CACHE = 256  # watch messages rendered once for every SSE reader of the same commit
RENDER_CACHE_MAX_BYTES = 64 * 1024
HEARTBEAT = b": heartbeat\n\n"  # an SSE comment: every client skips it


def format_offset(offset: int) -> str:
    return f"{offset:0{OFFSET_DIGITS}d}"


# What an offset may look like: the document's pattern (http/routes.py), exactly.
OFFSET_RE = re.compile(rf"-1|now|[0-9]{{1,{OFFSET_DIGITS}}}")


def parse_offset(text: str) -> int | None:
    """An offset of the form this server issues (or ``-1``) as the event offset; None for
    ``now``. One of another form is 400; one past the stream's end, 409 (``past_the_end``)."""
    if text == NOW:
        return None
    if text == START:
        return 0
    if not OFFSET_RE.fullmatch(text):
        raise invalid_argument(
            "INVALID_OFFSET",
            f"offset must be -1, now, or a Stream-Next-Offset this server sent; got {text[:40]!r}",
            field="offset",
        )
    if int(text) > MAX_INT64:
        raise past_the_end(int(text))
    return int(text)


def past_the_end(offset: int) -> ApiError:
    """An offset of the right form past the stream's end: not there yet (OUT_OF_RANGE, 409), as a
    fork's offset past the origin's head is."""
    return ApiError(
        grpc.StatusCode.OUT_OF_RANGE,
        "INVALID_OFFSET",
        "offset is past the stream's end: not one this server sent",
        {"field": "offset", "offset": str(offset)},
    )


def next_cursor(client: str) -> str:
    """The protocol's cursor: the current interval, and never one the client already has."""
    return _cursor(client)[0]


def _cursor(client: str) -> tuple[str, bool]:
    """``next_cursor``, and whether it is the current interval's (the same for every client that
    sent none, or an older one), not one drawn at random past the client's."""
    now = int((time.time() - CURSOR_EPOCH_S) // CURSOR_INTERVAL_S)
    if client.isascii() and client.isdigit() and int(client) >= now:
        return str(int(client) + random.randint(1, 3600 // CURSOR_INTERVAL_S)), False
    return str(now), True


@dataclass(frozen=True)
class StreamQuery:
    offset: int | None  # None: the tail (``now``)
    live: str | None
    cursor: str
    hold_s: float | None = None  # ``timeout``: how long the live read may hold; None: no bound


def _etag(ref: pb.EntityRef, start: int, end: int, closed: bool) -> str:
    # The protocol's form, and changed by closing: a 304 must not hide the end of the stream.
    return f'"{ref.type}/{ref.id}:{start}:{end}{":c" if closed else ""}"'


def _matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    tags = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
    return "*" in tags or etag in tags


def _sse(event: str, data: str, event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {data}\n\n".encode()


def _dumps(value: Any) -> str:
    # One line (JSON escapes newlines in strings), so an SSE event is one ``data:`` line.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class EntityStreams:
    def __init__(
        self,
        service: EntityService,
        draining: Callable[[], bool],
        *,
        heartbeat_s: float,  # ServerConfig.sse_heartbeat_ms and http_long_poll_ms, in seconds
        long_poll_s: float,
    ) -> None:
        self.service = service
        self.draining = draining
        self.heartbeat_s = heartbeat_s
        self.long_poll_s = long_poll_s
        # A watch message → its data event, its events' count, and the whole frame of a reader at
        # the tail with the current interval's cursor (b"" until one asks): see _frame.
        self._rendered: OrderedDict[bytes, tuple[bytes, int, str, bytes]] = OrderedDict()
        self._heartbeats = _Heartbeats(heartbeat_s)

    async def __aenter__(self) -> EntityStreams:
        return self  # a component of the server (app.py): its SSE heartbeats' tasks are its own

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._heartbeats.aclose()

    # -- one entity's stream -----------------------------------------------------------------------

    async def read(self, request: Request, message: Any, context: DoorContext) -> Response:
        """The stream read ``message`` (a ReadEventsRequest) asks for, as ``request.state.stream`` says."""
        query: StreamQuery = request.state.stream
        if request.method == "HEAD" or query.offset is None:
            got = await self.service.GetEntity(api.GetEntityRequest(ref=message.ref), cast(Any, context))
            if request.method == "HEAD":  # the protocol's metadata: the tail and whether it is closed
                headers = {
                    "Stream-Next-Offset": format_offset(got.entity.head_offset),
                    "Cache-Control": "no-store",
                }
                if got.entity.closed:
                    headers["Stream-Closed"] = "true"
                return Response(headers={**headers, **SECURITY}, media_type="application/json")
            message.from_offset = got.entity.head_offset
        if query.live is not None and self.draining():
            raise _draining()  # not 204 at once: the client backs off instead of polling in a loop
        page = await self.service.ReadEvents(message, cast(Any, context))
        if message.from_offset > page.head_offset:
            raise past_the_end(message.from_offset)
        if query.live == "sse":
            return self._sse(message, page, query)
        if query.live == "long-poll" and not page.events:
            return await self._long_poll(message, page, query, context)
        closed = page.end_of_stream
        headers = self._position(page.next_offset, page.next_offset >= page.head_offset, closed, query)
        if query.offset is not None:
            etag = headers["ETag"] = _etag(message.ref, message.from_offset, page.next_offset, closed)
            if _matches(request.headers.get("if-none-match"), etag):
                return Response(status_code=304, headers=headers)
        headers["Cache-Control"] = CACHEABLE if page.events else "no-store"
        body_text = _dumps([change_message_json(e) for e in page.events])
        return Response(body_text, headers=headers, media_type="application/json")

    def _position(
        self, next_offset: int, up_to_date: bool, closed: bool, query: StreamQuery
    ) -> dict[str, str]:
        headers = {"Stream-Next-Offset": format_offset(next_offset), **SECURITY}
        if up_to_date or closed:
            headers["Stream-Up-To-Date"] = "true"
        if closed:
            headers["Stream-Closed"] = "true"
        elif query.live is not None:
            headers["Stream-Cursor"] = next_cursor(query.cursor)
        return headers

    async def _long_poll(
        self,
        message: api.ReadEventsRequest,
        page: api.ReadEventsResponse,
        query: StreamQuery,
        context: DoorContext,
    ) -> Response:
        """At the tail: wait for the next commit, up to the timeout (204 then, as on a drain)."""
        if page.end_of_stream:  # closed, and the reader has it all: never wait
            return Response(status_code=204, headers=self._position(page.next_offset, True, True, query))
        watch = cast(
            AsyncGenerator[object, None],
            self.service.WatchEvents(
                api.WatchEventsRequest(
                    ref=message.ref, from_offset=message.from_offset, accepts_batches=True
                ),
                cast(Any, context),
            ),
        )
        item: object = None
        hold_s = self.long_poll_s if query.hold_s is None else min(query.hold_s, self.long_poll_s)
        try:
            async with asyncio.timeout(hold_s):
                item = await anext(watch)
        except TimeoutError:
            pass
        except ApiError as error:
            if error.reason != "SERVER_DRAINING":
                raise
        finally:
            await watch.aclose()
        events, closed = self._decode(item) if item is not None else ([], False)
        if not events:
            return Response(status_code=204, headers=self._position(message.from_offset, True, closed, query))
        next_offset = message.from_offset + len(events)
        # Up to date: the reader was at the tail, and a watch message holds all that came since
        # (but for a burst past a message's bytes; the next poll then answers at once).
        headers = self._position(next_offset, True, False, query)
        headers["ETag"] = _etag(message.ref, message.from_offset, next_offset, False)
        headers["Cache-Control"] = CACHEABLE
        return Response(_dumps(events), headers=headers, media_type="application/json")

    def _decode(self, item: object) -> tuple[list[dict[str, Any]], bool]:
        """A watch message's events as change messages, and whether it ends the stream."""
        m = api.WatchEventsResponse.FromString(item) if isinstance(item, bytes) else item
        assert isinstance(m, api.WatchEventsResponse)
        which = m.WhichOneof("item")
        if which == "event":
            return [change_message_json(m.event)], False
        if which == "events":
            return [change_message_json(e) for e in m.events.events], False
        return [], which == "end_of_stream"

    def _frame(self, item: object, offset: int, head: int, client_cursor: str) -> tuple[bytes, int, bool]:
        """A watch message as SSE, for a reader at ``offset``: its events as one ``data`` event
        and the ``control`` event after it (one write per message per reader); their count; and
        whether it ends the stream.

        Every SSE reader of an entity gets the same message for a commit it takes alone, so it
        is rendered once (watch.py encodes it once for all of them likewise); so is the whole
        frame of the readers at the tail, whose control event is the same while the cursor is."""
        cursor, shared = _cursor(client_cursor)
        at_tail = offset >= head  # then up to date after the message, whatever it holds
        cacheable = isinstance(item, bytes) and len(item) <= RENDER_CACHE_MAX_BYTES
        hit = self._rendered.get(cast(bytes, item)) if cacheable else None
        closed = False
        if hit is not None:
            self._rendered.move_to_end(cast(bytes, item))
            data, count, tail_cursor, tail_frame = hit
            if at_tail and shared and cursor == tail_cursor:
                return tail_frame, count, False
        else:
            events, closed = self._decode(item)
            data, count = (_sse("data", _dumps(events)) if events else b""), len(events)
        after = offset + count
        frame = data + _control(after, after >= head, closed, cursor)
        if cacheable and count and (hit is None or (at_tail and shared)):
            tail = (cursor, frame) if at_tail and shared else ("", b"")
            self._rendered[cast(bytes, item)] = (data, count, *tail)
            if len(self._rendered) > RENDER_CACHE:
                self._rendered.popitem(last=False)
        return frame, count, closed

    def _sse(
        self, message: api.ReadEventsRequest, page: api.ReadEventsResponse, query: StreamQuery
    ) -> Response:
        principal = current_principal.get()  # the body runs after the endpoint has returned
        if not page.end_of_stream:
            # Over the principal's stream cap: 429 now, not a 200, the catch-up and a silent end
            # (a client following the reconnect loop of docs/http.md would retry forever).
            self.service.caps.check_stream(principal.name)
        context = DoorContext("http:sse")

        async def frames() -> AsyncIterator[bytes]:
            reset = current_principal.set(principal)
            offset, head = page.next_offset, page.head_offset
            try:
                first = (
                    _sse("data", _dumps([change_message_json(e) for e in page.events]))
                    if page.events
                    else b""
                )
                yield first + _control(offset, offset >= head, page.end_of_stream, next_cursor(query.cursor))
                if page.end_of_stream:
                    return
                watch = self.service.WatchEvents(
                    api.WatchEventsRequest(ref=message.ref, from_offset=offset, accepts_batches=True),
                    cast(Any, context),
                )
                async for item in _ended_by_drain(watch):
                    frame, count, closed = self._frame(item, offset, head, query.cursor)
                    offset += count
                    yield frame
                    if closed:
                        return
            finally:
                current_principal.reset(reset)

        return _SseResponse(frames(), self._heartbeats, query.hold_s)

    # -- entities' state changes -------------------------------------------------------------------

    async def watch_entities(self, request: Request, message: Any, context: DoorContext) -> Response:
        """A snapshot (``snapshot`` events, then ``snapshot-complete``), then each ``change``.

        A reconnected client gets a fresh snapshot, which holds every change it missed; each
        change's SSE id is its txid, so a client can tell which it has already applied."""
        if self.draining():
            raise _draining()
        watch = cast(AsyncGenerator[object, None], self.service.WatchEntities(message, cast(Any, context)))
        try:
            first = await anext(watch)  # a refusal (a bad name, too many streams) is the answer
        except BaseException:
            await watch.aclose()
            raise

        async def frames() -> AsyncIterator[bytes]:
            try:
                yield _entities_frame(first)
                async for item in _ended_by_drain(watch):
                    yield _entities_frame(item)
            finally:
                await watch.aclose()

        return _SseResponse(frames(), self._heartbeats, request.state.hold_s)


# -- the route table's handlers (http/routes.py): each admits its request as the door's other GET
# routes do (``admitted_endpoint``); None for a door without the live reads.


def read_stream(parts: DoorParts) -> Endpoint | None:
    """``GET /{type}/{id}/stream``: the Durable Streams read."""
    if parts.streams is None:
        return None
    names = {"offset", "live", "cursor", "timeout"}
    return admitted_endpoint(parts.tokens, "ReadEvents", "read", names, _read_request, parts.streams.read)


def watch_entities(parts: DoorParts) -> Endpoint | None:
    """``GET /entities?live=sse``: every entity's state changes as server-sent events."""
    if parts.streams is None:
        return None
    # The list's page parameters too: the document's one operation lists them all (the live
    # form checks them as the list does; its snapshot is sent whole, so they shape nothing).
    names = {"type", "state", "live", "timeout", "page_size", "page_token"}
    respond = parts.streams.watch_entities
    return admitted_endpoint(parts.tokens, "WatchEntities", "read", names, _watch_request, respond)


def _read_request(request: Request, query: Query, obj: body.JsonObject) -> Message:
    text = query_one(query, "offset") or START
    live = query_one(query, "live") if "live" in query else None
    if live is not None and live not in LIVE_MODES:
        raise invalid_argument("INVALID_FIELD", "live must be long-poll or sse", field="live")
    resumed = request.headers.get("last-event-id")
    if live == "sse" and resumed:  # an EventSource's reconnection: it names the last control
        text = resumed
    offset = parse_offset(text)
    hold_ms = query_duration(query, "timeout", MAX_HOLD_MS)
    hold_s = None if hold_ms is None else hold_ms / 1000
    request.state.stream = StreamQuery(offset, live, query_one(query, "cursor"), hold_s)
    return api.ReadEventsRequest(ref=ref(request), from_offset=offset or 0, limit=MAX_PAGE)


def _watch_request(request: Request, query: Query, obj: body.JsonObject) -> Message:
    if query_one(query, "live") != "sse":
        raise invalid_argument("INVALID_FIELD", "the entities' live form is live=sse", field="live")
    page_form(query)
    hold_ms = query_duration(query, "timeout", MAX_HOLD_MS)
    request.state.hold_s = None if hold_ms is None else hold_ms / 1000
    return api.WatchEntitiesRequest(
        type=query_one(query, "type"),
        states=parse_states(query.get("state", []), "state"),
        accepts_batches=True,
    )


def _control(offset: int, up_to_date: bool, closed: bool, cursor: str) -> bytes:
    """The control event after an SSE reader's data: where it is, its cursor, whether it is up
    to date or the stream closed. Written out: json.dumps of the dict costs more."""
    at = format_offset(offset)
    if closed:
        fields = f'{{"streamNextOffset":"{at}","streamClosed":true,"upToDate":true}}'
    else:
        up = ',"upToDate":true' if up_to_date else ""
        fields = f'{{"streamNextOffset":"{at}","streamCursor":"{cursor}"{up}}}'
    return f"id: {at}\nevent: control\ndata: {fields}\n\n".encode()


def _entities_frame(item: object) -> bytes:
    m = api.WatchEntitiesResponse.FromString(item) if isinstance(item, bytes) else item
    assert isinstance(m, api.WatchEntitiesResponse)
    which = m.WhichOneof("item")
    if which == "snapshot":
        return _sse("snapshot", _dumps([entity_json(e) for e in m.snapshot.entities]))
    if which == "snapshot_complete":
        txid = str(m.snapshot_complete.txid)
        return _sse("snapshot-complete", _dumps({"txid": txid}), txid)
    changes = [m.change] if which == "change" else list(m.changes.changes)
    txid = str(max(c.entity.txid for c in changes))
    return _sse("change", _dumps([entity_change_json(c) for c in changes]), txid)


async def _ended_by_drain(watch: AsyncIterator[object]) -> AsyncIterator[object]:
    """The watch's messages; a drain (or any refusal) ends them cleanly: the client resumes."""
    try:
        async for item in watch:
            yield item
    except ApiError as error:
        if error.reason != "SERVER_DRAINING":
            log.warning("live stream ended: %s", error)


class _SseResponse(StreamingResponse):
    """An SSE body: its frames, sent as they come from one task per response, and a heartbeat
    whenever ``_Heartbeats`` finds it idle. The frames' watch is read by the task that sends,
    so a commit reaches a reader in one wake-up (no hand-over between tasks per message)."""

    def __init__(self, frames: AsyncIterator[bytes], heartbeats: _Heartbeats, hold_s: float | None) -> None:
        super().__init__(
            frames, headers={"Cache-Control": "no-store", **SECURITY}, media_type="text/event-stream"
        )
        self.frames = frames
        self.heartbeats = heartbeats
        self.hold_s = hold_s  # the caller's ``timeout``: the body ends then, as on a drain
        self.idle = True
        self._sending = asyncio.Lock()  # a heartbeat's write never lands inside another write
        self._done = False
        self._send: Send | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._send = send
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        # Until the frames end or the client goes; leaving cancels the other and awaits both, and
        # raises what either crashed with (the response then ends without its last chunk).
        async with TaskGroup("an SSE response") as tasks:
            sender = tasks.start_soon(self._send_frames(), name="electric-sse-frames")
            gone = tasks.start_soon(_disconnected(receive), name="electric-sse-disconnect")
            self.heartbeats.add(self)
            try:
                await asyncio.wait({sender, gone}, timeout=self.hold_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self.heartbeats.responses.discard(self)
        async with self._sending:
            self._done = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send_frames(self) -> None:
        assert self._send is not None
        async for frame in self.frames:
            async with self._sending:
                await self._send({"type": "http.response.body", "body": frame, "more_body": True})
            self.idle = False

    async def heartbeat(self) -> None:
        if self._sending.locked() or self._send is None:
            return  # a write is under way: the response is not idle
        async with self._sending:
            if not self._done:
                await self._send({"type": "http.response.body", "body": HEARTBEAT, "more_body": True})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _Heartbeats:
    """One timer for every open SSE response: each ``heartbeat_s``, a response that sent nothing
    since the last tick gets a heartbeat. A timer per response would cost a timer per message,
    on the path every commit takes to every reader."""

    def __init__(self, heartbeat_s: float) -> None:
        self.heartbeat_s = heartbeat_s
        self.responses: set[_SseResponse] = set()
        self._tasks = TaskGroup("the SSE heartbeats")  # the timer, and each heartbeat it sends
        self._timer: asyncio.Task[None] | None = None

    def add(self, response: _SseResponse) -> None:
        self.responses.add(response)
        if self._timer is None or self._timer.done():
            self._timer = self._tasks.start_soon(self._tick(), name="electric-sse-heartbeats")

    async def aclose(self) -> None:
        await self._tasks.aclose()

    async def _tick(self) -> None:
        while self.responses:
            await asyncio.sleep(self.heartbeat_s)
            for response in self.responses:
                if response.idle:
                    # A task each: a reader that does not read holds up its own heartbeat only.
                    self._tasks.start_soon(response.heartbeat(), name="electric-sse-heartbeat")
                response.idle = True


def _draining() -> ApiError:
    return draining_error()
