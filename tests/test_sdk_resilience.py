"""Retries append exactly once; watches survive a broken connection and a
kill -9 of the server, missing and repeating nothing."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from electric_server.app import ElectricServer

from electric_sdk import AsyncClient, RetryPolicy, Signal, errors

pytestmark = pytest.mark.anyio


class SeveringProxy:
    """A TCP proxy on loopback that can cut every connection at once."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.writers: set[asyncio.StreamWriter] = set()
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def sever(self) -> None:
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        self.sever()
        if self.server is not None:
            self.server.close()


async def test_retry_after_a_lost_response_appends_exactly_once(server: ElectricServer) -> None:
    port = int(server.address.rsplit(":", 1)[1])
    proxy = SeveringProxy(port)
    address = await proxy.start()
    ref = ("agent", "r1")
    client = AsyncClient(address, retry=RetryPolicy(attempts=5, initial_backoff_s=0.01, max_backoff_s=0.05))
    try:
        await client.spawn("agent/r1")
        severed: list[int] = []

        def cut_on_commit(commit: object) -> None:
            # The signal is durable now; cut before the response leaves.
            if not severed:
                severed.append(1)
                proxy.sever()

        unsubscribe = server.store.hub.subscribe(ref, cut_on_commit)
        with anyio.fail_after(10):
            result = await client.signal("agent/r1", Signal.SIGUSR, payload={"n": 1})
        unsubscribe()
        assert severed, "the response was never cut"
        assert proxy.connections >= 2, "the client did not reconnect and retry"
        page = await client.events("agent/r1")
        signals = [e for e in page.events if e.type == "signal"]
        assert len(signals) == 1, [e.to_json() for e in page.events]
        assert signals[0].txid == result.txid
        assert signals[0].key == result.key
    finally:
        await client.close()
        await proxy.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_watch_survives_kill_9_and_restart(
    server_process: Callable[..., object], tmp_path: Path
) -> None:
    port = _free_port()
    data = tmp_path / "crash"
    proc = server_process(data, port=port)
    address = f"127.0.0.1:{port}"
    fast = RetryPolicy(attempts=50, initial_backoff_s=0.02, max_backoff_s=0.2, total_s=30)
    writer = AsyncClient(address, retry=fast)
    watcher = AsyncClient(address, retry=fast, reconnect_s=30)
    seen: list[int] = []
    try:
        await writer.spawn("agent/w1")
        first_batch = anyio.Event()

        async def watch() -> None:
            async for event in watcher.watch("agent/w1"):
                seen.append(event.offset)
                if len(seen) == 21:
                    first_batch.set()

        with anyio.fail_after(60):
            await _drive(watch, writer, first_batch, proc, server_process, data, port)
        head = (await writer.get("agent/w1")).head_offset
        assert seen == list(range(head)), "a watch across kill -9 must miss and repeat nothing"
    finally:
        await writer.close()
        await watcher.close()


async def _drive(
    watch: Callable[[], object],
    writer: AsyncClient,
    first_batch: anyio.Event,
    proc: object,
    server_process: Callable[..., object],
    data: Path,
    port: int,
) -> None:
    """Write, kill -9, restart, write more, kill the entity; the watch ends at EOF."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)  # type: ignore[arg-type]
        for i in range(20):
            await writer.usr("agent/w1", {"i": i})
        await first_batch.wait()  # the watcher is live and caught up
        proc.send(signal.SIGKILL)  # type: ignore[attr-defined]
        await anyio.to_thread.run_sync(proc.wait, 10)  # type: ignore[attr-defined]
        await anyio.to_thread.run_sync(lambda: server_process(data, port=port))
        for i in range(20, 40):
            await writer.usr("agent/w1", {"i": i})
        await writer.kill("agent/w1")  # closes the stream: the watch ends by itself


async def test_no_attempt_runs_past_the_retry_policys_total() -> None:
    """A server that never answers: each attempt times out and is retried, and the last one's
    deadline is cut to what is left of ``total_s``, not a whole ``timeout_s`` past it."""
    import grpc

    loop = asyncio.get_running_loop()
    ends: list[float] = []  # each attempt's deadline, on this loop's clock, as the server saw it
    never = asyncio.Event()

    async def silent(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        remaining = context.time_remaining()
        assert remaining is not None
        ends.append(loop.time() + remaining)
        await never.wait()
        raise AssertionError("unreachable")

    handler = grpc.method_handlers_generic_handler(
        "electric.v1.EntityService", {"GetEntity": grpc.unary_unary_rpc_method_handler(silent)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    total, timeout = 1.5, 1.0
    policy = RetryPolicy(attempts=10, initial_backoff_s=0.01, max_backoff_s=0.02, total_s=total)
    client = AsyncClient(f"127.0.0.1:{port}", timeout_s=timeout, retry=policy)
    try:
        started = loop.time()
        with pytest.raises(errors.DeadlineExceeded):
            await client.get("agent/a")
        assert len(ends) >= 2, "the call was not retried"
        # grpc sends deadlines in whole milliseconds: a little slack for the rounding.
        assert max(ends) <= started + total + 0.05, [round(e - started, 3) for e in ends]
    finally:
        await client.close()
        await server.stop(0)
