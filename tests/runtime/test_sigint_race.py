"""A run that ends by itself while a SIGINT aborts it in the server: the SIGINT wins, all the way.

The server settles a SIGINT to a Python host's run in progress in the SIGINT's own commit
(tests/test_sigint_commit.py). If the run ends in the worker just then, its end is already on
its way and lands after the SIGINT: the server records it ABORTED, with what the run wrote as
its partial output. The worker must then call ``on_signal(SIGINT)`` with that output, as for
any run a SIGINT aborted, though it had no run left to cancel.

The race is made certain with a loopback proxy between the worker and the server that holds
what the worker sends: the run's end waits in it while the test's SIGINT, sent straight to the
server, commits; the server's deliveries to the worker flow on meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import anyio
import pytest
from electric_server.app import ElectricServer

from electric_sdk import AsyncClient
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import Signal
from electric_sdk.runtime import App, Context, Message, SignalInfo

from .rt_support import TIMEOUT_S, running_worker

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]


class HoldingProxy:
    """TCP on loopback to ``target``; ``hold()`` keeps what clients send until ``let_go()``."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._server: asyncio.Server | None = None
        self.address = ""
        self._flowing = asyncio.Event()
        self._flowing.set()
        self.held_bytes = 0
        self.some_held = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def hold(self) -> None:
        self.held_bytes = 0
        self.some_held.clear()
        self._flowing.clear()

    def let_go(self) -> None:
        self._flowing.set()

    async def close(self) -> None:
        self._flowing.set()
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in tuple(self._writers):
            writer.transport.abort()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._relay(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.add(up_writer)
        await asyncio.gather(self._pipe(reader, up_writer, True), self._pipe(up_reader, writer, False))

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, upstream: bool) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await src.read(65536):
                if upstream and not self._flowing.is_set():
                    self.held_bytes += len(data)
                    self.some_held.set()
                    await self._flowing.wait()
                dst.write(data)
                await dst.drain()
        dst.transport.abort()


@pytest.fixture
async def proxy(server: ElectricServer) -> AsyncIterator[HoldingProxy]:
    p = HoldingProxy(server.address)
    await p.start()
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
async def server(start_server: object) -> ElectricServer:
    # Heartbeats far apart: the only thing the worker sends while held is the run's end.
    return await start_server(lease_ttl_ms=30_000, heartbeat_interval_ms=10_000)  # type: ignore[operator, no-any-return]


async def test_a_run_ending_as_the_server_aborts_it_still_gets_its_sigint_handler(
    server: ElectricServer, proxy: HoldingProxy
) -> None:
    entered, release = anyio.Event(), anyio.Event()
    handled: list[SignalInfo] = []
    called = anyio.Event()
    app = App(code_version="race")

    @app.entity("agent")
    class Agent:
        async def on_message(self, ctx: Context, message: Message) -> None:
            ctx.output.write("everything it wrote")
            entered.set()
            await release.wait()

        async def on_signal(self, ctx: Context, signal: SignalInfo) -> None:
            handled.append(signal)
            called.set()

    async with AsyncClient(server.address) as client, running_worker(app, proxy.address):
        try:
            with anyio.fail_after(TIMEOUT_S):
                await client.spawn("agent/a")
                await client.wait_for_state("agent/a", "running", timeout=TIMEOUT_S)
                sent = await client.send("agent/a", "work")
                await entered.wait()
                async for event in client.watch("agent/a", sent.offset):
                    if event.type == "run" and event.raw.run.status == pb.RUN_STATUS_STARTED:
                        break  # the server knows the run: a SIGINT is its to settle
                proxy.hold()
                release.set()  # the run ends by itself; its end waits in the proxy
                await proxy.some_held.wait()
                answer = await client.interrupt("agent/a", reason="stop")
                assert answer.outcome is not None, answer
                assert answer.outcome.value == "aborted", answer
                proxy.let_go()
                await called.wait()
                async for event in client.watch("agent/a", sent.offset):
                    if event.type == "run" and event.raw.run.status not in (
                        pb.RUN_STATUS_STARTED,
                        pb.RUN_STATUS_STEP,
                    ):
                        run = event.raw.run
                        break
        finally:
            proxy.let_go()  # a failure above leaves nothing held: the worker can shut down
    assert run.message_key == sent.key
    assert run.status == pb.RUN_STATUS_ABORTED, run
    assert run.error == "SIGINT (the run had completed as it landed)"
    assert run.output == "everything it wrote"
    assert [s.signal for s in handled] == [Signal.SIGINT]
    assert handled[0].message_key == sent.key
    assert handled[0].partial_output == "everything it wrote"
    assert handled[0].reason == "stop"
