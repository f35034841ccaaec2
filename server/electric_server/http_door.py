"""The HTTP/JSON door: the RFC's routes over the same EntityService as gRPC.

No second copy of any rule (ARCHITECTURE §6, "Two doors"): each route builds
the gRPC request message from its path, query and JSON body (``http_body``),
checks the token with auth.py's own checks, and calls the ``EntityService``
method with a ``DoorContext``; validation, idempotency (the same message, so
the same hash), the write and the error's reason are the service's. An error
leaves as ``{"error": {"code", "message", "details"}}`` with the HTTP status of
``errors.HTTP_STATUS``; a response renders through ``_wire.rendering``, as the
SDK's ``to_json()`` does.

Routes (docs/http.md), also under ``/_electric/entities`` as ElectricSQL's
server serves them; the reserved paths are matched first:

| route | call |
|---|---|
| ``GET /healthz``, ``GET /readyz`` | alive; store writable and not draining (no token) |
| ``GET /metrics`` | Prometheus text format (``read`` with tokens; metrics.py) |
| ``GET /entities?type=&state=&page_size=&page_token=`` | ListEntities |
| ``POST /signal`` ``{selector, signal, reason?, payload?}`` | SignalEntities |
| ``PUT /{type}/{id}`` ``{profile?}`` | SpawnEntity |
| ``GET /{type}/{id}`` | GetEntity |
| ``DELETE /{type}/{id}`` | DeleteEntity (deprecated: SIGKILL, "legacy delete") |
| ``POST /{type}/{id}/signal`` ``{signal, reason?, payload?, message_key?}`` | SignalEntity |
| ``POST /{type}/{id}/messages`` ``{text?, data?}`` | SendMessage |
| ``GET /{type}/{id}/events?offset=&limit=`` | ReadEvents |

uvicorn serves it as a task of the server's own loop: lifespan off, no signal
handlers of its own (the server's drain owns SIGINT and SIGTERM), its logging
left to propagate to ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import uvicorn
from google.protobuf.message import Message
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.entities import entity_url
from electric_sdk._wire.enums import SIGNAL_TO_PB
from electric_sdk._wire.rendering import (
    entity_json,
    event_json,
    message_receipt_json,
    signal_json,
    signal_many_json,
)
from electric_sdk._wire.times import duration_from_ms
from electric_sdk.lifecycle import Signal

from . import http_body as body
from .auth import (
    ANONYMOUS,
    Principal,
    TokenTable,
    bearer_principal,
    current_principal,
    denial,
    entity_scope,
    type_denial,
)
from .config_error import ConfigError
from .errors import ApiError, DoorContext, abort_with, http_error, invalid_argument, to_api_error, unexpected
from .http_query import parse_states as _parse_states
from .http_query import query as _query
from .http_query import query_one as _query_one
from .http_query import ref as _ref
from .http_streams import EntityStreams
from .metrics import CONTENT_TYPE
from .service import EntityService

log = logging.getLogger("electric.http")

PREFIX = "/_electric/entities"
MIGRATION_DOC = "docs/migration-delete.md"
MAX_UINT32 = 2**32 - 1
MAX_UINT64 = 2**64 - 1
# Readiness: None when ready, else why not (an UNAVAILABLE error).
Readiness = Callable[[], ApiError | None]
# The metrics in Prometheus text format (metrics.ServerMetrics.render).
Metrics = Callable[[], bytes]
Build = Callable[[Request, body.JsonObject], Message]
# The gRPC request and response → the JSON response body.
Render = Callable[[Any, Any], Any]


def _error_response(error: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    status, content = http_error(error)
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return JSONResponse(content, status, headers)


def _parse_signal(text: str) -> pb.Signal.ValueType:
    try:
        return SIGNAL_TO_PB[Signal.parse(text)]
    except ValueError as exc:
        raise invalid_argument("UNKNOWN_SIGNAL", str(exc), field="signal") from None


def _query_int(query: dict[str, list[str]], field: str, maximum: int) -> int:
    values = query.get(field)
    if not values:
        return 0
    if len(values) > 1 or not body.is_number(values[-1]) or int(values[-1]) > maximum:
        raise invalid_argument(
            "INVALID_FIELD", f"{field} must be one whole number from 0 to {maximum}", field=field
        )
    return int(values[-1])


def _signal_fields(
    obj: body.JsonObject, message: api.SignalEntityRequest | api.SignalEntitiesRequest
) -> None:
    message.signal = _parse_signal(body.string(obj, "signal"))
    message.reason = body.string(obj, "reason")
    if "payload" in obj:
        message.payload.CopyFrom(body.json_value(obj, "payload"))


# -- request builders: path, query and body → the gRPC request ---------------------------------------


def _spawn(request: Request, obj: body.JsonObject) -> Message:
    body.fields(obj, {"profile"})
    ref = _ref(request)
    if ref.type.startswith("_"):
        raise invalid_argument(
            "RESERVED_NAME", "entity types starting with '_' are reserved over HTTP", field="ref.type"
        )
    message = api.SpawnEntityRequest(ref=ref)
    profile = body.mapping(obj, "profile")
    body.fields(profile, {"grace_period_ms", "idle_timeout_ms"}, "profile.")
    for field, name in (("grace_period_ms", "grace_period"), ("idle_timeout_ms", "idle_timeout")):
        ms = body.integer(profile, field, body.MAX_DURATION_FIELD_MS)
        if ms is not None:
            getattr(message.profile, name).CopyFrom(duration_from_ms(ms))
    return message


def _get(request: Request, obj: body.JsonObject) -> Message:
    return api.GetEntityRequest(ref=_ref(request))


def _delete(request: Request, obj: body.JsonObject) -> Message:
    return api.DeleteEntityRequest(ref=_ref(request))


def _list(request: Request, obj: body.JsonObject) -> Message:
    query = _query(request, {"type", "state", "page_size", "page_token"})
    return api.ListEntitiesRequest(
        type=_query_one(query, "type"),
        states=_parse_states(query.get("state", []), "state"),
        page_size=_query_int(query, "page_size", MAX_UINT32),
        page_token=_query_one(query, "page_token"),
    )


def _signal(request: Request, obj: body.JsonObject) -> Message:
    body.fields(obj, {"signal", "reason", "payload", "message_key"})
    message = api.SignalEntityRequest(ref=_ref(request), message_key=body.string(obj, "message_key"))
    _signal_fields(obj, message)
    return message


def _signal_many(request: Request, obj: body.JsonObject) -> Message:
    body.fields(obj, {"selector", "signal", "reason", "payload"})
    selector = body.mapping(obj, "selector")
    body.fields(selector, {"type", "states", "refs"}, "selector.")
    refs = []
    for text in body.strings(selector, "refs"):
        type_, sep, id_ = text.removeprefix("/").partition("/")
        if not sep:
            raise invalid_argument(
                "INVALID_NAME", f"selector.refs: expected /TYPE/ID, got {text[:140]!r}", field="selector.refs"
            )
        refs.append(pb.EntityRef(type=type_, id=id_))
    message = api.SignalEntitiesRequest(
        selector=api.EntitySelector(
            type=body.string(selector, "type"),
            states=_parse_states(body.strings(selector, "states"), "selector.states"),
            refs=refs,
        )
    )
    _signal_fields(obj, message)
    return message


def _send(request: Request, obj: body.JsonObject) -> Message:
    body.fields(obj, {"text", "data"})
    message = api.SendMessageRequest(ref=_ref(request), text=body.string(obj, "text"))
    if "data" in obj:
        message.data.CopyFrom(body.json_value(obj, "data"))
    return message


def _events(request: Request, obj: body.JsonObject) -> Message:
    query = _query(request, {"offset", "limit"})
    return api.ReadEventsRequest(
        ref=_ref(request),
        from_offset=_query_int(query, "offset", MAX_UINT64),
        limit=_query_int(query, "limit", MAX_UINT32),
    )


# -- responses: the gRPC response → the RFC's JSON --------------------------------------------------


def _events_page(_request: Any, m: Any) -> dict[str, Any]:
    return {
        "events": [event_json(e) for e in m.events],
        "next_offset": m.next_offset,
        "head_offset": m.head_offset,
        "end_of_stream": m.end_of_stream,
    }


def _entities_page(_request: Any, m: Any) -> dict[str, Any]:
    return {"entities": [entity_json(e) for e in m.entities], "next_page_token": m.next_page_token}


def _entity(_request: Any, m: Any) -> dict[str, Any]:
    return entity_json(m.entity)


def _signalled(_request: Any, m: Any) -> dict[str, Any]:
    return signal_json(m)


def _deleted(_request: Any, m: Any) -> dict[str, Any]:
    return signal_json(m.result)


def _signal_many_json(_request: Any, m: Any) -> dict[str, Any]:
    return signal_many_json(m)


def _receipt(request: Any, m: Any) -> dict[str, Any]:
    return message_receipt_json(entity_url(request.ref.type, request.ref.id), m)


DEPRECATED = {
    "Deprecation": "true",
    "Link": f'<{MIGRATION_DOC}>; rel="deprecation"; type="text/markdown"',
}


class HttpDoor:
    """The routes, and the uvicorn server that serves them on ``listen``."""

    def __init__(
        self,
        service: EntityService,
        tokens: TokenTable | None,
        readiness: Readiness,
        listen: str,
        *,
        grace_s: float = 10.0,
        tls: tuple[Path, Path] | None = None,
        metrics: Metrics | None = None,
        streams: dict[str, float] | None = None,
    ) -> None:
        self.service = service
        self.streams = streams or {}  # EntityStreams' timing: heartbeat_s, long_poll_s
        self.metrics = metrics
        self.tokens = tokens
        self.readiness = readiness
        self.listen = listen
        self.grace_s = grace_s
        self.tls = tls
        self.port = 0
        self._server: _Uvicorn | None = None
        self._task: asyncio.Task[None] | None = None
        self.app = Starlette(routes=self._routes(), exception_handlers={HTTPException: _route_error})

    # -- routes ------------------------------------------------------------------------------------

    def _routes(self) -> list[BaseRoute]:
        def route(path: str, method: str, call: str, build: Build, render: Render, **kw: Any) -> Route:
            return Route(path, self._endpoint(call, build, render, **kw), methods=[method])

        routes: list[BaseRoute] = [
            Route("/healthz", self._healthz, methods=["GET"]),
            Route("/readyz", self._readyz, methods=["GET"]),
        ]
        if self.metrics is not None:
            routes.append(Route("/metrics", self._metrics, methods=["GET"]))
        streams = EntityStreams(self.service, self._draining, **self.streams)
        for prefix, list_path in ((PREFIX, PREFIX), ("", "/entities")):
            one = f"{prefix}/{{type}}/{{id}}"
            routes += streams.routes(prefix, list_path, self._endpoint)  # GET /entities?live=sse first
            routes += [
                route(list_path, "GET", "ListEntities", _list, _entities_page, has_body=False),
                route(f"{prefix}/signal", "POST", "SignalEntities", _signal_many, _signal_many_json),
                route(f"{one}", "PUT", "SpawnEntity", _spawn, _entity, status=201, optional=True),
                route(f"{one}", "GET", "GetEntity", _get, _entity, has_body=False),
                route(
                    f"{one}", "DELETE", "DeleteEntity", _delete, _deleted, has_body=False, headers=DEPRECATED
                ),
                route(f"{one}/signal", "POST", "SignalEntity", _signal, _signalled),
                route(f"{one}/messages", "POST", "SendMessage", _send, _receipt),
                route(f"{one}/events", "GET", "ReadEvents", _events, _events_page, has_body=False),
            ]
            if prefix:  # nothing else under /_electric reaches the entity routes below
                routes.append(
                    Route("/_electric/{rest:path}", _not_found, methods=["GET", "POST", "PUT", "DELETE"])
                )
        return routes

    def _endpoint(
        self,
        method: str,
        build: Build,
        render: Render | None,
        *,
        has_body: bool = True,
        optional: bool = False,
        status: int = 200,
        headers: dict[str, str] | None = None,
        reply: Callable[[Request, Any, DoorContext], Awaitable[Response]] | None = None,
    ) -> Callable[[Request], Awaitable[Response]]:
        """``reply``: answers in place of the call and ``render`` (http_streams' live reads)."""
        call = getattr(self.service, method)
        scope = entity_scope(method)

        async def admit(request: Request) -> tuple[Message, Principal]:
            """The request as the gRPC call's message, and who makes it; ApiError if refused."""
            principal = ANONYMOUS
            if self.tokens is not None:  # the token first: a refused caller's body is never read
                found = bearer_principal(self.tokens, request.headers.get("authorization"))
                refused = denial(found, scope)
                if refused is not None:
                    raise refused
                assert found is not None
                principal = found
            obj: body.JsonObject = {}
            if has_body:
                raw = await body.read_limited(request.stream(), request.headers.get("content-length"))
                obj = body.parse(raw, request.headers.get("content-type"), required=not optional)
            message = build(request, obj)
            key = request.headers.get("idempotency-key")
            if key is not None and "idempotency_key" in message.DESCRIPTOR.fields_by_name:
                message.idempotency_key = key  # type: ignore[attr-defined]
            if principal.types is not None:
                refused = type_denial(principal, message)
                if refused is not None:
                    raise refused
            return message, principal

        async def endpoint(request: Request) -> Response:
            client = request.client
            context = DoorContext(f"http:{client.host}:{client.port}" if client else "http")
            try:
                try:
                    message, principal = await admit(request)
                except ApiError as error:
                    await abort_with(context, error, method)  # logged as gRPC's refusals are
                    raise  # (abort_with raised it already: a DoorContext's abort is the error itself)
                reset = current_principal.set(principal)
                try:
                    if reply is not None:
                        return await reply(request, message, context)
                    response = await call(message, cast(Any, context))
                finally:
                    current_principal.reset(reset)
            except ApiError as error:
                return _error_response(error, headers)
            except Exception as exc:  # a bug: logged, answered INTERNAL
                return _error_response(to_api_error(exc) or unexpected(exc, method), headers)
            assert render is not None  # None only with a reply
            return JSONResponse(render(message, response), status, headers)

        return endpoint

    def _draining(self) -> bool:
        return getattr(self.readiness(), "reason", None) == "SERVER_DRAINING"

    async def _healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def _readyz(self, request: Request) -> Response:
        why = self.readiness()
        return JSONResponse({"status": "ready"}) if why is None else _error_response(why)

    async def _metrics(self, request: Request) -> Response:
        assert self.metrics is not None  # the route exists only then
        if self.tokens is not None:
            principal = bearer_principal(self.tokens, request.headers.get("authorization"))
            refused = denial(principal, "read")
            if refused is None and principal is not None and principal.types is not None:
                # The metrics span every type (workers are labelled by theirs).
                refused = ApiError(
                    grpc.StatusCode.PERMISSION_DENIED,
                    "TYPE_NOT_ALLOWED",
                    f"principal {principal.name!r} is limited to types; the metrics span them all",
                )
            if refused is not None:
                return _error_response(refused)
        return Response(self.metrics(), headers={"Content-Type": CONTENT_TYPE})

    # -- serving -------------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        host = self.listen.rpartition(":")[0].strip("[]")
        scheme = "https" if self.tls else "http"
        return f"{scheme}://[{host}]:{self.port}" if ":" in host else f"{scheme}://{host}:{self.port}"

    async def start(self) -> None:
        """Bind ``listen`` (ConfigError if it cannot), then serve as a task of this loop."""
        host, _, port = self.listen.rpartition(":")
        host = host.strip("[]")
        if not port.isdigit():
            raise ConfigError(f"--http must be HOST:PORT or off, got {self.listen!r}")
        try:
            sock = _listening_socket(host, int(port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {self.listen} for HTTP: {exc.strerror or exc}") from exc
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            lifespan="off",
            loop="none",
            http="h11",
            ws="none",
            log_config=None,  # uvicorn's loggers propagate to the server's handlers
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=max(1, round(self.grace_s)),
            ssl_certfile=self.tls[0] if self.tls else None,
            ssl_keyfile=self.tls[1] if self.tls else None,
        )
        try:
            config.load()  # here, so a bad certificate refuses to start rather than failing a task
        except (OSError, ValueError) as exc:
            sock.close()
            raise ConfigError(f"cannot serve HTTP on {self.listen}: {exc}") from exc
        self._server = _Uvicorn(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="electric-http")
        log.info("electric http listening on %s", self.address)

    async def stop(self) -> None:
        """Stop accepting; in-flight requests finish within the grace. Safe to repeat."""
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        task, self._task = self._task, None
        await task


def _listening_socket(host: str, port: int) -> socket.socket:
    """Bound here, so a port in use refuses to start and port 0's choice is known at once.

    Made with ``IPPROTO_TCP`` named: asyncio sets ``TCP_NODELAY`` only on sockets that say so
    (the ones ``socket.create_server`` makes do not), and without it each response on a kept-alive
    connection waits ~40 ms for the client's delayed ACK (uvicorn writes headers and body apart).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the server's drain owns SIGINT and SIGTERM (app.py)


ROUTE_REASONS = {404: "ROUTE_NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}


async def _route_error(request: Request, exc: Exception) -> Response:
    """No route for the path (404) or the method (405): the same error body as any other."""
    assert isinstance(exc, HTTPException)
    reason = ROUTE_REASONS.get(exc.status_code, "MALFORMED_REQUEST")
    code = (
        grpc.StatusCode.INVALID_ARGUMENT if reason == "MALFORMED_REQUEST" else grpc.StatusCode.UNIMPLEMENTED
    )
    error = ApiError(code, reason, f"{request.method} {request.url.path}: {exc.detail}")
    return _error_response(error, dict(exc.headers or {}))


async def _not_found(request: Request) -> Response:
    raise HTTPException(404)
