"""``POST /{type}/{id}/signal?wait=STAGE&timeout=D``: signal and answer how far it reached.

The HTTP door's form of the SDK's ``signal(..., wait=STAGE, timeout=...)``
(issue 48, "Staged receipts"): the signal is sent as ``signalEntity`` sends it
(the same builder, the same ``SignalEntity``), with the request's ``wait`` and
``timeout``, and the service answers at that stage as it does over gRPC
(core/signal_answers.py: the stream after the signal's record, folded by
``_wire.stop_stages.StageFollow``, the fold every door shares). The answer is
the signal's result plus ``stages``: each stage the signal has, reached
(``offset``, ``at``) or not (``detail``: the worker was lost, not reached
within the timeout, not waited for). A stage the signal does not have, or an
unknown one, is refused before anything is sent (400 ``STAGE_NOT_AVAILABLE``,
``UNKNOWN_WAIT``); so is a wait without the ``read`` scope.
"""

from __future__ import annotations

from typing import Any, cast

from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import Response

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._wire.enums import signal_from_pb
from electric_sdk._wire.rendering import signal_json
from electric_sdk._wire.stop_stages import parse_stage, report_from_pb
from electric_sdk._wire.times import duration_from_ms
from electric_sdk.lifecycle import Stage, StageUnavailable

from ..core.auth import entity_scope
from ..core.errors import DoorContext, invalid_argument
from . import body
from .admission import Endpoint, JSONResponse, admitted_endpoint
from .handlers import DoorParts, Handler
from .query import Query, query_duration, query_one
from .waits import MAX_WAIT_MS

__all__ = ["signal_and_wait"]

Build = Any  # routes' request builder: (Request, Query, JsonObject) -> Message


def _stage_of(query: Query, message: api.SignalEntityRequest) -> tuple[Stage | None, int]:
    """The stage waited for (None: no wait; a ``timeout`` alone is checked, unused) and the bound
    in milliseconds."""
    timeout = query_duration(query, "timeout", MAX_WAIT_MS)
    if "wait" not in query:
        return None, 0
    text = query_one(query, "wait")
    try:
        stage = parse_stage(signal_from_pb(message.signal), text)
    except StageUnavailable as exc:
        raise invalid_argument(StageUnavailable.reason, str(exc), field="wait") from None
    except ValueError as exc:
        raise invalid_argument("UNKNOWN_WAIT", str(exc), field="wait") from None
    return stage, MAX_WAIT_MS if timeout is None else timeout


def _query(request: Request) -> Query:
    query: Query = {}
    for name, value in request.query_params.multi_items():
        query.setdefault(name, []).append(value)
    return query


def signal_and_wait(build: Build) -> Handler:
    """The endpoint maker of ``POST /{type}/{id}/signal`` given ``wait`` (or ``timeout``)."""

    def waited(request: Request, query: Query, obj: body.JsonObject) -> Message:
        message = build(request, query, obj)
        _stage_of(query, message)  # a bad wait or timeout is refused before anything is sent
        return cast(Message, message)

    def endpoint(parts: DoorParts) -> Endpoint:
        service = parts.service

        async def respond(request: Request, message: Message, context: DoorContext) -> Response:
            assert isinstance(message, api.SignalEntityRequest)
            stage, wait_ms = _stage_of(_query(request), message)
            if stage is not None:  # the service waits (core/signal_answers.py), as over gRPC
                message.wait = stage.value
                message.timeout.CopyFrom(duration_from_ms(wait_ms))
            response = await service.SignalEntity(message, cast(Any, context))
            answer = signal_json(response)
            if stage is None:
                return JSONResponse(answer)
            return JSONResponse(answer | {"stages": [report_from_pb(r).to_json() for r in response.stages]})

        method = "SignalEntity"
        return admitted_endpoint(
            parts.tokens, method, entity_scope(method), {"wait", "timeout"}, waited, respond, has_body=True
        )

    return endpoint
