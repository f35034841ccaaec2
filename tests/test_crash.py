"""Crash safety with a real `electric server` process: kill -9 mid-stream loses no acknowledged
signal, applies none twice, and `electric verify` replays every stream clean; verify also
detects a database tampered with behind the server's back.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any, TypeAlias

import anyio
import grpc
import pytest
from electric_server.app import ElectricServer

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb

pytestmark = pytest.mark.anyio

Stub: TypeAlias = "api_grpc.EntityServiceAsyncStub"

StartServer = Callable[..., Awaitable[ElectricServer]]
ENTITIES = 20
KILLED = 5  # entities e0..e4 get a SIGKILL early; later signals to them are rejected
ACKS_BEFORE_CRASH = 300
WORKERS = 8


async def verify(data_dir: Path, *extra: str) -> tuple[int, str]:
    result = await anyio.run_process(
        [sys.executable, "-m", "electric_sdk.cli.main", "verify", "--data", str(data_dir), *extra],
        check=False,
    )
    return result.returncode, result.stdout.decode()


async def send(
    stub: Stub, request: api.SignalEntityRequest
) -> api.SignalEntityResponse | grpc.aio.AioRpcError:
    try:
        response: api.SignalEntityResponse = await stub.SignalEntity(request)
    except grpc.aio.AioRpcError as exc:
        return exc
    return response


def plan() -> Iterator[tuple[str, api.SignalEntityRequest]]:
    """An endless, deterministic stream of keyed signals over the entities."""
    n = 0
    while True:
        ref = pb.EntityRef(type="crash", id=f"e{n % ENTITIES}")
        sig = pb.SIGNAL_SIGKILL if 100 <= n < 100 + KILLED else pb.SIGNAL_SIGUSR
        key = f"sig-{n}"
        yield key, api.SignalEntityRequest(ref=ref, signal=sig, reason=key, idempotency_key=key)
        n += 1


async def test_acknowledged_signals_survive_kill_9(server_process: Callable[..., Any]) -> None:
    srv = server_process()
    requests: dict[str, api.SignalEntityRequest] = {}
    acked: dict[str, api.SignalEntityResponse] = {}
    rejected: set[str] = set()
    unanswered: set[str] = set()  # sent, no answer: the server died under them
    stream = plan()
    crashed = False

    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        for i in range(ENTITIES):
            await stub.SpawnEntity(api.SpawnEntityRequest(ref=pb.EntityRef(type="crash", id=f"e{i}")))

        async def worker() -> None:
            nonlocal crashed
            while not crashed:
                key, request = next(stream)
                requests[key] = request
                result = await send(stub, request)
                if isinstance(result, grpc.aio.AioRpcError):
                    if result.code() == grpc.StatusCode.FAILED_PRECONDITION:
                        rejected.add(key)  # a signal to an entity already killed
                        continue
                    assert crashed, f"{result.code()} before the crash: {result.details()}"
                    assert result.code() == grpc.StatusCode.UNAVAILABLE, result
                    unanswered.add(key)
                    return
                acked[key] = result
                if len(acked) >= ACKS_BEFORE_CRASH and not crashed:
                    crashed = True
                    os.kill(srv.proc.pid, signal.SIGKILL)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(WORKERS):
                    tg.start_soon(worker)
    assert await anyio.to_thread.run_sync(srv.wait) == -signal.SIGKILL
    assert len(acked) >= ACKS_BEFORE_CRASH
    assert len(rejected) > 0
    assert {requests[k].ref.id for k in rejected} <= {f"e{i}" for i in range(KILLED)}

    # The crashed database replays clean as it is, before any restart.
    code, out = await verify(srv.data_dir, "--json")
    assert code == 0, out
    assert json.loads(out)["clean"] is True

    restarted = server_process(srv.data_dir)
    async with grpc.aio.insecure_channel(restarted.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        # Every acknowledged answer is still the answer: the idempotency record was durable with it.
        for key, response in acked.items():
            assert await stub.SignalEntity(requests[key]) == response, key
        # Retried unanswered requests apply at most once (or are replayed if they had committed).
        for key in sorted(unanswered):
            result = await send(stub, requests[key])
            if isinstance(result, grpc.aio.AioRpcError):
                assert result.code() == grpc.StatusCode.FAILED_PRECONDITION, result
            else:
                acked[key] = result
        for i in range(ENTITIES):
            ref = pb.EntityRef(type="crash", id=f"e{i}")
            page = await stub.ReadEvents(api.ReadEventsRequest(ref=ref, limit=1000))
            assert page.next_offset == page.head_offset, "read the whole stream"
            signals = {e.signal.reason: e for e in page.events if e.type == "signal"}
            mine = {k: r for k, r in acked.items() if requests[k].ref.id == ref.id}
            assert signals.keys() == mine.keys(), f"e{i}: lost or duplicated signals"
            assert len(signals) == sum(e.type == "signal" for e in page.events)
            for key, response in mine.items():
                event = signals[key]
                assert (event.key, event.headers.txid) == (response.key, response.txid), key
                assert event.signal.signal == requests[key].signal
            entity = (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity
            assert entity.state == (pb.STATE_KILLED if i < KILLED else pb.STATE_SPAWNING)
        code, out = await verify(restarted.data_dir, "--json")  # read-only, beside the live server
        assert code == 0, out
        report = json.loads(out)
        assert report["clean"] is True
        assert report["entities"] == ENTITIES
    restarted.send(signal.SIGTERM)
    assert await anyio.to_thread.run_sync(restarted.wait) == 0


async def test_verify_detects_a_tampered_database(start_server: StartServer) -> None:
    srv = await start_server()
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        for name in ("victim", "gap", "honest"):
            ref = pb.EntityRef(type="agent", id=name)
            await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref))
            await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGUSR))
            await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGINT))
    await srv.stop()
    data = srv.config.data_dir
    code, out = await verify(data, "--json")
    assert (code, json.loads(out)["clean"]) == (0, True)

    with closing(sqlite3.connect(srv.config.database)) as conn, conn:
        conn.execute("UPDATE entities SET state = 'running' WHERE type = 'agent' AND id = 'victim'")
        conn.execute("DELETE FROM events WHERE type = 'agent' AND id = 'gap' AND offset = 1")
    code, out = await verify(data, "--json")
    assert code == 1, out
    report = json.loads(out)
    assert report["clean"] is False
    assert set(report["mismatches"]) == {"/agent/victim", "/agent/gap"}
    assert report["mismatches"]["/agent/victim"] == ["state: stored running, replayed spawning"]
    assert any("offset gap" in problem for problem in report["mismatches"]["/agent/gap"])
    code, text = await verify(data)
    assert code == 1
    assert "/agent/victim: state: stored running, replayed spawning" in text
    assert "/agent/honest" not in text
    missing_code, _ = await verify(data / "nowhere")
    assert missing_code == 2
