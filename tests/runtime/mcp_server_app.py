"""A real MCP server (the official SDK) for tests/runtime/test_mcp_calls.py and the bench.

``python mcp_server_app.py stdio REPORT_PORT`` or ``... http PORT REPORT_PORT``. Tools: ``fast``
answers at once; ``slow`` reports progress until it is cancelled; ``stall`` ignores its cancel
(it blocks the server's event loop, so nothing more is read: ``<tag> full`` once its input pipe
has filled up behind it); ``sink`` takes a large argument. Each sighting is sent as one
line to the test's listener on loopback ``REPORT_PORT``: ``<tag> started``, and ``<tag>
cancelled <time.time_ns()>`` when the server saw the cancel, ``reason <reason>`` for each
``notifications/cancelled`` (its spaces as ``_``).
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import termios
import threading
import time

import anyio
from mcp import types
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("electric-test")
REPORT_PORT = int(sys.argv[-1])
# The input pipe, kept before the SDK takes fd 0 over (it diverts it so that tools cannot read it).
INPUT = os.dup(0)
PAGE = 4096


def _report(line: str) -> None:
    with socket.create_connection(("127.0.0.1", REPORT_PORT)) as conn:
        conn.sendall(line.encode() + b"\n")


@server.tool()
async def fast(text: str) -> str:
    return f"echo {text}"


@server.tool()
async def slow(tag: str, ctx: Context) -> str:
    _report(f"{tag} started")
    try:
        for i in range(36000):
            await ctx.report_progress(i, None, "working")
            await anyio.sleep(0.01)
    except anyio.get_cancelled_exc_class():
        _report(f"{tag} cancelled {time.time_ns()}")
        raise
    return "done"


_ANYIO_WORKER = os.path.join("anyio", "_backends", "_asyncio.py")


def _reading_input() -> bool:
    """Whether another thread of this server is inside a call anyio handed it: the SDK reads its
    input a line at a time in anyio's worker threads, and a thread in that C readline shows
    anyio's own frame on top (an idle one waits in ``threading``)."""
    me = threading.get_ident()
    return any(
        frame.f_code.co_name == "run" and frame.f_code.co_filename.endswith(_ANYIO_WORKER)
        for ident, frame in sys._current_frames().items()
        if ident != me
    )


@server.tool()
async def stall(tag: str, release: str) -> str:
    """A tool that ignores cancellation the bluntest way: it blocks the event loop (a sync wait in
    an async tool), so the server reads neither the cancel nor anything else until ``release``
    exists (the test creates it at its end, so that the server can be shut down as usual)."""
    _report(f"{tag} started")
    if os.fstat(INPUT).st_mode & 0o170000 == 0o010000:  # a pipe (stdio): say when it is full
        size = fcntl.fcntl(INPUT, fcntl.F_GETPIPE_SZ)
        pending = bytearray(4)
        # Full, and for good: a line the SDK's reader thread is still taking in (it may have
        # started before the loop blocked) would drain the pipe after "full" was said, and the
        # client's cancels would then find room. Once that thread is idle, nothing reads again.
        while int.from_bytes(pending, sys.byteorder) < size - PAGE or _reading_input():
            fcntl.ioctl(INPUT, termios.FIONREAD, pending)
            time.sleep(0.001)  # noqa: ASYNC251 - blocking the loop is what this tool is for
        _report(f"{tag} full")
    while not os.path.exists(release):  # noqa: ASYNC240 - blocking, on purpose
        time.sleep(0.01)  # noqa: ASYNC251 - the loop stays blocked: the cancel is never read
    return "released"


@server.tool()
async def sink(data: str) -> int:
    return len(data)


async def _cancelled(ctx: object, params: types.CancelledNotificationParams) -> None:
    """The cancel as sent: its reason (the SDK cancels the tool itself, before this runs)."""
    _report(f"reason {(params.reason or '').replace(' ', '_')}")


server._lowlevel_server.add_notification_handler(
    "notifications/cancelled", types.CancelledNotificationParams, _cancelled
)


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        import uvicorn

        # Listening before uvicorn serves: connections wait in the backlog, so "listening" is true.
        sock = socket.create_server(("127.0.0.1", int(sys.argv[2])))
        _report("- listening")
        config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
        uvicorn.Server(config).run(sockets=[sock])
