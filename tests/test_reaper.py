"""The SIGTERM grace reaper: `stopping` → `stopped` (cause grace_expired) at the stored deadline.

Every wait is on the stream (WatchEvents until end_of_stream), never on a timer; the only
clock wait is the one the scenario is about: letting a deadline pass while no server runs.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeAlias

import anyio
import grpc
import pytest
from electric_server.app import ElectricServer
from electric_server.tools.verify import compare, replay
from google.protobuf import duration_pb2

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import State

pytestmark = pytest.mark.anyio

Stub: TypeAlias = "api_grpc.EntityServiceAsyncStub"
Seed = Callable[..., Awaitable[Any]]
StartServer = Callable[..., Awaitable[ElectricServer]]


def ms(ts: Any) -> int:
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def running(server: ElectricServer, stub: Stub, seed: Seed, id_: str, grace_ms: int) -> pb.EntityRef:
    ref = pb.EntityRef(type="agent", id=id_)
    grace = duration_pb2.Duration(seconds=grace_ms // 1000, nanos=grace_ms % 1000 * 1_000_000)
    await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref, profile=pb.Profile(grace_period=grace)))
    await seed(server.store, (ref.type, ref.id), State.RUNNING, cause="started")
    return ref


async def sigterm(stub: Stub, ref: pb.EntityRef) -> api.SignalEntityResponse:
    resp = await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGTERM))
    assert (resp.previous_state, resp.new_state) == (pb.STATE_RUNNING, pb.STATE_STOPPING)
    return resp


async def until_eof(stub: Stub, ref: pb.EntityRef, from_offset: int = 0) -> tuple[list[pb.Event], int]:
    """Every event from ``from_offset`` until the stream closes; (events, closed head)."""
    events: list[pb.Event] = []
    with anyio.fail_after(20):
        async for item in stub.WatchEvents(api.WatchEventsRequest(ref=ref, from_offset=from_offset)):
            if item.WhichOneof("item") == "end_of_stream":
                return events, item.end_of_stream.head_offset
            events.append(item.event)
    raise AssertionError("the watch ended without end_of_stream")


def check_expiry(stopping: pb.Event, stopped: pb.Event) -> int:
    """The server's grace-expiry record; returns the deadline."""
    assert stopping.state.state == pb.STATE_STOPPING
    deadline = ms(stopping.state.deadline)
    assert stopped.type == "state"
    assert (stopped.state.state, stopped.state.previous_state) == (pb.STATE_STOPPED, pb.STATE_STOPPING)
    assert (stopped.state.cause, stopped.state.signal_key) == ("grace_expired", "")
    assert ms(stopped.headers.timestamp) >= deadline, "written before the deadline"
    assert stopped.headers.txid > stopping.headers.txid
    return deadline


@pytest.mark.parametrize("via", ["sigterm", "seeded"])
async def test_grace_expiry_writes_stopped(
    server: ElectricServer, stub: Stub, seed_state: Seed, via: str
) -> None:
    ref = await running(server, stub, seed_state, f"short_{via}", grace_ms=50)
    if via == "sigterm":
        resp = await sigterm(stub, ref)
        expected_deadline = ms(resp.created_at) + 50
    else:  # straight into `stopping` through the store, as a runtime-less writer would
        expected_deadline = now_ms() + 50
        await seed_state(
            server.store, ("agent", ref.id), State.STOPPING, cause="seed", deadline_ms=expected_deadline
        )
    events, head = await until_eof(stub, ref)
    assert head == len(events)
    assert check_expiry(events[-2], events[-1]) == expected_deadline
    entity = (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity
    assert (entity.state, entity.closed, entity.head_offset) == (pb.STATE_STOPPED, True, head)
    assert not entity.HasField("stopping_deadline")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGKILL))
    assert caught.value.details() == "Cannot signal a stopped entity"
    if via == "sigterm":
        record = await server.store.get_entity(("agent", ref.id))
        assert record is not None
        assert compare(record, await replay(server.store, ("agent", ref.id))) == []


async def test_stored_deadline_equals_entity_deadline(
    server: ElectricServer, stub: Stub, seed_state: Seed
) -> None:
    ref = await running(server, stub, seed_state, "long", grace_ms=600_000)
    resp = await sigterm(stub, ref)
    entity = (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity
    events = (await stub.ReadEvents(api.ReadEventsRequest(ref=ref))).events
    assert events[-1].state.state == pb.STATE_STOPPING
    assert events[-1].headers.txid == resp.txid
    deadline = ms(resp.created_at) + 600_000
    assert ms(events[-1].state.deadline) == ms(entity.stopping_deadline) == deadline
    assert (entity.state, entity.closed) == (pb.STATE_STOPPING, False)


async def test_sigkill_before_the_deadline_wins(server: ElectricServer, stub: Stub, seed_state: Seed) -> None:
    target = await running(server, stub, seed_state, "target", grace_ms=400)
    canary = await running(server, stub, seed_state, "canary", grace_ms=400)
    term = await sigterm(stub, target)
    await sigterm(stub, canary)  # a deadline at or after the target's: the reaper reaches it later
    kill = await stub.SignalEntity(api.SignalEntityRequest(ref=target, signal=pb.SIGNAL_SIGKILL))
    assert (kill.previous_state, kill.new_state) == (pb.STATE_STOPPING, pb.STATE_KILLED)
    canary_events, _ = await until_eof(stub, canary)
    check_expiry(canary_events[-2], canary_events[-1])
    # The canary was reaped, so the target's deadline has been handled too: it stays killed.
    events = (await stub.ReadEvents(api.ReadEventsRequest(ref=target))).events
    assert [(e.type, e.headers.txid) for e in events[-4:]] == [
        ("signal", term.txid),
        ("state", term.txid),
        ("signal", kill.txid),
        ("state", kill.txid),
    ]
    assert events[-1].state.state == pb.STATE_KILLED
    assert all(e.state.cause != "grace_expired" for e in events if e.type == "state")
    entity = (await stub.GetEntity(api.GetEntityRequest(ref=target))).entity
    assert (entity.state, entity.closed, entity.head_offset) == (pb.STATE_KILLED, True, len(events))


@asynccontextmanager
async def connect(server: ElectricServer) -> AsyncIterator[Stub]:
    async with grpc.aio.insecure_channel(server.address) as channel:
        yield api_grpc.EntityServiceStub(channel)


@pytest.mark.parametrize("passed_while_down", [True, False], ids=["passed-while-down", "still-ahead"])
async def test_deadline_survives_a_restart(
    start_server: StartServer, seed_state: Seed, passed_while_down: bool
) -> None:
    first = await start_server()
    async with connect(first) as stub:
        ref = await running(first, stub, seed_state, "restart", grace_ms=300)
        resp = await sigterm(stub, ref)
    deadline = ms(resp.created_at) + 300
    await first.stop()
    assert now_ms() < deadline, "setup too slow: the first server outlived the deadline"
    if passed_while_down:
        # Wall-clock time is the subject here: no server runs while the deadline passes.
        await anyio.sleep_until(anyio.current_time() + (deadline - now_ms() + 2) / 1000)
        assert now_ms() > deadline
    restarted_at = now_ms()
    second = await start_server(data_dir=first.config.data_dir)
    async with connect(second) as stub:
        events, head = await until_eof(stub, ref)
    assert events[-2].headers.txid == resp.txid
    assert check_expiry(events[-2], events[-1]) == deadline
    assert ms(events[-1].headers.timestamp) >= restarted_at, "stopped must be written by the new server"
    assert head == len(events)
