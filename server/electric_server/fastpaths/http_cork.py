"""The door's HTTP/1.1 protocol: uvicorn's h11 protocol with its writes corked for a turn of the loop.

uvicorn writes an answer's head and its body with two ``transport.write`` calls, and asyncio sends
each at once: two ``send`` system calls and two TCP segments per answer, and on loopback the sender
pays for the receiver's side of each. Starlette sends the two from one task without waiting in
between, so they fall in one turn of the event loop. ``CorkedTransport`` holds what is written in a
turn and hands it to the socket's transport as one write at the turn's end (``call_soon``), as
``TCP_CORK`` would: one system call, one segment. This is the ``http_cork`` fast path
(``fastpaths/__init__.py``): forced off, the door serves with uvicorn's own ``H11Protocol``;
bench/bench_fastpaths.py measures the two side by side (docs/scaling.md keeps the figures).

Nothing waits longer than the turn it was written in: an SSE event or a streamed chunk written in
a turn is on the socket by the next. A turn that writes ``FLUSH_BYTES`` or more hands it over at
once, so the socket's transport sees the bytes and applies its flow control (``pause_writing``)
as before; closing hands over what is held first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from . import forced

# A turn that writes this much hands it over at once (a large body, a burst of stream events).
FLUSH_BYTES = 64 * 1024


class CorkedTransport(asyncio.Transport):
    """A socket transport's writes, held until the end of the loop's turn; the rest passes through."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._flush_scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self._held.append(bytes(data))
        self._held_bytes += len(data)
        if self._held_bytes >= FLUSH_BYTES:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._end_of_turn)

    def _end_of_turn(self) -> None:
        self._flush_scheduled = False
        self.flush()

    def flush(self) -> None:
        """Hand what is held to the socket's transport, as one write."""
        if not self._held:
            return
        held = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        self._held, self._held_bytes = [], 0
        self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held, self._held_bytes = [], 0
        self._transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.flush()  # what the old protocol wrote goes first
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def get_write_buffer_size(self) -> int:
        return self._held_bytes + self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)


class CorkedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, writing through a ``CorkedTransport``."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CorkedTransport(transport, self.loop))


def h11_protocol() -> type[H11Protocol]:
    """The door's HTTP/1.1 protocol: corked, or uvicorn's own with the ``http_cork`` fallback forced."""
    return H11Protocol if forced("http_cork") else CorkedH11Protocol
