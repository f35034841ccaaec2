"""``Client.wait_ready()``: a script that starts a server and connects at once waits for it to
serve, rather than failing with Unavailable; with nothing to wait for, Unavailable at the end."""

from __future__ import annotations

import socket
from pathlib import Path

import anyio
import pytest

from electric_sdk import AsyncClient, Client
from electric_sdk.errors import Unavailable
from electric_sdk.testing import TestServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


pytestmark = pytest.mark.anyio


async def test_waits_for_a_server_that_is_still_starting(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    server = TestServer(tmp_path / "electric", listen=address)
    async with AsyncClient(address) as client, anyio.create_task_group() as tg:
        ready = anyio.Event()

        async def wait() -> None:
            await client.wait_ready(timeout=20)
            ready.set()

        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()  # the client is waiting before the server exists
        assert not ready.is_set()
        await anyio.to_thread.run_sync(server.start)
        try:
            with anyio.fail_after(20):
                await ready.wait()
            assert (await client.spawn("a/b")).ref.url == "/a/b"
        finally:
            await anyio.to_thread.run_sync(server.stop)


async def test_no_server_is_unavailable_after_the_timeout() -> None:
    async with AsyncClient(f"127.0.0.1:{free_port()}") as client:
        with anyio.fail_after(10), pytest.raises(Unavailable, match=r"not ready after 0\.2 s"):
            await client.wait_ready(timeout=0.2)


def test_the_sync_client_waits_too(tmp_path: Path) -> None:
    with TestServer(tmp_path / "electric") as server, Client(server.address) as client:
        client.wait_ready(timeout=10)
        client.spawn("a/b")
