"""A loopback TCP proxy to PostgreSQL that a test can cut and bring back, on the same port.

Cutting it closes its listening socket and aborts every connection through it:
to the store, the database has gone away (connections reset, new ones
refused), while the shared PostgreSQL server itself runs on untouched.
Stalling it keeps every connection open and accepts new ones but relays no
byte either way until it flows again: a database (or a network) that stops
answering without closing anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse

__all__ = ["Proxy"]


class Proxy:
    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self._parts = parts
        self.target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._transports: set[asyncio.WriteTransport] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    def stall(self) -> None:
        self._flowing.clear()

    def flow(self) -> None:
        self._flowing.set()

    @property
    def url(self) -> str:
        """The database's URL, through this proxy."""
        user = f"{self._parts.username}@" if self._parts.username else ""
        return urllib.parse.urlunsplit(self._parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for transport in tuple(self._transports):
            transport.abort()
        if server is not None:
            await server.wait_closed()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        await self.cut()

    def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._relay(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self._transports.add(client_writer.transport)
        try:
            await self._flowing.wait()
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        self._transports.add(server_writer.transport)
        try:
            await asyncio.gather(
                _pipe(client_reader, server_writer, self._flowing),
                _pipe(server_reader, client_writer, self._flowing),
                return_exceptions=True,
            )
        finally:
            for writer in (client_writer, server_writer):
                writer.transport.abort()
                self._transports.discard(writer.transport)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flowing: asyncio.Event) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            await flowing.wait()  # stalled: held, then relayed in order
            writer.write(data)
            await writer.drain()
    writer.transport.abort()  # one side ended: so does the other
