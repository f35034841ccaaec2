"""MCP tool calls as recorded steps: ``await ctx.call_tool(server, tool, arguments, timeout=...)``.

A server is declared once per app (``app.mcp_server(name, command=[...])`` for stdio,
``url=...`` for streamable HTTP) and reached through the official ``mcp`` client. Each host
opens one session per server, lazily, in a task of its own (outside the host's task group, so a
call cut by SIGKILL can still send its cancel through it); the sessions close when the host
ends (``Lifetime.run``).

A call is the recorded step ``mcp:<server>/<tool>``: its result is the ``CallToolResult``'s
content as JSON, so a replay answers it from the record. Around the call the runtime writes
``electric.mcp`` records that the stop fold reads (``_wire/stop_stages.py``, ``downstream``)::

    {"run": message key, "call": id, "server": name, "tool": tool, "phase": started | ended |
     cancelled, "reason": ...}

(the fold also takes ``bound_passed``, for a call given up on without its end; nothing writes
it yet: a cut call's record is bounded by ``RECORD_BOUND_S`` instead.)

A signal that ends the run (SIGINT, an interrupting SIGTERM, SIGKILL, the grace deadline)
cancels the call's task: the SDK then tells the server the way its transport defines
(``notifications/cancelled`` with the request id, its reason naming the signal, e.g. ``SIGINT``;
on streamable HTTP the request's POST is aborted too), and the ``cancelled`` record names it. The run's end record waits (bounded) for these records
(``settle``), so a stop's fold sees every call's end before the run's. After a SIGKILL or the
grace deadline the entity is ended and refuses writes: its calls are cancelled all the same,
unrecorded.

MCP progress notifications become ``progress`` events, at most one per call per 100 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from .._proto.electric.v1 import runtime_service_pb2 as rt
from .._wire.json_values import json_to_value

if TYPE_CHECKING:
    from .context import Context

__all__ = ["MCP_EVENT", "PROGRESS_EVENT", "McpServer", "McpSessions", "call_tool", "settle", "why_cut"]

MCP_EVENT = "electric.mcp"
PROGRESS_EVENT = "progress"
# At most one progress event per call in this many seconds.
PROGRESS_EVERY_S = 0.1
# How long a cut call's record, and the run's end waiting for it, may take.
RECORD_BOUND_S = 2.0


@dataclass(frozen=True)
class McpServer:
    """An MCP server: ``command`` (stdio, a subprocess) or ``url`` (streamable HTTP)."""

    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    env: dict[str, str] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise ValueError(
                f"MCP server {self.name!r}: give command=[...] (stdio) or url= (HTTP), one of them"
            )
        if not self.name or "/" in self.name:
            raise ValueError(f"MCP server name {self.name!r}: non-empty, no '/'")


def _import_client() -> None:
    import mcp.client.session
    import mcp.client.stdio
    import mcp.client.streamable_http  # noqa: F401


# Why the calling task's call is being cut (set by call_tool, read when the SDK writes its cancel:
# both in the call's task).
_CUT: contextvars.ContextVar[Callable[[], str] | None] = contextvars.ContextVar(
    "electric_mcp_cut", default=None
)


class _NamingCancels:
    """The session's write stream: the SDK's ``notifications/cancelled`` for a call cut by a
    signal carries the signal as its reason instead of the SDK's "caller cancelled" (the request
    id is the SDK's own, so the cancel is renamed on its way out rather than sent twice)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def send(self, item: Any) -> None:
        why = _CUT.get()
        message: Any = getattr(item, "message", None)
        if why is not None and getattr(message, "method", None) == "notifications/cancelled":
            from mcp.shared.message import SessionMessage
            from mcp.types import JSONRPCNotification

            params = {**(message.params or {}), "reason": why()}
            renamed = JSONRPCNotification(jsonrpc="2.0", method=message.method, params=params)
            item = SessionMessage(message=renamed, metadata=item.metadata)
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _NamingCancels:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._inner.__aexit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Session:
    """One server's session, held open by a task of its own until closed."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.ready = asyncio.Event()
        self.closing = asyncio.Event()
        self.session: Any = None
        self.error: BaseException | None = None
        self.task = asyncio.get_running_loop().create_task(self._hold(), name=f"mcp {server.name}")

    async def _hold(self) -> None:
        try:
            # The SDK is imported at the first call, in a thread: a second of import on the loop
            # would miss the worker's heartbeats.
            await anyio.to_thread.run_sync(_import_client)
            from mcp.client.session import ClientSession

            async with contextlib.AsyncExitStack() as stack:
                if self.server.command:
                    from mcp.client.stdio import StdioServerParameters, stdio_client

                    command, *args = self.server.command
                    params = StdioServerParameters(command=command, args=args, env=self.server.env)
                    read, write = await stack.enter_async_context(stdio_client(params))
                else:
                    from mcp.client.streamable_http import streamable_http_client

                    read, write = await stack.enter_async_context(streamable_http_client(self.server.url))
                session = await stack.enter_async_context(ClientSession(read, _NamingCancels(write)))
                await session.initialize()
                self.session = session
                self.ready.set()
                await self.closing.wait()
        except BaseException as exc:  # the callers waiting for it learn why
            self.error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            self.ready.set()

    async def get(self) -> Any:
        await self.ready.wait()
        if self.session is None:
            raise ConnectionError(f"MCP server {self.server.name!r} could not be reached: {self.error!r}")
        return self.session


class McpSessions:
    """A host's MCP sessions, one per server, opened at their first call."""

    def __init__(self) -> None:
        self._open: dict[McpServer, _Session] = {}
        self.in_flight: dict[str, anyio.Event] = {}  # call id -> set once its records are written

    async def session(self, server: McpServer) -> Any:
        held = self._open.get(server)
        if held is None or (held.ready.is_set() and held.session is None):
            held = self._open[server] = _Session(server)
        return await held.get()

    async def aclose(self) -> None:
        held, self._open = list(self._open.values()), {}
        for one in held:
            one.closing.set()
        with anyio.move_on_after(RECORD_BOUND_S * 2):
            for one in held:
                with contextlib.suppress(BaseException):
                    await one.task


def sessions_of(host: Any) -> McpSessions:
    sessions = getattr(host, "mcp", None)
    if sessions is None:
        sessions = McpSessions()
        host.mcp = sessions
    assert isinstance(sessions, McpSessions)
    return sessions


def why_cut(host: Any, run: Any) -> str:
    """Which signal cut the call (the run's stopper; the host's end)."""
    info = getattr(run, "stopped_by", None)
    if info is not None:
        how = str(getattr(run, "how", ""))
        return str(info.signal.value) + (f" ({how})" if how else "")
    end: str | None = getattr(host, "end_reason", None)
    return "SIGKILL" if end == "killed" else f"hosting ended ({end})" if end else "cancelled"


async def _record(host: Any, data: dict[str, Any]) -> None:
    fenced = getattr(host, "_fenced", None)
    if fenced is None:  # the test harness keeps no stream
        return
    # Written straight through the lease (not host.emit): a cleanup's handler writes wait for the
    # run's end, and that end waits for these.
    with contextlib.suppress(Exception):
        await fenced.write(retry=True, custom=rt.CustomEvent(type=MCP_EVENT, data=json_to_value(data)))


async def _emit_progress(host: Any, data: dict[str, Any]) -> None:
    fenced = getattr(host, "_fenced", None)
    if fenced is not None:
        with contextlib.suppress(Exception):
            await fenced.write(
                retry=False, custom=rt.CustomEvent(type=PROGRESS_EVENT, data=json_to_value(data))
            )


async def call_tool(
    ctx: Context, server: McpServer, tool: str, arguments: dict[str, Any] | None, timeout_s: float | None
) -> list[Any]:
    """The call itself (inside its recorded step): its records around it, and its content."""
    host = ctx._host
    run = getattr(host, "_run", None)
    sessions = sessions_of(host)
    session = await sessions.session(server)
    call = uuid.uuid4().hex[:12]
    base = {"run": ctx.message_key, "call": call, "server": server.name, "tool": tool}
    done = sessions.in_flight[call] = anyio.Event()
    last = [0.0]

    async def progress(value: float, total: float | None, message: str | None) -> None:
        now = time.monotonic()
        if now - last[0] < PROGRESS_EVERY_S:
            return  # throttled: the next one after the window is written
        last[0] = now
        await _emit_progress(host, {**base, "progress": value, "total": total, "message": message})

    _CUT.set(lambda: why_cut(host, run))  # this task's own context: the step's
    try:
        await _record(host, {**base, "phase": "started", "reason": ""})
        result = await session.call_tool(
            tool, arguments, read_timeout_seconds=timeout_s, progress_callback=progress
        )
    except anyio.get_cancelled_exc_class():
        # The SDK has sent its cancel (stdio) or aborted the POST (HTTP) by now.
        with anyio.CancelScope(shield=True), anyio.move_on_after(RECORD_BOUND_S):
            await _record(host, {**base, "phase": "cancelled", "reason": why_cut(host, run)})
        raise
    except BaseException as exc:
        with anyio.CancelScope(shield=True), anyio.move_on_after(RECORD_BOUND_S):
            await _record(host, {**base, "phase": "ended", "reason": f"{type(exc).__name__}: {exc}"})
        raise
    else:
        await _record(host, {**base, "phase": "ended", "reason": "error" if result.is_error else ""})
    finally:
        done.set()
        sessions.in_flight.pop(call, None)
    content: Sequence[Any] = result.content
    if result.is_error:
        text = " ".join(getattr(c, "text", "") for c in content)
        raise RuntimeError(f"MCP tool {server.name}/{tool} failed: {text}")
    return [c.model_dump(mode="json", exclude_none=True) for c in content]


async def settle(host: Any) -> None:
    """The run is ending: its cut calls' records first (bounded), so the fold sees them before
    the run's end."""
    sessions = getattr(host, "mcp", None)
    if not isinstance(sessions, McpSessions) or not sessions.in_flight:
        return
    with anyio.move_on_after(RECORD_BOUND_S):
        for done in list(sessions.in_flight.values()):
            await done.wait()
