"""The HTTP/JSON door: the RFC's routes over the same EntityService as gRPC.

No second copy of any rule (ARCHITECTURE §6, "Two doors"): each route builds
the gRPC request message from its path, query and JSON body (``http/body.py``),
checks the token with auth.py's own checks, and calls the ``EntityService``
method with a ``DoorContext``; validation, idempotency (the same message, so
the same hash), the write and the error's reason are the service's. An error
leaves as ``{"error": {"code", "message", "details"}}`` with the HTTP status of
``errors.HTTP_STATUS``; a response renders through ``_wire.rendering``, as the
SDK's ``to_json()`` does.

The routes are the table in ``http/routes.py`` (docs/http.md, docs/openapi.json),
also under ``/_electric/entities`` as ElectricSQL's server serves them; the
fixed paths (``/healthz``, ``/readyz``, ``/metrics``, ``/openapi.json``,
``/_electric/…``) are matched first. A route the table gives another module's
handler (the Durable Streams read, SSE) is mounted when that handler is given.

uvicorn serves it as a task of the door's own group (lifetime.py), on the server's loop: h11 with
each turn's writes sent as one (fastpaths/http_cork.py), lifespan off, no signal handlers of its
own (the server's drain owns SIGINT and SIGTERM), its logging left to propagate to ours.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import grpc
import uvicorn
from google.protobuf.message import Message
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse as _StarletteJSON
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Scope

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api

from ..config_error import ConfigError
from ..core.auth import (
    ANONYMOUS,
    Principal,
    TokenTable,
    bearer_principal,
    current_principal,
    denial,
    entity_scope,
    type_denial,
)
from ..core.errors import (
    ApiError,
    DoorContext,
    abort_with,
    http_error,
    invalid_argument,
    to_api_error,
    unexpected,
)
from ..core.service import EntityService
from ..fastpaths.http_cork import CorkedH11Protocol
from ..fastpaths.route_table import RouteTable
from ..lifetime import Component, TaskGroup
from . import body
from .openapi import render as render_openapi
from .query import Query
from .routes import PREFIX, ROUTES, Build, HttpRoute, served_paths
from .state import read_state, state_request

log = logging.getLogger("electric.http")

# Readiness: None when ready, else why not (an UNAVAILABLE error).
Readiness = Callable[[], ApiError | None]
# The metrics in Prometheus text format (metrics.ServerMetrics.render: prometheus_client's
# generate_latest, the text exposition format 0.0.4), and the type they are served with.
Metrics = Callable[[], bytes]
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Endpoint = Callable[[Request], Awaitable[Response]]

# CORS, with --cors-origin (off without): what a page's fetch may send, and may read back.
CORS_ALLOW_HEADERS = ["Authorization", "Content-Type", "Idempotency-Key", "If-None-Match", "Last-Event-ID"]
CORS_EXPOSE_HEADERS = [
    "Stream-Next-Offset",
    "Stream-Up-To-Date",
    "Stream-Cursor",
    "ETag",
    "Deprecation",
    "Link",
]
# An origin as a browser sends it: scheme, host, optional port; no path, no wildcard.
_ORIGIN = re.compile(r"https?://[a-z0-9.-]+(:[0-9]{1,5})?|https?://\[[0-9a-f:.]+\](:[0-9]{1,5})?")


def check_cors_origins(origins: tuple[str, ...], http: str | None) -> None:
    """ConfigError unless each is an origin exactly as a browser sends it (and HTTP is on)."""
    if origins and not http:
        raise ConfigError("--cors-origin needs --http")
    for origin in origins:
        if not _ORIGIN.fullmatch(origin):
            raise ConfigError(
                f"--cors-origin must be an origin as a browser sends it, lower case "
                f"SCHEME://HOST[:PORT] without a path or '*', not {origin!r}"
            )


# Starlette's JSONResponse calls json.dumps with options, which builds an encoder per response.
_ENCODE = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


class JSONResponse(_StarletteJSON):
    """Starlette's JSON response, byte for byte, through one encoder made once."""

    def render(self, content: Any) -> bytes:
        return _ENCODE(content).encode("utf-8")


# Answers an admitted request: its gRPC message, with the caller's principal set (current_principal).
Respond = Callable[[Request, Message, DoorContext], Awaitable[Response]]


def admitted_endpoint(
    tokens: TokenTable | None,
    method: str,
    scope: str,
    query_names: set[str],
    build: Build,
    respond: Respond,
    *,
    has_body: bool = False,
    optional: bool = False,
    headers: dict[str, str] | None = None,
) -> Endpoint:
    """An endpoint that admits a request as every route of the door does (the token and its
    scope, the query's names, the body, the type limits; a refusal logged as gRPC's are and
    answered with the error body) and then ``respond``s as ``method``'s caller. The door's
    service routes are these; so are http/streams.py's live reads, which answer otherwise."""

    async def admit(request: Request) -> tuple[Message, Principal]:
        """The request as the gRPC call's message, and who makes it; ApiError if refused."""
        headers = _admission_headers(request.scope)
        principal = ANONYMOUS
        if tokens is not None:  # the token first: a refused caller's body is never read
            found = bearer_principal(tokens, headers.get("authorization"))
            refused = denial(found, scope)
            if refused is not None:
                raise refused
            assert found is not None
            principal = found
        query: Query = {}
        if request.scope["query_string"]:
            for name, value in request.query_params.multi_items():
                query.setdefault(name, []).append(value)
            body.fields(query, query_names, "query ")
        obj: body.JsonObject = {}
        if has_body:
            raw = await body.read_limited(request.receive, headers.get("content-length"))
            obj = body.parse(raw, headers.get("content-type"), required=not optional)
        message = build(request, query, obj)
        key = headers.get("idempotency-key")
        if key is not None and "idempotency_key" in message.DESCRIPTOR.fields_by_name:
            message.idempotency_key = key  # type: ignore[attr-defined]
        if principal.types is not None:
            refused = type_denial(principal, message)
            if refused is not None:
                raise refused
        return message, principal

    async def endpoint(request: Request) -> Response:
        client = request.scope.get("client")
        context = DoorContext(f"http:{client[0]}:{client[1]}" if client else "http")
        try:
            try:
                message, principal = await admit(request)
            except ApiError as error:
                await abort_with(context, error, method)  # logged as gRPC's refusals are
                raise  # (abort_with raised it already: a DoorContext's abort is the error itself)
            reset = current_principal.set(principal)
            try:
                return await respond(request, message, context)
            finally:
                current_principal.reset(reset)
        except ApiError as error:
            return _error_response(error, headers)
        except Exception as exc:  # a bug: logged, answered INTERNAL
            return _error_response(to_api_error(exc) or unexpected(exc, method), headers)

    return endpoint


_ADMISSION_HEADERS = frozenset({b"authorization", b"content-length", b"content-type", b"idempotency-key"})


def _admission_headers(scope: Scope) -> dict[str, str]:
    """The headers admission reads, in one pass over the request's (the first of a name given
    twice, as Starlette's ``Headers.get`` answers)."""
    found: dict[str, str] = {}
    for name, value in scope["headers"]:
        if name in _ADMISSION_HEADERS:
            found.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return found


def _error_response(error: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    status, content = http_error(error)
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return JSONResponse(content, status, headers)


class HttpDoor(Component):
    """The routes, and the uvicorn server that serves them on ``listen``: a component of the
    server (app.py), bound and serving once entered."""

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
        handlers: Mapping[str, Endpoint] | None = None,
        cors_origins: tuple[str, ...] = (),
    ) -> None:
        self.service = service
        # Handlers of the table's routes served by other modules, by the table's name for them.
        self.handlers = dict(handlers or {})
        self._openapi_json = render_openapi().encode()
        self.metrics = metrics
        self.tokens = tokens
        self.readiness = readiness
        self.listen = listen
        self.grace_s = grace_s
        self.tls = tls
        self.port = 0
        # GET /{type}/{id}/state (http/state.py): admitted as the ReadEvents it reads the stream by.
        self._state = admitted_endpoint(
            tokens, "ReadEvents", entity_scope("ReadEvents"), set(), state_request, self._respond_state
        )
        self._server: _Uvicorn | None = None
        self._tasks = TaskGroup("the HTTP door")  # uvicorn's server
        # With --cors-origin: answers preflights itself; adds the allow/expose headers to answers.
        cors: dict[str, Any] = {
            "allow_origins": list(cors_origins),
            "allow_methods": ["GET", "POST", "PUT", "DELETE"],
            "allow_headers": CORS_ALLOW_HEADERS,
            "expose_headers": CORS_EXPOSE_HEADERS,
            "max_age": 600,
        }
        self.routes = self._routes()
        starlette = Starlette(routes=self.routes, exception_handlers={HTTPException: _route_error})
        table = RouteTable(self.routes, starlette)
        # CORS outermost, so the table's answers and Starlette's get its headers alike.
        self.app: ASGIApp = _Cors(table, **cors) if cors_origins else table

    # -- routes ------------------------------------------------------------------------------------

    def _routes(self) -> list[BaseRoute]:
        """The table's routes this door has a handler for, one Starlette route per path (so a
        405's ``Allow`` names every method of the path); the fixed paths first, then every alias
        under ``/_electric/entities`` (nothing else there reaches the entity routes)."""
        by_path: dict[str, dict[str, Endpoint]] = {}
        fixed_paths = set()
        for route in ROUTES:
            endpoint = self._handler(route)
            if endpoint is not None:
                for path, _operation in served_paths(route):
                    by_path.setdefault(path, {})[route.method] = endpoint
                    if not route.aliased:
                        fixed_paths.add(path)
        routes = [Route(path, _by_method(ends), methods=list(ends)) for path, ends in by_path.items()]
        fixed = [r for r in routes if r.path in fixed_paths]
        aliased = [r for r in routes if r.path.startswith(PREFIX)]
        plain = [r for r in routes if r.path not in fixed_paths and not r.path.startswith(PREFIX)]
        electric = [r for r in routes if r.path.startswith("/_electric/")]  # /_electric/workers too

        async def elsewhere_under_electric(request: Request) -> Response:
            """A path under /_electric no route serves: 405 where one has it with another method."""
            for route in electric:
                if route.matches(request.scope)[0] is Match.PARTIAL:
                    raise HTTPException(405, headers={"Allow": ", ".join(sorted(route.methods or ()))})
            raise HTTPException(404)

        methods = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]
        catch_all = Route("/_electric/{rest:path}", elsewhere_under_electric, methods=methods)
        return [*fixed, *aliased, catch_all, *plain]

    def _handler(self, route: HttpRoute) -> Endpoint | None:
        if route.call is not None:
            return self._endpoint(route)
        assert route.handler is not None
        door, _, name = route.handler.partition(".")
        if door == "door":
            if name == "metrics" and self.metrics is None:
                return None  # only a door with metrics to serve routes /metrics
            found: Endpoint = getattr(self, f"_{name}")
            return found
        return self.handlers.get(route.handler)

    def _endpoint(self, route: HttpRoute) -> Endpoint:
        assert route.call is not None
        assert route.scope is not None  # every service call needs a scope
        method, render, status = route.call.method, route.call.render, route.status
        call = getattr(self.service, method)
        headers = dict(route.headers) or None
        # A parameter that hands the request to a mounted handler of another module (live=sse).
        handing_over = {p.name: self.handlers[p.handler] for p in route.query if p.handler in self.handlers}

        async def respond(request: Request, message: Message, context: DoorContext) -> Response:
            response = await call(message, cast(Any, context))
            return JSONResponse(render(message, response), status, headers)

        admitted = admitted_endpoint(
            self.tokens,
            method,
            route.scope,
            {p.name for p in route.query if p.handler is None},
            route.call.build,
            respond,
            has_body=route.call.has_body,
            optional=route.call.optional_body,
            headers=headers,
        )

        if not handing_over:
            return admitted

        async def endpoint(request: Request) -> Response:
            if request.scope["query_string"]:
                for name, handler in handing_over.items():
                    if name in request.query_params:
                        return await handler(request)
            return await admitted(request)

        return endpoint

    async def _respond_state(self, request: Request, message: Message, context: DoorContext) -> Response:
        assert isinstance(message, api.ReadEventsRequest)
        return JSONResponse(await read_state(self.service, message, context))

    async def _healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def _readyz(self, request: Request) -> Response:
        why = self.readiness()
        return JSONResponse({"status": "ready"}) if why is None else _error_response(why)

    def _read_refused(self, request: Request, *, all_types: bool) -> Response | None:
        """With tokens, the error response for a caller without ``read`` (and, for what spans
        every type, for a principal limited to some types); None when it may read."""
        if self.tokens is None:
            return None
        principal = bearer_principal(self.tokens, request.headers.get("authorization"))
        refused = denial(principal, "read")
        if refused is None and all_types and principal is not None and principal.types is not None:
            # The metrics span every type (workers are labelled by theirs).
            refused = ApiError(
                grpc.StatusCode.PERMISSION_DENIED,
                "TYPE_NOT_ALLOWED",
                f"principal {principal.name!r} is limited to types; the metrics span them all",
            )
        return None if refused is None else _error_response(refused)

    async def _metrics(self, request: Request) -> Response:
        assert self.metrics is not None  # the route exists only then
        refused = self._read_refused(request, all_types=True)
        return refused or Response(self.metrics(), headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def _openapi(self, request: Request) -> Response:
        refused = self._read_refused(request, all_types=False)
        return refused or Response(self._openapi_json, media_type="application/json")

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
            http=CorkedH11Protocol,  # h11, each turn's writes sent as one (fastpaths/http_cork.py)
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
        self._tasks.start_soon(self._server.serve(sockets=[sock]), name="electric-http")
        log.info("electric http listening on %s", self.address)

    def drain(self) -> None:
        """Stop accepting; in-flight requests go on, within the grace (``stop`` awaits them)."""
        if self._server is not None:
            self._server.should_exit = True

    async def stop(self) -> None:
        """Stop accepting; in-flight requests finish within the grace. Safe to repeat."""
        self.drain()
        await self._tasks.wait()  # uvicorn's own shutdown: its grace, then it ends what is left
        await self._tasks.aclose()


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


class _Cors(CORSMiddleware):
    """Starlette's CORS, answering a refused preflight with the door's error body."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        refused = bytes(response.body).decode()  # "Disallowed CORS origin, headers"
        error = invalid_argument("CORS_REFUSED", f"{refused} (the server's --cors-origin allowlist)")
        return _error_response(error, {k: v for k, v in response.headers.items() if k.startswith("vary")})


def _by_method(endpoints: dict[str, Endpoint]) -> Endpoint:
    """One endpoint for a path's methods (Starlette answers 405 for the others)."""
    if len(endpoints) == 1:
        return next(iter(endpoints.values()))

    async def dispatch(request: Request) -> Response:
        return await endpoints["GET" if request.method == "HEAD" else request.method](request)

    return dispatch
