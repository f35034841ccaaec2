"""A real MCP server (the official SDK) for tests/runtime/test_mcp_calls.py and the bench.

``python mcp_server_app.py stdio REPORT_PORT`` or ``... http PORT REPORT_PORT``. Tools: ``fast``
answers at once; ``slow`` reports progress until it is cancelled. Each sighting is sent as one
line to the test's listener on loopback ``REPORT_PORT``: ``<tag> started``, and ``<tag>
cancelled <time.time_ns()>`` when the server saw the cancel, ``reason <reason>`` for each
``notifications/cancelled`` (its spaces as ``_``).
"""

from __future__ import annotations

import socket
import sys
import time

import anyio
from mcp import types
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("electric-test")
REPORT_PORT = int(sys.argv[-1])


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
