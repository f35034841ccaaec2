"""What a route's handler is, and the door's own: the probes, the metrics, this door's OpenAPI
document and an entity's state.

A route of ``http/routes.py`` that no ``EntityService`` method serves names its
handler as a function, ``Handler``: given the door's parts (``DoorParts``), it
makes the route's endpoint once, or answers None when this door lacks what the
route needs (the metrics, the live reads), and the door then leaves the route
out. The route table imports the handlers; the door only calls them, so grep
and mypy follow a route to its code, and the table never imports the door.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import Response

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api

from ..core.auth import Principal, TokenTable, entity_scope, principal_of, refusal_of
from ..core.errors import ApiError, DoorContext
from ..core.service import EntityService
from .admission import Endpoint, JSONResponse, admitted_endpoint, error_response
from .state import read_state, state_request

if TYPE_CHECKING:
    from .streams import EntityStreams

__all__ = [
    "METRICS_CONTENT_TYPE",
    "DoorParts",
    "Handler",
    "Metrics",
    "Readiness",
    "healthz",
    "metrics",
    "openapi",
    "readyz",
    "state",
]

# Readiness: None when ready, else why not (an UNAVAILABLE error).
Readiness = Callable[[], ApiError | None]
# The metrics in Prometheus text format (metrics.ServerMetrics.render: prometheus_client's
# generate_latest, the text exposition format 0.0.4), and the type they are served with.
Metrics = Callable[[], bytes]
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class DoorParts:
    """What a door serves its routes with; a handler makes its endpoint from these."""

    service: EntityService
    tokens: TokenTable | None
    readiness: Readiness
    openapi_json: bytes  # this door's document, rendered once
    metrics: Metrics | None = None  # None: no /metrics route
    streams: EntityStreams | None = None  # None: no live reads (http/streams.py)


Handler = Callable[[DoorParts], Endpoint | None]


def healthz(parts: DoorParts) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    return endpoint


def readyz(parts: DoorParts) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        why = parts.readiness()
        return JSONResponse({"status": "ready"}) if why is None else error_response(why)

    return endpoint


def metrics(parts: DoorParts) -> Endpoint | None:
    """The metrics, for a caller who may read every type's; None for a door without metrics."""
    render = parts.metrics
    if render is None:
        return None

    async def endpoint(request: Request) -> Response:
        refused = _read_refused(parts.tokens, request, all_types=True)
        return refused or Response(render(), headers={"Content-Type": METRICS_CONTENT_TYPE})

    return endpoint


def openapi(parts: DoorParts) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        refused = _read_refused(parts.tokens, request, all_types=False)
        return refused or Response(parts.openapi_json, media_type="application/json")

    return endpoint


def state(parts: DoorParts) -> Endpoint:
    """GET /{type}/{id}/state (http/state.py): admitted as the ReadEvents it reads the stream by."""

    async def respond(request: Request, message: Message, context: DoorContext) -> Response:
        assert isinstance(message, api.ReadEventsRequest)
        return JSONResponse(await read_state(parts.service, message, context))

    read = "ReadEvents"
    return admitted_endpoint(parts.tokens, read, entity_scope(read), set(), state_request, respond)


def _read_refused(tokens: TokenTable | None, request: Request, *, all_types: bool) -> Response | None:
    """With tokens, the error response for a caller without ``read`` (and, for what spans
    every type, for a principal limited to some types); None when it may read."""
    if tokens is None:
        return None
    principal = principal_of(tokens, request.headers.getlist("authorization"))
    refused = refusal_of(principal, "read")
    if refused is None and all_types and isinstance(principal, Principal) and principal.types is not None:
        # The metrics span every type (workers are labelled by theirs).
        refused = ApiError(
            grpc.StatusCode.PERMISSION_DENIED,
            "TYPE_NOT_ALLOWED",
            f"principal {principal.name!r} is limited to types; the metrics span them all",
        )
    return None if refused is None else error_response(refused)
