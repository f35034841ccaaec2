"""What the test MCP server (mcp_server_app.py) reports it saw, received on loopback: each
sighting is awaited as an event, never polled."""

from __future__ import annotations

import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from anyio.abc import SocketStream

SERVER = Path(__file__).with_name("mcp_server_app.py")


class Sightings:
    """Lines ``<tag> <what> [time_ns]`` from the server; ``wait(tag, what)`` for one."""

    def __init__(self) -> None:
        self.port = 0
        self.seen: dict[tuple[str, str], int] = {}
        self._events: dict[tuple[str, str], anyio.Event] = {}

    def _event(self, key: tuple[str, str]) -> anyio.Event:
        return self._events.setdefault(key, anyio.Event())

    async def _serve(self, stream: SocketStream) -> None:
        async with stream:
            data = b""
            while not data.endswith(b"\n"):
                data += await stream.receive()
        tag, what, *stamp = data.decode().split()
        self.seen[(tag, what)] = int(stamp[0]) if stamp else 0
        self._event((tag, what)).set()

    async def wait(self, tag: str, what: str) -> int:
        """The sighting's time_ns (0: none stamped)."""
        with anyio.fail_after(30):
            await self._event((tag, what)).wait()
        return self.seen[(tag, what)]


@asynccontextmanager
async def sightings() -> AsyncIterator[Sightings]:
    found = Sightings()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    found.port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, found._serve)
        yield found
        tg.cancel_scope.cancel()


def stdio_command(found: Sightings) -> list[str]:
    return [sys.executable, str(SERVER), "stdio", str(found.port)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@asynccontextmanager
async def http_server(found: Sightings) -> AsyncIterator[str]:
    """The server on streamable HTTP (uvicorn on loopback): its URL once it listens."""
    port = free_port()
    async with await anyio.open_process(
        [sys.executable, str(SERVER), "http", str(port), str(found.port)]
    ) as proc:
        try:
            await found.wait("-", "listening")
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            proc.kill()
