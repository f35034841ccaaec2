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
``/_electric/…``) are matched first. Each route is served by its service call
or its handler (``http/handlers.py``); the live reads (the Durable Streams read,
SSE: ``http/streams.py``) only when the door is given the streams. Admission
and the error body are ``http/admission.py``'s.

Two fast paths (``fastpaths/``), each with its switch read once when the door is
built: the route table in front of Starlette's router (forced off: Starlette's
router routes every request), and uvicorn serving it with h11 and each turn's
writes sent as one (forced off: uvicorn's own h11 protocol). uvicorn runs as a
task of the door's own group (lifetime.py), on the server's loop; lifespan off,
no signal handlers of its own (the server's drain owns SIGINT and SIGTERM), its
logging left to propagate to ours.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import grpc
import uvicorn
from google.protobuf.message import Message
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp

from ..config_error import ConfigError
from ..core.auth import TokenTable
from ..core.errors import ApiError, DoorContext, invalid_argument
from ..core.service import EntityService
from ..fastpaths.http_cork import h11_protocol
from ..fastpaths.route_table import routing
from ..lifetime import Component, TaskGroup
from .admission import (
    Endpoint,
    JSONResponse,
    ThrottledInvalidRequests,
    admitted_endpoint,
    error_response,
    quiet_on_broken_framing,
)
from .handlers import DoorParts, Metrics, Readiness
from .openapi import render as render_openapi
from .routes import PREFIX, ROUTES, HttpRoute, served_paths
from .streams import EntityStreams

if TYPE_CHECKING:
    from .mcp_door import McpDoor

log = logging.getLogger("electric.http")
# uvicorn's line for each request that breaks HTTP/1.1, throttled (any client can send them).
_INVALID_REQUESTS = ThrottledInvalidRequests()

# CORS, with --cors-origin (off without): what a page's fetch may send, and may read back.
CORS_ALLOW_HEADERS = [
    "Authorization",
    "Content-Type",
    "Idempotency-Key",
    "If-None-Match",
    "Last-Event-ID",
    "Stream-Forked-From",
    "Stream-Fork-Offset",
    "A2A-Version",  # the A2A face's (--a2a)
    "X-A2A-Extensions",
]
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
        streams: EntityStreams | None = None,
        cors_origins: tuple[str, ...] = (),
        mcp: bool = False,
        faces: Sequence[Callable[[ASGIApp], ASGIApp]] = (),
    ) -> None:
        self.service = service
        self.tokens = tokens
        self.readiness = readiness
        # What the routes' handlers make their endpoints of (http/handlers.py).
        self.parts = DoorParts(service, tokens, readiness, render_openapi().encode(), metrics, streams)
        self.listen = listen
        self.grace_s = grace_s
        self.tls = tls
        self.port = 0
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
        self.routes = starlette_routes(self._endpoint)
        starlette = Starlette(routes=self.routes, exception_handlers={HTTPException: route_error})
        # The fast paths' switches, read once here (fastpaths/): the route table in front of
        # Starlette, and uvicorn's h11 protocol with each turn's writes sent as one.
        router = self.router = routing(self.routes, starlette)
        self.protocol = h11_protocol()
        # With --mcp: /mcp, the MCP face (http/mcp_door.py), whose tool calls are the routes'.
        self.mcp: McpDoor | None = None
        if mcp:
            from .mcp_door import McpDoor, with_mcp

            endpoints = {r.operation: e for r in ROUTES if r.call is not None and (e := self._endpoint(r))}
            self.mcp = McpDoor(endpoints, service, tokens)
            router = with_mcp(router, self.mcp)
        for face in faces:  # another protocol's paths in front of the routes (the A2A face)
            router = face(router)
        # CORS outermost, so the table's answers and Starlette's get its headers alike.
        app: ASGIApp = _Cors(router, **cors) if cors_origins else router
        # Outermost: a request uvicorn has answered itself (broken framing) gets nothing more.
        self.app = quiet_on_broken_framing(app)

    # -- routes ------------------------------------------------------------------------------------

    def _endpoint(self, route: HttpRoute) -> Endpoint | None:
        """The route's endpoint on this door: its handler's, or its service call's; None when
        its handler makes none here."""
        if route.call is None:
            assert route.handler is not None
            return route.handler(self.parts)
        assert route.scope is not None  # every service call needs a scope
        method, render, status = route.call.method, route.call.render, route.status
        call = route.call.rpc
        service = self.service
        headers = dict(route.headers) or None
        # A parameter that hands the request to another handler's endpoint (live=sse).
        handing_over = {
            param.name: handed
            for param in route.query
            if param.handler is not None and (handed := param.handler(self.parts)) is not None
        }

        async def respond(request: Request, message: Message, context: DoorContext) -> Response:
            response = await call(service, message, cast(Any, context))
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
            http=self.protocol,  # h11, each turn's writes sent as one (fastpaths/http_cork.py)
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
        uvicorn_log = logging.getLogger("uvicorn.error")
        if _INVALID_REQUESTS not in uvicorn_log.filters:
            uvicorn_log.addFilter(_INVALID_REQUESTS)
        self._server = _Uvicorn(config)
        if self.mcp is not None:
            await self.mcp.serve(self._tasks)
        self._tasks.start_soon(self._server.serve(sockets=[sock]), name="electric-http")
        log.info("electric http listening on %s", self.address)

    def drain(self) -> None:
        """Stop accepting; in-flight requests go on, within the grace (``stop`` awaits them)."""
        if self.mcp is not None:
            self.mcp.drain()
        if self._server is not None:
            self._server.should_exit = True

    async def stop(self) -> None:
        """Stop accepting; in-flight requests finish within the grace. Safe to repeat."""
        self.drain()
        if self.mcp is not None:
            self.mcp.close()  # its sessions end with it: a send waiting in one is detached
        await self._tasks.wait()  # uvicorn's own shutdown: its grace, then it ends what is left
        await self._tasks.aclose()


def starlette_routes(endpoint: Callable[[HttpRoute], Endpoint | None]) -> list[BaseRoute]:
    """The table's routes as Starlette's, each served by ``endpoint(route)`` (left out where it
    is None), one Starlette route per path (so a 405's ``Allow`` names every method of the
    path); the fixed paths first, then every alias under ``/_electric/entities`` (nothing else
    there reaches the entity routes), a catch-all for the rest of ``/_electric``, the others."""
    by_path: dict[str, dict[str, Endpoint]] = {}
    fixed_paths = set()
    for route in ROUTES:
        found = endpoint(route)
        if found is not None:
            for path, _operation in served_paths(route):
                by_path.setdefault(path, {})[route.method] = found
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


async def route_error(request: Request, exc: Exception) -> Response:
    """No route for the path (404) or the method (405): the same error body as any other."""
    assert isinstance(exc, HTTPException)
    reason = ROUTE_REASONS.get(exc.status_code, "MALFORMED_REQUEST")
    code = (
        grpc.StatusCode.INVALID_ARGUMENT if reason == "MALFORMED_REQUEST" else grpc.StatusCode.UNIMPLEMENTED
    )
    error = ApiError(code, reason, f"{request.method} {request.url.path}: {exc.detail}")
    return error_response(error, dict(exc.headers or {}))


class _Cors(CORSMiddleware):
    """Starlette's CORS, answering a refused preflight with the door's error body."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        refused = bytes(response.body).decode()  # "Disallowed CORS origin, headers"
        error = invalid_argument("CORS_REFUSED", f"{refused} (the server's --cors-origin allowlist)")
        return error_response(error, {k: v for k, v in response.headers.items() if k.startswith("vary")})


def _by_method(endpoints: dict[str, Endpoint]) -> Endpoint:
    """One endpoint for a path's methods (Starlette answers 405 for the others)."""
    if len(endpoints) == 1:
        return next(iter(endpoints.values()))

    async def dispatch(request: Request) -> Response:
        return await endpoints["GET" if request.method == "HEAD" else request.method](request)

    return dispatch
