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
     cancelled | bound_passed, "reason": ...}

A signal that ends the run (SIGINT, an interrupting SIGTERM, SIGKILL, the grace deadline)
cancels the call: the SDK then tells the server the way its transport defines
(``notifications/cancelled`` with the request id, its reason naming the signal, e.g. ``SIGINT``;
on streamable HTTP the request's POST is aborted too), and the ``cancelled`` record names it.
The SDK's call runs in a task of its own, so that telling the server is bounded by the server's
``cancel_bound`` (default ``DEFAULT_CANCEL_BOUND_S``): the SDK writes its cancel shielded, and a
server that is not reading its input (a tool blocking its event loop ignores the cancel, and its
stdin pipe fills up) would hold the step for the SDK's own bound (5 s) or longer. Past the
bound the call is given up on, recorded ``bound_passed``; the SDK's task goes on alone, until
its write ends or the session closes. The run's end record waits (bounded) for these records
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
# How long a cut call's record, and the run's end waiting for it (past the call's cancel bound),
# may take.
RECORD_BOUND_S = 2.0
# How long a cut call may take to tell its server, unless its server says otherwise: telling is a
# local write (a pipe, a POST aborted), so a second means the server is not taking it.
DEFAULT_CANCEL_BOUND_S = 1.0
# A run's end waits for its cut calls' records: a longer bound would hold it past any grace.
MAX_CANCEL_BOUND_S = 60.0


@dataclass(frozen=True)
class McpServer:
    """An MCP server: ``command`` (stdio, a subprocess) or ``url`` (streamable HTTP);
    ``cancel_bound_s``: how long a call cut by a signal may take to tell it (then ``bound_passed``)."""

    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    env: dict[str, str] | None = field(default=None, hash=False)
    cancel_bound_s: float = DEFAULT_CANCEL_BOUND_S

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise ValueError(
                f"MCP server {self.name!r}: give command=[...] (stdio) or url= (HTTP), one of them"
            )
        if not self.name or "/" in self.name:
            raise ValueError(f"MCP server name {self.name!r}: non-empty, no '/'")
        if not 0 < self.cancel_bound_s <= MAX_CANCEL_BOUND_S:
            raise ValueError(
                f"MCP server {self.name!r}: cancel_bound must be more than 0 and at most "
                f"{MAX_CANCEL_BOUND_S:g}s, got {self.cancel_bound_s:g}s"
            )


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
        # call id -> (set once its records are written, its server's cancel bound)
        self.in_flight: dict[str, tuple[anyio.Event, float]] = {}

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
            for one in held:  # a call given up on past its bound ends with its session here
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
    done = anyio.Event()
    sessions.in_flight[call] = (done, server.cancel_bound_s)
    last = [0.0]

    async def progress(value: float, total: float | None, message: str | None) -> None:
        now = time.monotonic()
        if now - last[0] < PROGRESS_EVERY_S:
            return  # throttled: the next one after the window is written
        last[0] = now
        await _emit_progress(host, {**base, "progress": value, "total": total, "message": message})

    _CUT.set(lambda: why_cut(host, run))  # this task's own context: the step's, copied to the SDK's
    sdk_call: asyncio.Task[Any] | None = None
    try:
        await _record(host, {**base, "phase": "started", "reason": ""})
        sdk_call = asyncio.get_running_loop().create_task(
            session.call_tool(tool, arguments, read_timeout_seconds=timeout_s, progress_callback=progress),
            name=f"mcp {server.name}/{tool} {call}",
        )
        result = await asyncio.shield(sdk_call)  # cut: the SDK's task is cancelled below, bounded
    except anyio.get_cancelled_exc_class():
        # Told and recorded in a task of its own, waited for whatever cancels come meanwhile: a
        # call in a task the run started (asyncio.gather) is cancelled again at each pass of the
        # loop while the run's scope is cancelled, which no anyio shield keeps out.
        await _whatever_comes(asyncio.get_running_loop().create_task(_cut(host, run, base, server, sdk_call)))
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


async def _cut(host: Any, run: Any, base: dict[str, Any], server: McpServer, sdk_call: Any) -> None:
    """The call was cut: tell the server (bounded), then record how that went."""
    told = await _tell(sdk_call, server.cancel_bound_s)
    why = why_cut(host, run)
    if not told:
        why += f"; the server did not take the cancel within {server.cancel_bound_s:g}s"
    with anyio.move_on_after(RECORD_BOUND_S):
        await _record(host, {**base, "phase": "cancelled" if told else "bound_passed", "reason": why})


async def _whatever_comes(task: asyncio.Task[None]) -> None:
    """Wait for ``task`` (itself bounded), taking no cancel meanwhile."""
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task})


async def _tell(sdk_call: asyncio.Task[Any] | None, bound_s: float) -> bool:
    """Cancel the SDK's call, which tells the server (its cancel written, shielded, by the SDK):
    whether it ended within ``bound_s``. Past it the task is left to end on its own."""
    if sdk_call is None:
        return True  # cut before the call was made: nothing to tell
    sdk_call.cancel()
    with anyio.move_on_after(bound_s):
        await asyncio.wait({sdk_call})  # its end, whatever it was (not raised here), is all that counts
    if not sdk_call.done():
        # Whatever it ends with later is retrieved, so that asyncio does not log it as lost.
        sdk_call.add_done_callback(lambda t: t.cancelled() or t.exception())
        return False
    return True


async def settle(host: Any) -> None:
    """The run is ending: its cut calls' records first (bounded: each call's cancel bound, then
    its record's), so the fold sees them before the run's end."""
    sessions = getattr(host, "mcp", None)
    if not isinstance(sessions, McpSessions) or not sessions.in_flight:
        return
    calls = list(sessions.in_flight.values())
    with anyio.move_on_after(max(bound for _, bound in calls) + RECORD_BOUND_S):
        for done, _ in calls:
            await done.wait()
