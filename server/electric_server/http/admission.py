"""How every route of the HTTP door admits a request, and how it answers a refusal.

``admitted_endpoint`` admits a request as every route does (the token and its
scope, the query's names, the body, the type limits; a refusal logged as gRPC's
are) and answers an error with the door's error body,
``{"error": {"code", "message", "details"}}``, with the HTTP status of
``errors.HTTP_STATUS``. The service's routes (``http/door.py``), an entity's
state (``http/handlers.py``) and the live reads (``http/streams.py``) are all
made with it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import h11
from google.protobuf.message import Message
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse as _StarletteJSON
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as AsgiMessage

from ..core.auth import (
    ANONYMOUS,
    Principal,
    TokenTable,
    current_principal,
    principal_of,
    refusal_of,
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
from ..core.validation import IDEMPOTENCY_KEY_RE
from ..log_throttle import LogThrottle
from . import body
from .query import Query

log = logging.getLogger(__name__)
# Clients hanging up mid-body: at most a line a minute per method.
_HANG_UPS = LogThrottle(60.0)

__all__ = [
    "Build",
    "Endpoint",
    "JSONResponse",
    "Respond",
    "ThrottledInvalidRequests",
    "admitted_endpoint",
    "error_response",
    "quiet_on_broken_framing",
]

Endpoint = Callable[[Request], Awaitable[Response]]
# Path, query and JSON body → the gRPC request.
Build = Callable[[Request, Query, body.JsonObject], Message]
# Answers an admitted request: its gRPC message, with the caller's principal set (current_principal).
Respond = Callable[[Request, Message, DoorContext], Awaitable[Response]]

# Starlette's JSONResponse calls json.dumps with options, which builds an encoder per response.
_ENCODE = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


class JSONResponse(_StarletteJSON):
    """Starlette's JSON response, byte for byte, through one encoder made once."""

    def render(self, content: Any) -> bytes:
        return _ENCODE(content).encode("utf-8")


def error_response(error: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    """The door's error body for ``error``, with its HTTP status (a 401 asks for a bearer token)."""
    status, content = http_error(error)
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return JSONResponse(content, status, headers)


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
            found = principal_of(tokens, request.headers.getlist("authorization"))
            refused = refusal_of(found, scope)
            if refused is not None:
                raise refused
            assert isinstance(found, Principal)
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
            # Given, it must be a key: an empty or blank header (HTTP trims blanks) is a
            # client's mistake, not "no key", or its retry would write twice.
            if not IDEMPOTENCY_KEY_RE.fullmatch(key):
                raise invalid_argument(
                    "INVALID_IDEMPOTENCY_KEY",
                    f"Idempotency-Key must be 1-128 printable ASCII characters, got {key[:40]!r}",
                    field="Idempotency-Key",
                )
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
            return error_response(error, headers)
        except ClientDisconnect:
            # The caller hung up before its body was in: its own doing, not the server's. One
            # line now and then says so (no traceback); nobody is left to read an answer.
            if (left_out := _HANG_UPS.admit(method)) is not None:
                more = f" ({left_out} more since the last such line)" if left_out else ""
                log.info("a client hung up before its %s request's body was read%s", method, more)
            return Response(status_code=400)
        except Exception as exc:  # a bug: logged, answered INTERNAL
            return error_response(to_api_error(exc) or unexpected(exc, method), headers)

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


def quiet_on_broken_framing(app: ASGIApp) -> ASGIApp:
    """``app``, answering nothing (and logging a throttled line, no traceback) once uvicorn's
    h11 has given up on the connection under it.

    A request whose body breaks HTTP/1.1's framing (a malformed chunk) is answered by the
    protocol itself: 400, then the connection closes. The route may be answering it at the
    same moment (a refused token needs no body), and h11 then refuses the route's answer;
    uvicorn would log that as ``Exception in ASGI application`` with a traceback, for what is
    the client's fault. The route's answer has nowhere to go, so it is dropped here."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        broken = False

        async def guarded(message: AsgiMessage) -> None:
            nonlocal broken
            if broken:
                return
            try:
                await send(message)
            except h11.LocalProtocolError:
                broken = True
                if (left_out := _HANG_UPS.admit("framing")) is not None:
                    more = f" ({left_out} more since the last such line)" if left_out else ""
                    log.info(
                        "a client's %s %s broke HTTP/1.1 framing; answered 400 and closed%s",
                        scope.get("method", ""),
                        scope.get("path", ""),
                        more,
                    )

        await app(scope, receive, guarded)
        if broken:
            # uvicorn counts a response neither complete nor disconnected as the app's fault
            # ("returned without completing response"); it has closed the connection, so the
            # disconnect is on its way: wait for it (briefly, whatever comes).
            with anyio.move_on_after(5):
                while (await receive())["type"] != "http.disconnect":
                    pass

    return wrapped


class ThrottledInvalidRequests(logging.Filter):
    """On uvicorn's logger: its line for each request that breaks HTTP/1.1 (``Invalid HTTP
    request received.``) at most once a minute, counting those left out; any client can send
    them, so one line each would let anyone fill the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != "Invalid HTTP request received.":
            return True
        left_out = _HANG_UPS.admit("invalid-http")
        if left_out:
            record.msg = f"Invalid HTTP request received ({left_out} more since the last such line)."
        return left_out is not None
