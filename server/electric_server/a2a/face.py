"""The A2A face in front of the HTTP door (``--a2a``, docs/a2a.md): an ASGI app that takes the
A2A paths and hands every other request to the door unchanged.

| path | what |
|---|---|
| ``/.well-known/agent-card.json`` | the root agent's card: each entity type a skill |
| ``/_electric/a2a`` | the root agent (contexts ``TYPE/ID``), JSON-RPC and HTTP+JSON |
| ``/_electric/a2a/types/{type}`` | the type's agent (contexts: entity ids), both bindings |
| ``…/.well-known/agent-card.json`` under either | that agent's card |

The bindings are the SDK's own routes (``create_jsonrpc_routes``, ``create_rest_routes``) over
``handler.EntityAgents``, and its gRPC servicer (``GrpcHandler``) over the same, served on the
gRPC door's port beside electric's services (``serve_grpc``): there a request's ``tenant`` names
the type's agent ("" the root's), as each card's gRPC interface says. The gRPC door's
interceptor applies the tokens to it (core/auth.py's ``A2A_METHOD_SCOPES``). The door's bearer tokens apply before the SDK reads anything: a card
needs a known token; an operation needs its scope (``SCOPES``: JSON-RPC's method is read from
the body, HTTP+JSON's from the path) and, for a token limited to types, the agent of one of
them. A refusal is the door's error body and status (401, 403), as on every other route.
"""

from __future__ import annotations

import json

import grpc
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import GrpcHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import DefaultServerCallContextBuilder, create_jsonrpc_routes, create_rest_routes
from a2a.types import a2a_pb2 as a2a
from a2a.types import a2a_pb2_grpc
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, PROTOCOL_VERSION_CURRENT
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from electric_sdk.version import __version__

from ..core.auth import ANONYMOUS, Principal, TokenTable, current_principal, denial, principal_of
from ..core.errors import ApiError, invalid_argument
from ..core.service import EntityService
from ..core.validation import NAME_RE
from ..http import body
from ..http.admission import error_response
from .handler import AGENT_TYPE, EntityAgents

__all__ = ["A2AFace"]

PREFIX = "/_electric/a2a"
TYPES = f"{PREFIX}/types/"
# The scope each operation needs (auth.py's scopes): JSON-RPC's method names, HTTP+JSON's
# (method, path ending). CancelTask also reads the stream, to answer once the run unwound.
SCOPES: dict[str, tuple[str, ...]] = {
    "SendMessage": ("send",),
    "SendStreamingMessage": ("send",),
    "CancelTask": ("signal", "read"),
}
_READ = ("read",)
_WILDCARDS = ("", "0.0.0.0", "::")


def _rest_scopes(method: str, sub: str) -> tuple[str, ...]:
    if method == "POST" and sub.endswith(("/message:send", "/message:stream")):
        return SCOPES["SendMessage"]
    if method == "POST" and sub.endswith(":cancel"):
        return SCOPES["CancelTask"]
    return _READ


class _Calls(DefaultServerCallContextBuilder):
    """The SDK's call context, with the agent's type (``AGENT_TYPE``) the face found."""

    def build(self, request: Request) -> ServerCallContext:
        call = super().build(request)
        call.state[AGENT_TYPE] = request.scope.get(AGENT_TYPE, "")
        # The SDK reads A2A-Version from these; the bearer token stays out of what it may log.
        call.state["headers"].pop("authorization", None)
        return call


class A2AFace:
    """An ASGI app: the A2A paths served here, every other request by ``door``."""

    def __init__(
        self, door: ASGIApp, service: EntityService, tokens: TokenTable | None, grpc_host: str, grpc_port: int
    ) -> None:
        self.door = door
        self.service = service
        self.tokens = tokens
        # Where the gRPC binding is served (a card names it; a wildcard host: the card's request's).
        self.grpc_host, self.grpc_port = grpc_host, grpc_port
        self.handler = handler = EntityAgents(service)
        calls = _Calls()
        # JSON-RPC at the agent's URL itself; HTTP+JSON's paths (/message:send, /tasks/…) under it.
        routes: list[BaseRoute] = [*create_jsonrpc_routes(handler, "/", context_builder=calls)]
        routes += create_rest_routes(handler, context_builder=calls)
        self.sdk = Starlette(routes=routes)

    def serve_grpc(self, server: grpc.aio.Server) -> str:
        """Add A2A's gRPC binding to the gRPC door's ``server``; its service's name (reflection
        lists it, so grpcurl and buf curl find it)."""
        a2a_pb2_grpc.add_A2AServiceServicer_to_server(GrpcHandler(self.handler), server)  # type: ignore[no-untyped-call]
        return str(a2a.DESCRIPTOR.services_by_name["A2AService"].full_name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"] if scope["type"] == "http" else ""
        if path == AGENT_CARD_WELL_KNOWN_PATH:
            if scope["method"] not in ("GET", "HEAD"):
                error = ApiError(
                    grpc.StatusCode.UNIMPLEMENTED, "METHOD_NOT_ALLOWED", f"{scope['method']} {path}"
                )
                return await error_response(error, {"Allow": "GET, HEAD"})(scope, receive, send)
            return await self._served(scope, receive, send, "", PREFIX, AGENT_CARD_WELL_KNOWN_PATH)
        if path.startswith(TYPES):
            type_, _, rest = path[len(TYPES) :].partition("/")
            if NAME_RE.fullmatch(type_):
                rest = f"/{rest}" if rest or path.endswith("/") else ""
                return await self._served(scope, receive, send, type_, TYPES + type_, rest)
        elif path == PREFIX or path.startswith(PREFIX + "/"):
            return await self._served(scope, receive, send, "", PREFIX, path[len(PREFIX) :])
        await self.door(scope, receive, send)

    async def _served(
        self, scope: Scope, receive: Receive, send: Send, type_: str, base: str, sub: str
    ) -> None:
        """An A2A request for the agent of ``type_`` ("" the root's) at ``base``; ``sub`` the
        path under it."""
        request = Request(scope, receive)
        card = sub == AGENT_CARD_WELL_KNOWN_PATH
        try:
            principal = self._caller(request)
            replay: bytes | None = None
            if not card:
                if sub in ("", "/") and scope["method"] == "POST":
                    replay = await body.read_limited(receive, request.headers.get("content-length"))
                    needs = _jsonrpc_scopes(replay)
                else:
                    needs = _rest_scopes(scope["method"], sub)
                self._admit(principal, needs, type_)
        except ApiError as error:
            return await error_response(error)(scope, receive, send)
        except ClientDisconnect:
            return  # gone before its body arrived: nothing to answer, nothing done
        if card:
            root = str(request.base_url).rstrip("/")
            content = agent_card_to_dict(
                await self._card(type_, root + base, self._grpc_url(request), principal)
            )
            return await JSONResponse(content)(scope, receive, send)
        inner = dict(scope, root_path=scope.get("root_path", "") + base, path=base + (sub or "/"))
        inner[AGENT_TYPE] = type_
        token = current_principal.set(principal)  # the sender of what the operation writes
        try:
            await self.sdk(inner, _replayed(replay, receive) if replay is not None else receive, send)
        finally:
            current_principal.reset(token)

    def _caller(self, request: Request) -> Principal:
        if self.tokens is None:
            return ANONYMOUS
        found = principal_of(self.tokens, request.headers.getlist("authorization"))
        if isinstance(found, ApiError):
            raise found
        if found is None:
            refused = denial(None, "read")
            assert refused is not None
            raise refused
        return found

    def _admit(self, principal: Principal, needs: tuple[str, ...], type_: str) -> None:
        if self.tokens is None:
            return
        for scope in needs:
            if (refused := denial(principal, scope)) is not None:
                raise refused
        if principal.types is not None and type_ not in principal.types:
            raise ApiError(
                grpc.StatusCode.PERMISSION_DENIED,
                "TYPE_NOT_ALLOWED",
                f"principal {principal.name!r} may only use the agents of entity types "
                f"{sorted(principal.types)} ({TYPES}TYPE)",
                {"types": type_ or "*"},
            )

    def _grpc_url(self, request: Request) -> str:
        host = self.grpc_host
        if host in _WILDCARDS:  # bound to every address: the one the card was asked at
            host = request.url.hostname or "localhost"
        return f"[{host}]:{self.grpc_port}" if ":" in host else f"{host}:{self.grpc_port}"

    async def _card(self, type_: str, url: str, grpc_url: str, principal: Principal) -> a2a.AgentCard:
        """The card of ``type_``'s agent (the root's: each type a skill) served at ``url``, and by
        gRPC at ``grpc_url`` with the type as its tenant."""
        interfaces = [
            a2a.AgentInterface(url=url, protocol_binding=binding, protocol_version=PROTOCOL_VERSION_CURRENT)
            for binding in ("JSONRPC", "HTTP+JSON")
        ]
        interfaces.append(
            a2a.AgentInterface(
                url=grpc_url, protocol_binding="GRPC", tenant=type_, protocol_version=PROTOCOL_VERSION_CURRENT
            )
        )
        card = a2a.AgentCard(
            name=f"electric: {type_}" if type_ else "electric",
            description=(
                f"Entities of type {type_!r}: each context an entity (its id), each task the run "
                "of one message. Not served: push notifications (SubscribeToTask instead)."
                if type_
                else "Every entity type, each a skill with its own agent at "
                f"{url}/types/TYPE; here a context is TYPE/ID. Not served: push notifications."
            ),
            supported_interfaces=interfaces,
            version=__version__,
            capabilities=a2a.AgentCapabilities(streaming=True, push_notifications=False),
            default_input_modes=["text/plain", "application/json"],
            default_output_modes=["text/plain"],
        )
        if self.tokens is not None:
            card.security_schemes["bearer"].http_auth_security_scheme.scheme = "Bearer"
            card.security_requirements.add().schemes["bearer"].SetInParent()
        for name in [type_] if type_ else await self._types(principal):
            card.skills.add(
                id=name,
                name=name,
                description=f"a message to an entity of type {name!r}; its agent: {url}/types/{name}"
                if not type_
                else f"a message to an entity of type {name!r}",
                tags=["electric", "entity"],
            )
        return card

    async def _types(self, principal: Principal) -> list[str]:
        """The entity types workers have announced (and the caller's token may use)."""
        names = sorted({profile.type for profile in await self.service.store.type_profiles()})
        return [n for n in names if principal.types is None or n in principal.types]


def _jsonrpc_scopes(raw: bytes) -> tuple[str, ...]:
    """The scopes a JSON-RPC body's calls need (a batch: each call's). An undecodable body
    needs none here: the SDK answers it with its parse error, having done nothing."""
    try:
        parsed = json.loads(raw)
    except ValueError:
        return ()
    calls = parsed if isinstance(parsed, list) else [parsed]
    needs: list[str] = []
    for call in calls:
        method = call.get("method") if isinstance(call, dict) else None
        needs += SCOPES.get(method, _READ) if isinstance(method, str) else []
    if not isinstance(parsed, (list, dict)):
        raise invalid_argument("MALFORMED_REQUEST", "a JSON-RPC request is an object or a batch of them")
    return tuple(dict.fromkeys(needs))


def _replayed(raw: bytes, receive: Receive) -> Receive:
    """``receive`` with the body already read given back first."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return replay
