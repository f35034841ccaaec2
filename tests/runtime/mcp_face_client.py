"""The official MCP client, as a process of its own, for the MCP face's drop tests
(tests/runtime/test_mcp_face.py): ``python mcp_face_client.py stdio ADDRESS REF TEXT`` runs
``electric mcp`` and calls ``send``; ``... http URL REF TEXT`` calls it on the door's /mcp.
It prints ``called`` once the call is sent, then waits for the answer: the test kills it
(SIGKILL) mid-call, which drops the connection without any cancel.
"""

from __future__ import annotations

import sys
from contextlib import AsyncExitStack

import anyio
from mcp.client.session import ClientSession


async def main(transport: str, where: str, ref: str, text: str) -> None:
    async with AsyncExitStack() as stack:
        if transport == "stdio":
            from mcp.client.stdio import StdioServerParameters, stdio_client

            args = ["-m", "electric_sdk.cli.main", "mcp", "--address", where]
            params = StdioServerParameters(command=sys.executable, args=args)
            read, write = await stack.enter_async_context(stdio_client(params))
        else:
            from mcp.client.streamable_http import streamable_http_client

            read, write = await stack.enter_async_context(streamable_http_client(where))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()

        async def progress(value: float, total: float | None, message: str | None) -> None:
            print(f"progress {value} {message}", flush=True)

        print("called", flush=True)
        result = await session.call_tool("send", {"ref": ref, "text": text}, progress_callback=progress)
        print("answered", result.is_error, flush=True)


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:5])
