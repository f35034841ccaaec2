"""Resource caps (issue 18): what a caller may hold open, and a tokens file others can read.

- A runtime stream that sends no hello is ended after the hello deadline
  (``DEADLINE_EXCEEDED``/``HELLO_TIMEOUT``), in milliseconds here.
- Per principal, at most N open streams (watches and runtime streams) and M
  worker sessions: the next one is ``RESOURCE_EXHAUSTED`` with
  ``TOO_MANY_STREAMS``/``TOO_MANY_SESSIONS``, another principal is not
  affected, and closing one frees its slot.
- A tokens file its group or others can read: ``electric server`` exits 2
  naming the fix, unless ``--allow-readable-tokens`` (then a warning).
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import grpc
import httpx
import pytest
from conftest import ServerProcess, StartServer
from electric_server.app import ElectricServer
from helpers import error_info

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import runtime_service_pb2_grpc as rt_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.runtime_session import SESSION_ACCEPTED

pytestmark = pytest.mark.anyio

A1 = pb.EntityRef(type="agent", id="a1")
Code = grpc.StatusCode
TOKENS = {"alice": "alice-token-0001", "bob": "bob-token-00001"}
TOKENS_TOML = "".join(
    f'[[tokens]]\ntoken = "{token}"\nprincipal = "{name}"\nscopes = ["admin"]\n'
    for name, token in TOKENS.items()
)


def tokens_file(folder: Path, mode: int) -> Path:
    path = folder / "tokens.toml"
    path.write_text(TOKENS_TOML)
    path.chmod(mode)
    return path


def auth(name: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {TOKENS[name]}")]


async def refused(call: Any) -> tuple[Code, str]:
    with anyio.fail_after(10), pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), error_info(caught.value).reason


class Worker:
    """A runtime stream: the hello once accepted, then silence (the server's heartbeat check
    is far away: the test servers keep the default lease TTL)."""

    def __init__(self, channel: grpc.aio.Channel, name: str, metadata: Any = (), hello: bool = True) -> None:
        self.requests: asyncio.Queue[rt.ConnectRequest | None] = asyncio.Queue()
        self.hello = rt.ConnectRequest(hello=rt.Hello(worker_id=name, types=[rt.HostedType(type="wk")]))
        self.send_hello = hello
        self.call = rt_grpc.RuntimeServiceStub(channel).Connect(self._requests(), metadata=metadata)

    async def _requests(self) -> Any:
        while (item := await self.requests.get()) is not None:
            yield item

    async def start(self) -> rt.ConnectResponse:
        """The welcome (raises the stream's status if it was refused)."""
        with anyio.fail_after(10):
            accepted = (await self.call.initial_metadata()).get(SESSION_ACCEPTED[0]) == SESSION_ACCEPTED[1]
            if accepted and self.send_hello:
                self.requests.put_nowait(self.hello)
            response = await self.call.read()
        if response is grpc.aio.EOF:
            await self.call  # the status
        assert isinstance(response, rt.ConnectResponse)
        return response

    def close(self) -> None:
        self.requests.put_nowait(None)
        self.call.cancel()

    async def hang_up(self) -> None:
        """End the session from the worker's side, and wait until the server has ended it (its
        handler, and with it the session's slots, is done before the stream's status is sent)."""
        self.requests.put_nowait(None)
        with anyio.fail_after(10):
            while await self.call.read() is not grpc.aio.EOF:
                pass


async def test_a_runtime_stream_without_hello_ends_at_the_deadline(start_server: StartServer) -> None:
    srv = await start_server(hello_timeout_ms=150)
    async with grpc.aio.insecure_channel(srv.address) as channel:
        silent = Worker(channel, "w-silent", hello=False)
        assert await refused(silent.start()) == (Code.DEADLINE_EXCEEDED, "HELLO_TIMEOUT")
        silent.close()
        assert not srv.caps.streams  # its slot was given back before the status was sent
        # A worker that says hello in time is served as ever.
        worker = Worker(channel, "w-prompt")
        assert (await worker.start()).WhichOneof("msg") == "welcome"
        worker.close()


async def open_watch(stub: Any, metadata: Any = ()) -> Any:
    """A WatchEntities stream, open once its first item (the snapshot) has arrived."""
    call = stub.WatchEntities(api.WatchEntitiesRequest(), metadata=metadata)
    with anyio.fail_after(10):
        await call.read()
    return call


async def read_to_end(call: Any) -> None:
    """Read a server stream to its end: by then its handler, and the slot it held, are done."""
    with anyio.fail_after(10):
        while await call.read() is not grpc.aio.EOF:
            pass


async def test_streams_per_principal_are_capped(start_server: StartServer, tmp_path: Path) -> None:
    srv = await start_server(tokens_file=tokens_file(tmp_path, 0o600), max_streams=3)
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=A1), metadata=auth("alice"))
        # Watches of both kinds and a runtime stream count alike.
        events = stub.WatchEvents(api.WatchEventsRequest(ref=A1), metadata=auth("alice"))
        with anyio.fail_after(10):
            await events.read()  # the spawn: the watch is open
        entities = await open_watch(stub, auth("alice"))
        worker = Worker(channel, "w1", auth("alice"))
        await worker.start()
        assert srv.caps.streams == {"alice": 3}
        fourth = stub.WatchEvents(api.WatchEventsRequest(ref=A1), metadata=auth("alice"))
        assert await refused(fourth.read()) == (Code.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS")
        assert await refused(open_watch(stub, auth("alice"))) == (Code.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS")
        another = Worker(channel, "w2", auth("alice"))
        assert await refused(another.start()) == (Code.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS")
        another.close()
        # Per principal: bob is not held back by alice's streams.
        bobs = await open_watch(stub, auth("bob"))
        # A stream that ends gives its slot back: the killed entity's stream closes its watch.
        await stub.SignalEntity(
            api.SignalEntityRequest(ref=A1, signal=pb.SIGNAL_SIGKILL), metadata=auth("alice")
        )
        await read_to_end(events)
        again = await open_watch(stub, auth("alice"))
        await worker.hang_up()
        assert srv.caps.streams == {"alice": 2, "bob": 1}
        for call in (entities, again, bobs):
            call.cancel()


async def test_worker_sessions_per_principal_are_capped(start_server: StartServer) -> None:
    srv = await start_server(max_sessions=2)
    async with grpc.aio.insecure_channel(srv.address) as channel:
        workers = [Worker(channel, f"w{n}") for n in range(2)]
        for worker in workers:
            assert (await worker.start()).WhichOneof("msg") == "welcome"
        third = Worker(channel, "w2")
        assert await refused(third.start()) == (Code.RESOURCE_EXHAUSTED, "TOO_MANY_SESSIONS")
        third.close()
        await workers.pop().hang_up()
        assert srv.caps.sessions == {"anonymous": 1}
        again = Worker(channel, "w3")
        assert (await again.start()).WhichOneof("msg") == "welcome"
        for worker in [*workers, again]:
            worker.close()


def electric_server(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "electric_sdk.cli.main", "server", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660], ids=lambda m: f"{m:04o}")
def test_a_tokens_file_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    tokens = tokens_file(tmp_path, mode)
    data = tmp_path / "data"
    result = electric_server("--listen", "127.0.0.1:0", "--data", str(data), "--tokens", str(tokens))
    assert result.returncode == 2, result.stderr
    assert f"mode {mode:04o}" in result.stderr
    assert f"chmod 600 {tokens}" in result.stderr
    assert "--allow-readable-tokens" in result.stderr
    assert "Traceback" not in result.stderr
    assert not data.exists()


def test_a_readable_tokens_file_is_used_with_the_flag_and_a_warning(
    tmp_path: Path, server_process: Callable[..., ServerProcess]
) -> None:
    tokens = tokens_file(tmp_path, 0o644)
    proc = server_process(None, "--tokens", str(tokens), "--allow-readable-tokens")
    output = "".join(proc.lines)
    assert re.search(
        rf"WARNING .*tokens file {re.escape(str(tokens))} may be read .*\(mode 0644\)", output
    ), output
    assert f"chmod 600 {tokens}" in output
    proc.send(signal.SIGTERM)
    assert proc.wait() == 0


def test_a_private_tokens_file_gets_no_warning(
    tmp_path: Path, server_process: Callable[..., ServerProcess]
) -> None:
    proc = server_process(None, "--tokens", str(tokens_file(tmp_path, 0o600)))
    assert "tokens file" not in "".join(proc.lines)
    proc.send(signal.SIGTERM)
    assert proc.wait() == 0


@pytest.mark.parametrize("flag", ["--max-streams", "--max-sessions", "--hello-timeout"])
def test_caps_below_one_are_a_usage_error(tmp_path: Path, flag: str) -> None:
    data = tmp_path / "data"
    result = electric_server("--listen", "127.0.0.1:0", "--data", str(data), flag, "0")
    assert result.returncode == 2, result.stderr
    assert flag in result.stderr
    assert not data.exists()


async def test_the_defaults_leave_room_for_the_benches(server: ElectricServer) -> None:
    # bench_watch: 1,000 watchers; bench_fanout: 2,000; bench_runtime: one worker.
    assert (server.config.max_streams, server.config.max_sessions) == (5_000, 100)
    assert server.config.hello_timeout_ms == 10_000


async def test_an_sse_read_over_the_cap_is_refused_before_any_event(start_server: StartServer) -> None:
    """As a long-poll is: 429 TOO_MANY_STREAMS, not a 200 with the catch-up and a silent end."""
    srv = await start_server(max_streams=1, http="127.0.0.1:0")
    assert srv.http is not None
    async with (
        grpc.aio.insecure_channel(srv.address) as channel,
        httpx.AsyncClient(base_url=srv.http.address) as http,
    ):
        stub = api_grpc.EntityServiceStub(channel)
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=A1))
        held = stub.WatchEvents(api.WatchEventsRequest(ref=A1))
        with anyio.fail_after(10):
            await held.read()  # the watch is open: it holds the one slot
        answer = await http.get(f"/{A1.type}/{A1.id}/stream", params={"offset": "-1", "live": "sse"})
        assert answer.status_code == 429
        assert answer.json()["error"]["code"] == "TOO_MANY_STREAMS"
        held.cancel()
