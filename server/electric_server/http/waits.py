"""``POST /{type}/{id}/messages?wait=run&timeout=D``: send a message and answer how its run ended.

The server waits here, since an HTTP caller has no watch of its own to fold:
the message is sent as ``sendMessage`` sends it (the same builder, the same
``SendMessage``), then the service's own ``WatchEvents`` from the message's
offset is folded by ``_wire.run_outcome.RunFollow`` (the fold every door
shares) until the run ends or ``timeout`` passes. The answer is the message's
receipt plus ``run``: its status (``completed``, ``failed``, ``aborted``,
``cancelled``; ``queued`` or ``started`` with ``ended: false`` when the
timeout passed first: the message stays delivered), output and error.

A wait cut off (the connection lost, the replica draining: 503) is resumed by
sending the same request again with the same ``Idempotency-Key``: the send
answers its first receipt without a second message, and the wait starts over
from the message's offset, on whichever replica takes it. ``wait`` and
``timeout`` are query parameters, not part of the body, so they do not count
in the key's comparison.
"""

from __future__ import annotations

from typing import Any, cast

import anyio
from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import Response

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.entities import entity_url
from electric_sdk._wire.events import event_value_json
from electric_sdk._wire.rendering import message_receipt_json
from electric_sdk._wire.run_outcome import WAIT_KINDS, RunFollow
from electric_sdk.durations import MAX_WAIT_MS

from ..core.auth import current_principal, denial, entity_scope
from ..core.errors import DoorContext, invalid_argument
from . import body
from .admission import Endpoint, JSONResponse, admitted_endpoint
from .handlers import DoorParts
from .query import Query, query_duration, query_one
from .query import ref as path_ref

__all__ = ["MAX_WAIT_MS", "send_and_wait", "send_request"]


def send_request(request: Request, query: Query, obj: body.JsonObject) -> Message:
    """The SendMessage of ``POST /{type}/{id}/messages``, with or without a wait."""
    body.fields(obj, {"text", "data", "policy"})
    message = api.SendMessageRequest(
        ref=path_ref(request), text=body.text(obj), policy=body.string(obj, "policy")
    )
    if "data" in obj:
        message.data.CopyFrom(body.json_value(obj, "data"))
    return message


def _waited_request(request: Request, query: Query, obj: body.JsonObject) -> Message:
    _wait_of(query)  # a bad wait or timeout is refused before anything is sent
    return send_request(request, query, obj)


def _wait_of(query: Query) -> int | None:
    """The wait's bound in milliseconds (``timeout``, at most ``MAX_WAIT_MS``: a longer one
    waits ``MAX_WAIT_MS``); None without ``wait``: a ``timeout`` alone is checked, and the
    message only sent (the document lists the two apart, so it allows either alone)."""
    timeout = query_duration(query, "timeout", MAX_WAIT_MS)
    if "wait" not in query:
        return None
    wait = query_one(query, "wait")
    if wait not in WAIT_KINDS:
        raise invalid_argument(
            "UNKNOWN_WAIT", f"wait must be one of {', '.join(WAIT_KINDS)}, got {wait[:40]!r}", field="wait"
        )
    return MAX_WAIT_MS if timeout is None else timeout


def send_and_wait(parts: DoorParts) -> Endpoint:
    """The endpoint of ``POST /{type}/{id}/messages`` given ``wait`` (or ``timeout``)."""
    service = parts.service

    async def respond(request: Request, message: Message, context: DoorContext) -> Response:
        assert isinstance(message, api.SendMessageRequest)
        query: Query = {}
        for name, value in request.query_params.multi_items():
            query.setdefault(name, []).append(value)
        wait_ms = _wait_of(query)
        # The answer holds the run's output: reading it needs `read` (refused, nothing is sent).
        if (
            wait_ms is not None
            and parts.tokens is not None
            and (refused := denial(current_principal.get(), "read"))
        ):
            raise refused
        receipt = await service.SendMessage(message, cast(Any, context))
        url = entity_url(message.ref.type, message.ref.id)
        answer = message_receipt_json(url, receipt)
        if wait_ms is None:
            return JSONResponse(answer)
        run = RunFollow(receipt.key, entity_state=answer["state"])
        with anyio.move_on_after(wait_ms / 1000):
            watch = api.WatchEventsRequest(ref=message.ref, from_offset=receipt.offset, accepts_batches=True)
            stream = service.WatchEvents(watch, cast(Any, context))
            try:
                async for item in stream:
                    if _fold(run, item):
                        break
            finally:
                await stream.aclose()  # type: ignore[attr-defined]
        return JSONResponse(answer | {"run": run.to_json()})

    send = "SendMessage"
    return admitted_endpoint(
        parts.tokens, send, entity_scope(send), {"wait", "timeout"}, _waited_request, respond, has_body=True
    )


def _fold(run: RunFollow, item: object) -> bool:
    """Fold one item of the watch; True once the run has ended (or the stream has)."""
    m = api.WatchEventsResponse.FromString(item) if isinstance(item, bytes) else item
    assert isinstance(m, api.WatchEventsResponse)
    kind = m.WhichOneof("item")
    if kind == "end_of_stream":
        run.stream_closed()
        return True
    events: list[pb.Event] = list(m.events.events) if kind == "events" else [m.event]
    for event in events:
        run.see(event.type, event.key, event_value_json(event), event.offset)
        if run.ended:
            return True
    return False
