"""The MCP face on the HTTP door: ``/mcp``, streamable HTTP, with ``--mcp`` (docs/mcp.md).

The face itself is ``electric_sdk.mcp_face`` (the tools, the send that waits, cancel and drop),
served by the official SDK's streamable HTTP session manager. Its backend here is the door:
each tool call is a request to the door's own route endpoint (``http/routes.py``), made in
process with the MCP request's ``Authorization`` header, so the route's admission (bearer
token, scope, types), validation, wait and error reason are the door's own, and a tool answers
what the route answers. A send's wait follows the service's ``WatchEvents`` (the ``read`` scope,
as ``wait=run`` needs).

A connection to ``/mcp`` without a token the door knows is refused 401 before the SDK sees it;
each tool call then needs its route's scope. The SIGINT of a cancelled send is recorded with the
token's principal as sender.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import urllib.parse
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, cast

import anyio
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.events import event_value_json
from electric_sdk.mcp_face import Refusal, build_server

from ..core.auth import ANONYMOUS, Principal, TokenTable, current_principal, denial, principal_of, refusal_of
from ..core.errors import ApiError, DoorContext
from ..core.service import EntityService
from ..lifetime import TaskGroup
from .admission import Endpoint, error_response

__all__ = ["McpDoor", "with_mcp"]

PATH = "/mcp"
# The Authorization header of the MCP request a tool call came in, for the route it calls.
_AUTHORIZATION: contextvars.ContextVar[bytes | None] = contextvars.ContextVar(
    "electric_mcp_auth", default=None
)


class DoorBackend:
    """The face's backend: the door's route endpoints, called in process."""

    def __init__(self, endpoints: Mapping[str, Endpoint], service: EntityService, tokens: TokenTable | None):
        self.endpoints = endpoints
        self.service = service
        self.tokens = tokens

    async def _route(
        self,
        operation: str,
        method: str,
        path: str,
        params: Mapping[str, str],
        query: list[tuple[str, str]] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        raw = b"" if body is None else json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
        if (authorization := _AUTHORIZATION.get()) is not None:
            headers.append((b"authorization", authorization))
        scope = {
            "type": "http",
            "method": method,
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "scheme": "http",
            "query_string": urllib.parse.urlencode(query or []).encode(),
            "headers": headers,
            "client": ("mcp", 0),
            "server": ("mcp", 0),
            "path_params": dict(params),
            "http_version": "1.1",
        }
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await anyio.sleep_forever()
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}

        response = await self.endpoints[operation](Request(scope, cast(Receive, receive)))
        answer: dict[str, Any] = json.loads(bytes(response.body))
        if response.status_code >= 400:
            error = answer.get("error", {})
            raise Refusal(str(error.get("code", "INTERNAL")), str(error.get("message", "")))
        return answer

    @staticmethod
    def _one(ref: str) -> tuple[str, dict[str, str]]:
        type_, _, id_ = ref.partition("/")
        return f"/{type_}/{id_}", {"type": type_, "id": id_}

    async def list(self, args: Mapping[str, Any]) -> dict[str, Any]:
        query = [(k, str(v)) for k, v in args.items() if k != "state"]
        query += [("state", str(s)) for s in args.get("state") or []]
        return await self._route("listEntities", "GET", "/entities", {}, query)

    async def get(self, ref: str) -> dict[str, Any]:
        return await self._route("getEntity", "GET", *self._one(ref))

    async def spawn(self, ref: str, args: Mapping[str, Any]) -> dict[str, Any]:
        return await self._route("spawnEntity", "PUT", *self._one(ref), body=args)

    def _may_read(self) -> None:
        if self.tokens is not None and (refused := denial(current_principal.get(), "read")):
            raise Refusal(refused.reason, refused.message)

    async def send(self, ref: str, text: str, data: Any) -> dict[str, Any]:
        self._may_read()  # the send waits by reading the stream, as wait=run: refused, nothing is sent
        body: dict[str, Any] = {"text": text} if text else {}
        if data is not None:
            body["data"] = data
        return await self._route("sendMessage", "POST", *self._one(ref), body=body)

    async def follow(self, ref: str, offset: int) -> AsyncIterator[tuple[str, str, dict[str, Any], int]]:
        self._may_read()
        type_, _, id_ = ref.partition("/")
        watch = api.WatchEventsRequest(
            ref=pb.EntityRef(type=type_, id=id_), from_offset=offset, accepts_batches=True
        )
        stream = self.service.WatchEvents(watch, cast(Any, DoorContext("mcp")))
        try:
            async for item in stream:
                m = api.WatchEventsResponse.FromString(item) if isinstance(item, bytes) else item
                kind = m.WhichOneof("item")
                if kind == "end_of_stream":
                    return
                events: list[pb.Event] = list(m.events.events) if kind == "events" else [m.event]
                for event in events:
                    yield event.type, event.key, event_value_json(event), event.offset
        except ApiError as exc:
            raise Refusal(exc.reason, exc.message) from None
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    async def signal(self, ref: str, args: Mapping[str, Any]) -> dict[str, Any]:
        query = [(k, str(args[k])) for k in ("wait", "timeout") if k in args]
        body = {k: v for k, v in args.items() if k not in {"wait", "timeout"}}
        path, params = self._one(ref)
        return await self._route("signalEntity", "POST", f"{path}/signal", params, query, body)

    async def events(self, ref: str, offset: int, limit: int) -> dict[str, Any]:
        path, params = self._one(ref)
        query = [("offset", str(offset)), ("limit", str(limit))]
        return await self._route("readEvents", "GET", f"{path}/events", params, query)


def with_mcp(app: ASGIApp, mcp: McpDoor) -> ASGIApp:
    """``app``, with ``/mcp`` (exactly) served by ``mcp``: ahead of the routes, so the route
    table's fast path is untouched."""

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == PATH:
            await mcp(scope, receive, send)
        else:
            await app(scope, receive, send)

    return route


class McpDoor:
    """``/mcp``: the SDK's streamable HTTP session manager serving the face, held open by a task
    of the door's group while the door serves."""

    def __init__(self, endpoints: Mapping[str, Endpoint], service: EntityService, tokens: TokenTable | None):
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        self.tokens = tokens
        self.draining = False
        backend = DoorBackend(endpoints, service, tokens)
        server = build_server(backend, http=True, bind=self._bind, draining=lambda: self.draining)
        self.manager = StreamableHTTPSessionManager(app=server)
        self._closing = anyio.Event()
        self._running = anyio.Event()

    def _principal(self, authorization: list[str]) -> Principal:
        """Who calls: any token the door knows (each tool call then needs its route's scope)."""
        if self.tokens is None:
            return ANONYMOUS
        found = principal_of(self.tokens, authorization)
        if isinstance(found, Principal):
            return found
        refused = refusal_of(found, "read")  # no token, an unknown one, or two: never None here
        assert refused is not None
        raise refused

    @contextlib.contextmanager
    def _bind(self, ctx: Any) -> Iterator[None]:
        """Around each tool call: the principal and the token of the request it came in."""
        request = getattr(ctx, "request", None)
        values = request.headers.getlist("authorization") if isinstance(request, Request) else []
        try:
            principal = self._principal(values)
        except ApiError as exc:
            raise Refusal(exc.reason, exc.message) from None
        auth = _AUTHORIZATION.set(values[0].encode() if values else None)
        who = current_principal.set(principal)
        try:
            yield
        finally:
            current_principal.reset(who)
            _AUTHORIZATION.reset(auth)

    async def serve(self, tasks: TaskGroup) -> None:
        async def hold() -> None:
            async with self.manager.run():
                self._running.set()
                await self._closing.wait()

        tasks.start_soon(hold(), name="electric-mcp")
        await self._running.wait()

    def drain(self) -> None:
        """From now on a call cut is the server's doing: detached, never a cancel (2026-07-28
        HTTP takes a closed stream for the client's cancel)."""
        self.draining = True

    def close(self) -> None:
        self.drain()
        self._closing.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app of ``/mcp``: a request without a known token is refused here."""
        if self.tokens is not None:
            request = Request(scope)
            try:
                self._principal(request.headers.getlist("authorization"))
            except ApiError as exc:
                await error_response(exc)(scope, receive, send)
                return
        await self.manager.handle_request(scope, receive, send)
