"""The door's corked transport (server/electric_server/fastpaths/http_cork.py), over a real socket pair.

What a loop turn writes reaches the peer at the turn's end as one segment; a write of
FLUSH_BYTES or more, a close and a protocol switch hand over at once; an abort drops what is held.
The HTTP tests (test_http*.py) serve every route through it end to end.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from electric_server.fastpaths.http_cork import FLUSH_BYTES, CorkedTransport

pytestmark = pytest.mark.anyio


class _Peer:
    """The far end of the pair, read without blocking: what has arrived so far."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setblocking(False)

    def arrived(self) -> bytes:
        try:
            return self.sock.recv(1 << 20)
        except BlockingIOError:
            return b""


@pytest.fixture
async def pair() -> AsyncIterator[tuple[CorkedTransport, _Peer]]:
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
    peer = _Peer(theirs)
    try:
        yield CorkedTransport(transport, loop), peer
    finally:
        transport.close()
        theirs.close()


async def _end_of_turn() -> None:
    await asyncio.sleep(0)  # one turn of the loop: the corked write's call_soon runs


async def test_a_turns_writes_reach_the_peer_together_at_its_end(pair: tuple[CorkedTransport, _Peer]) -> None:
    corked, peer = pair
    corked.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    corked.write(memoryview(b"{}"))
    corked.write(b"")  # nothing: no write of its own
    assert peer.arrived() == b""  # held until the turn ends
    assert corked.get_write_buffer_size() == 40
    await _end_of_turn()
    assert peer.arrived() == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
    assert corked.get_write_buffer_size() == 0


async def test_the_next_turns_writes_go_in_order_after(pair: tuple[CorkedTransport, _Peer]) -> None:
    corked, peer = pair
    corked.write(b"first ")
    await _end_of_turn()
    corked.write(b"second")
    await _end_of_turn()
    assert peer.arrived() == b"first second"


async def test_a_large_write_is_handed_over_at_once(pair: tuple[CorkedTransport, _Peer]) -> None:
    corked, peer = pair
    corked.write(b"a")
    corked.write(b"b" * FLUSH_BYTES)
    got = b""
    while chunk := peer.arrived():  # no turn of the loop: the bytes went to the socket already
        got += chunk
    assert got.startswith(b"ab")
    assert corked.get_write_buffer_size() == 1 + FLUSH_BYTES - len(got)  # the rest: the socket's


async def test_close_sends_what_is_held_first(pair: tuple[CorkedTransport, _Peer]) -> None:
    corked, peer = pair
    corked.write(b"goodbye")
    corked.close()
    assert corked.is_closing()
    await _end_of_turn()
    await _end_of_turn()  # the socket's transport closes on the turn after its close()
    assert peer.arrived() == b"goodbye"
    assert peer.arrived() == b""  # end of file: recv answers b"" without blocking
    peer.sock.setblocking(True)
    assert peer.sock.recv(10) == b""


async def test_abort_drops_what_is_held(pair: tuple[CorkedTransport, _Peer]) -> None:
    corked, peer = pair
    corked.write(b"never sent")
    corked.abort()
    await _end_of_turn()
    await _end_of_turn()
    peer.sock.setblocking(True)
    assert peer.sock.recv(100) == b""


async def test_a_protocol_switch_sends_what_the_old_one_wrote(pair: tuple[CorkedTransport, _Peer]) -> None:
    corked, peer = pair
    protocol = corked.get_protocol()
    corked.write(b"HTTP/1.1 101 Switching Protocols\r\n\r\n")
    corked.set_protocol(protocol)
    assert peer.arrived() == b"HTTP/1.1 101 Switching Protocols\r\n\r\n"
