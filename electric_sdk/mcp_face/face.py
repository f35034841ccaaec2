"""The MCP face (docs/mcp.md): the control plane as MCP tools, over any ``Backend``.

One implementation for both transports: ``electric mcp`` serves it on stdio with a backend that
is the SDK's ``AsyncClient`` (``cli/mcp_cmd.py``), and the HTTP door serves it on streamable
HTTP at ``/mcp`` with one that calls the service itself (``electric_server/http/mcp_door.py``).
The tools and their input schemas are ``tools.json``, generated from the door's route table.

A ``send`` waits for the run its message starts, folding the stream as every door does
(``_wire.run_outcome.RunFollow``), and reports each of the run's records and ``progress``
events as an MCP progress notification. When the call is cut, the face tells a cancel from a
dropped connection by the transport's rule:

- stdio and handshake-era streamable HTTP: a cancel is ``notifications/cancelled`` naming the
  request (the SDK sets the request's ``cancel_requested`` before it cancels the handler);
  anything else that cuts the handler (stdin closed, the process ending, an HTTP response
  stream closed) is a drop;
- 2026-07-28 streamable HTTP (one POST per request, no session): closing the request's
  response stream *is* that revision's cancel, so every cut is a cancel there.

A cancel is a SIGINT scoped to the message (``message_key``), recorded with the caller as
sender and a reason naming the MCP client and request; a drop leaves the run going.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from importlib import resources
from typing import Any, Protocol

import anyio

from .._wire.run_outcome import RunFollow
from ..durations import parse_ms

__all__ = ["Backend", "Refusal", "build_server", "tool_list"]

log = logging.getLogger("electric.mcp")

# How long the SIGINT of a cancelled send may take: the call is over, this only bounds the cleanup.
CANCEL_BOUND_S = 10.0
# The 2026-07-28 revision, where a closed response stream is the cancel (mcp_types.version).
MODERN_VERSIONS = frozenset({"2026-07-28"})


class Refusal(Exception):
    """A refused call: the error reason (as the doors name it) and the message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Backend(Protocol):
    """What the face calls: each answer is the RFC's JSON, as the HTTP door renders it; each
    refusal a ``Refusal``."""

    async def list(self, args: Mapping[str, Any]) -> dict[str, Any]: ...
    async def get(self, ref: str) -> dict[str, Any]: ...
    async def spawn(self, ref: str, args: Mapping[str, Any]) -> dict[str, Any]: ...

    async def send(self, ref: str, text: str, data: Any) -> dict[str, Any]:
        """The message's receipt: at least ``key``, ``offset`` and ``state``."""
        ...

    def follow(self, ref: str, offset: int) -> AsyncIterator[tuple[str, str, dict[str, Any], int]]:
        """The stream from ``offset`` on, live: (type, key, RFC value, offset) of each event."""
        ...

    async def signal(self, ref: str, args: Mapping[str, Any]) -> dict[str, Any]: ...
    async def events(self, ref: str, offset: int, limit: int) -> dict[str, Any]: ...


def tool_list() -> list[dict[str, Any]]:
    """The tools (name, description, inputSchema), as generated from the door's route table."""
    text = resources.files(__package__).joinpath("tools.json").read_text(encoding="utf-8")
    tools: list[dict[str, Any]] = json.loads(text)
    return tools


def _allowed(schema: Mapping[str, Any]) -> set[str]:
    branches = schema.get("oneOf", [schema])
    return {name for branch in branches for name in branch.get("properties", {})}


def _ref(args: Mapping[str, Any]) -> str:
    ref = args.get("ref")
    if not isinstance(ref, str) or "/" not in ref:
        raise Refusal("INVALID_NAME", f"ref: expected TYPE/ID, got {ref!r}")
    return ref.strip("/")


def _whole(args: Mapping[str, Any], name: str) -> int:
    value = args.get(name, 0)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Refusal("INVALID_FIELD", f"{name}: expected a whole number, got {value!r}")
    return value


def _timeout_s(args: Mapping[str, Any]) -> float | None:
    text = args.get("timeout")
    if text is None:
        return None
    try:
        return parse_ms(str(text)) / 1000
    except ValueError as exc:
        raise Refusal("INVALID_DURATION", f"timeout: {exc}") from None


def _cancelled_by_client(ctx: Any, http: bool) -> bool:
    """Whether the client cancelled this request by its transport's rule (module docstring)."""
    if http and getattr(ctx, "protocol_version", "") in MODERN_VERSIONS:
        return True
    # The request's dispatch context, which the SDK's ServerSession holds: the only place that
    # says a notifications/cancelled named this request (it is set before the handler is cut).
    outbound = getattr(ctx.session, "_request_outbound", None)
    requested = getattr(outbound, "cancel_requested", None)
    return bool(requested is not None and requested.is_set())


def _client_name(ctx: Any) -> str:
    connection = getattr(ctx.session, "_connection", None)
    params = getattr(connection, "client_params", None)
    info = getattr(params, "client_info", None)
    if info is None:
        return "an MCP client"
    return f"MCP client {info.name} {info.version}".strip()


class Face:
    """The tools' calls over one backend."""

    def __init__(self, backend: Backend, http: bool, draining: Callable[[], bool] | None = None) -> None:
        self.backend = backend
        self.http = http
        self.draining = draining or (lambda: False)
        self.tools = tool_list()
        self.allowed = {t["name"]: _allowed(t["inputSchema"]) for t in self.tools}

    async def call(self, ctx: Any, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
        allowed = self.allowed[name]  # an unknown tool is the protocol's error (build_server)
        unknown = sorted(set(args) - allowed)
        if unknown:  # refused before anything is sent, as the door refuses an unknown field
            raise Refusal("UNKNOWN_FIELD", f"{name}: unknown argument {unknown[0]!r}")
        if name == "send":
            return await self.send(ctx, _ref(args), {k: v for k, v in args.items() if k != "ref"})
        with _shape_checked(name):
            return await self._call(name, args)

    async def _call(self, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
        b = self.backend
        if name == "list":
            return await b.list(args)
        ref = _ref(args)
        rest = {k: v for k, v in args.items() if k != "ref"}
        if name == "get":
            return await b.get(ref)
        if name == "spawn":
            return await b.spawn(ref, rest)
        if name == "signal":
            return await b.signal(ref, rest)
        return await b.events(ref, _whole(args, "offset"), _whole(args, "limit"))

    async def send(self, ctx: Any, ref: str, args: Mapping[str, Any]) -> dict[str, Any]:
        timeout_s = _timeout_s(args)  # checked before anything is sent
        text = args.get("text", "")
        if not isinstance(text, str):
            raise Refusal("INVALID_FIELD", f"text: expected a string, got {text!r}")
        # Shielded: a cancel that comes while the message is being sent waits for its key, and then
        # interrupts it (at the wait's first checkpoint) like any other.
        with anyio.CancelScope(shield=True), _shape_checked("send"):
            receipt = await self.backend.send(ref, text, args.get("data"))
        key = receipt["key"]
        run = RunFollow(key, entity_state=receipt.get("state"))
        seen = 0
        try:
            with anyio.move_on_after(timeout_s):
                async for kind, event_key, value, offset in self.backend.follow(ref, receipt["offset"]):
                    ours = run.see(kind, event_key, value, offset)
                    if run.ended:
                        break
                    # Its run's records, and the progress its entity reports while it runs.
                    if (ours and kind == "run") or (kind == "progress" and run.started):
                        seen += 1
                        # A stream gone (an HTTP client that dropped) stops the progress, not the wait.
                        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                            await ctx.session.report_progress(seen, None, _progress_text(kind, value))
                else:
                    run.stream_closed()
        except anyio.get_cancelled_exc_class():
            # A server draining cuts its calls too: that is no client's cancel.
            if not self.draining() and _cancelled_by_client(ctx, self.http):
                with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_BOUND_S):
                    await self._interrupt(ctx, ref, key)
            else:
                log.info("MCP send of %s on %s detached: the connection dropped; its run goes on", key, ref)
            raise
        return receipt | {"run": run.to_json()}

    async def _interrupt(self, ctx: Any, ref: str, key: str) -> None:
        reason = f"{_client_name(ctx)} cancelled its send (MCP request {ctx.request_id})"
        try:
            await self.backend.signal(ref, {"signal": "SIGINT", "message_key": key, "reason": reason})
        except Refusal as exc:  # the run ended meanwhile: nothing to interrupt
            log.info("MCP cancel of %s on %s: %s: %s", key, ref, exc.code, exc.message)


@contextlib.contextmanager
def _shape_checked(name: str) -> Iterator[None]:
    """An argument of the wrong shape that a backend trips over before sending anything (a
    profile that is not an object) is the door's INVALID_FIELD."""
    try:
        yield
    except (TypeError, ValueError, AttributeError) as exc:
        raise Refusal("INVALID_FIELD", f"{name}: {exc}") from None


def _progress_text(kind: str, value: Mapping[str, Any]) -> str:
    if kind == "progress":
        data = value.get("data", value)
        message = data["message"] if isinstance(data, dict) and data.get("message") else data
        return str(message if isinstance(message, str) else json.dumps(message, default=str))[:200]
    status = value.get("status", "")
    step = value.get("step")
    return f"run {status}" + (f" (step {step})" if step is not None else "")


def build_server(
    backend: Backend,
    *,
    http: bool,
    bind: Callable[[Any], AbstractContextManager[None]] | None = None,
    draining: Callable[[], bool] | None = None,
    name: str = "electric",
) -> Any:
    """The official SDK's low-level MCP server, serving the tools over ``backend``; ``http``:
    served on streamable HTTP (whose newest revision cancels by closing the stream). ``bind``:
    entered around each tool call with the SDK's request context (the door's: who calls).
    ``draining``: true once the server drains, whose cut calls are detached, never cancelled."""
    import mcp_types as types
    from mcp.server.lowlevel import Server

    from ..version import __version__

    face = Face(backend, http, draining)
    listed = [types.Tool.model_validate(t) for t in face.tools]

    async def list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: Any) -> Any:
        if params.name not in face.allowed:  # MCP: "errors in finding the tool" are protocol errors
            from mcp.shared.exceptions import MCPError
            from mcp_types.jsonrpc import INVALID_PARAMS

            tools = ", ".join(face.allowed)
            raise MCPError(INVALID_PARAMS, f"no tool {params.name!r}; the tools: {tools}")
        try:
            with bind(ctx) if bind is not None else contextlib.nullcontext():
                answer = await face.call(ctx, params.name, params.arguments or {})
        except Refusal as exc:
            error = {"error": {"code": exc.code, "message": exc.message}}
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=f"{exc.code}: {exc.message}")],
                structured_content=error,
                is_error=True,
            )
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(answer))], structured_content=answer
        )

    return Server(name, version=__version__, on_list_tools=list_tools, on_call_tool=call_tool)
