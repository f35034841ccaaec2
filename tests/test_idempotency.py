"""Idempotency keys (ARCHITECTURE §7): a retry returns the first response and appends nothing.

Keys are scoped to the entity, checked before anything else (a retried SIGKILL gets its
first result, not INVALID_SIGNAL), and survive a restart on the same data directory. The
same key with a different request is INVALID_ARGUMENT / IDEMPOTENCY_KEY_REUSED.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeAlias

import grpc
import pytest
from electric_server.app import ElectricServer
from google.protobuf import duration_pb2
from helpers import error_info

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb

# Idempotency is the store's: every case runs on both stores.
pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]

Stub: TypeAlias = "api_grpc.EntityServiceAsyncStub"
StartServer = Callable[..., Awaitable[ElectricServer]]
REF = pb.EntityRef(type="agent", id="a1")


async def snapshot(server: ElectricServer, stub: Stub, *refs: pb.EntityRef) -> tuple[Any, ...]:
    """Everything a write would change: each entity, its events, and the global txid."""
    parts: list[Any] = [await server.store.head_txid()]
    for ref in refs:
        entity = (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity
        events = (await stub.ReadEvents(api.ReadEventsRequest(ref=ref, limit=1000))).events
        parts.append((entity.SerializeToString(deterministic=True), [e.SerializeToString() for e in events]))
    return tuple(parts)


async def spawn(stub: Stub, ref: pb.EntityRef = REF) -> None:
    await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref))


async def test_signal_retry_returns_first_response(server: ElectricServer, stub: Stub) -> None:
    await spawn(stub)
    request = api.SignalEntityRequest(ref=REF, signal=pb.SIGNAL_SIGUSR, reason="r", idempotency_key="k1")
    first = await stub.SignalEntity(request)
    before = await snapshot(server, stub, REF)
    retry = await stub.SignalEntity(request)
    assert retry.SerializeToString(deterministic=True) == first.SerializeToString(deterministic=True)
    assert await snapshot(server, stub, REF) == before
    # Without the key the same request is a new signal: the replay above is what saved it.
    fresh = await stub.SignalEntity(api.SignalEntityRequest(ref=REF, signal=pb.SIGNAL_SIGUSR, reason="r"))
    assert fresh.txid > first.txid
    assert fresh.key != first.key


async def test_concurrent_retries_apply_once(server: ElectricServer, stub: Stub) -> None:
    await spawn(stub)
    request = api.SignalEntityRequest(ref=REF, signal=pb.SIGNAL_SIGHUP, idempotency_key="burst")
    responses = await asyncio.gather(*(stub.SignalEntity(request) for _ in range(20)))
    assert len({r.SerializeToString(deterministic=True) for r in responses}) == 1
    events = (await stub.ReadEvents(api.ReadEventsRequest(ref=REF))).events
    assert [e.type for e in events] == ["state", "signal"]


async def test_retried_sigkill_returns_first_result(server: ElectricServer, stub: Stub) -> None:
    await spawn(stub)
    request = api.SignalEntityRequest(ref=REF, signal=pb.SIGNAL_SIGKILL, idempotency_key="kill-1")
    first = await stub.SignalEntity(request)
    assert first.new_state == pb.STATE_KILLED
    before = await snapshot(server, stub, REF)
    retry = await stub.SignalEntity(request)
    assert retry == first
    assert await snapshot(server, stub, REF) == before
    with pytest.raises(grpc.aio.AioRpcError) as caught:  # a new key is judged afresh
        await stub.SignalEntity(
            api.SignalEntityRequest(ref=REF, signal=pb.SIGNAL_SIGKILL, idempotency_key="kill-2")
        )
    assert error_info(caught.value).reason == "INVALID_SIGNAL"


async def test_spawn_retry_returns_first_response(server: ElectricServer, stub: Stub) -> None:
    grace = duration_pb2.Duration(nanos=50_000_000)
    request = api.SpawnEntityRequest(ref=REF, profile=pb.Profile(grace_period=grace), idempotency_key="s1")
    first = await stub.SpawnEntity(request)
    await stub.SignalEntity(api.SignalEntityRequest(ref=REF, signal=pb.SIGNAL_SIGUSR))
    before = await snapshot(server, stub, REF)
    retry = await stub.SpawnEntity(request)
    assert retry == first  # the first answer (head_offset 1), not the entity as it is now
    assert retry.entity.head_offset == 1
    assert await snapshot(server, stub, REF) == before
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=REF, profile=request.profile))
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_send_message_retry_returns_first_response(server: ElectricServer, stub: Stub) -> None:
    await spawn(stub)
    request = api.SendMessageRequest(ref=REF, text="hello", idempotency_key="m1")
    first = await stub.SendMessage(request)
    before = await snapshot(server, stub, REF)
    assert await stub.SendMessage(request) == first
    assert await snapshot(server, stub, REF) == before
    events = (await stub.ReadEvents(api.ReadEventsRequest(ref=REF))).events
    assert [e.type for e in events] == ["state", "message"]
    assert (events[1].key, events[1].offset, events[1].headers.txid) == (first.key, first.offset, first.txid)


async def test_delete_retry_returns_first_response(server: ElectricServer, stub: Stub) -> None:
    await spawn(stub)
    request = api.DeleteEntityRequest(ref=REF, idempotency_key="d1")
    first = await stub.DeleteEntity(request)
    assert first.result.new_state == pb.STATE_KILLED
    before = await snapshot(server, stub, REF)
    assert await stub.DeleteEntity(request) == first
    assert await snapshot(server, stub, REF) == before


async def test_signal_entities_retry_returns_first_response(server: ElectricServer, stub: Stub) -> None:
    refs = [pb.EntityRef(type="fleet", id=f"e{i}") for i in range(3)]
    for ref in refs:
        await spawn(stub, ref)
    request = api.SignalEntitiesRequest(
        selector=api.EntitySelector(type="fleet"), signal=pb.SIGNAL_SIGUSR, idempotency_key="bulk-1"
    )
    first = await stub.SignalEntities(request)
    assert (first.signalled, first.ignored) == (0, 3)
    newcomer = pb.EntityRef(type="fleet", id="late")
    await spawn(stub, newcomer)
    before = await snapshot(server, stub, *refs, newcomer)
    retry = await stub.SignalEntities(request)
    assert retry == first  # same counts and created_at; the newcomer is not signalled
    assert await snapshot(server, stub, *refs, newcomer) == before
    # Concurrent duplicates also collapse to the first answer, one record per entity.
    again = api.SignalEntitiesRequest(
        selector=api.EntitySelector(type="fleet"), signal=pb.SIGNAL_SIGHUP, idempotency_key="bulk-2"
    )
    answers = await asyncio.gather(*(stub.SignalEntities(again) for _ in range(5)))
    assert len({a.SerializeToString(deterministic=True) for a in answers}) == 1
    for ref in [*refs, newcomer]:
        events = (await stub.ReadEvents(api.ReadEventsRequest(ref=ref))).events
        assert [e.signal.signal for e in events if e.type == "signal"].count(pb.SIGNAL_SIGHUP) == 1


async def expect_reused(
    server: ElectricServer, stub: Stub, call: Awaitable[Any], *refs: pb.EntityRef
) -> None:
    before = await snapshot(server, stub, *refs)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(caught.value)
    assert (info.reason, info.domain) == ("IDEMPOTENCY_KEY_REUSED", "electric.v1")
    assert await snapshot(server, stub, *refs) == before


async def test_same_key_different_body_is_refused(server: ElectricServer, stub: Stub) -> None:
    await stub.SpawnEntity(api.SpawnEntityRequest(ref=REF, idempotency_key="k"))
    other_profile = pb.Profile(grace_period=duration_pb2.Duration(seconds=5))
    await expect_reused(
        server,
        stub,
        stub.SpawnEntity(api.SpawnEntityRequest(ref=REF, profile=other_profile, idempotency_key="k")),
        REF,
    )
    await stub.SignalEntity(api.SignalEntityRequest(ref=REF, signal=pb.SIGNAL_SIGUSR, idempotency_key="s"))
    for changed in (
        api.SignalEntityRequest(ref=REF, signal=pb.SIGNAL_SIGKILL, idempotency_key="s"),
        api.SignalEntityRequest(ref=REF, signal=pb.SIGNAL_SIGUSR, reason="other", idempotency_key="s"),
    ):
        await expect_reused(server, stub, stub.SignalEntity(changed), REF)
    await stub.SendMessage(api.SendMessageRequest(ref=REF, text="one", idempotency_key="m"))
    await expect_reused(
        server, stub, stub.SendMessage(api.SendMessageRequest(ref=REF, text="two", idempotency_key="m")), REF
    )
    # Another method with the same key on the same entity is a different request too.
    await expect_reused(
        server, stub, stub.DeleteEntity(api.DeleteEntityRequest(ref=REF, idempotency_key="s")), REF
    )
    selector = api.EntitySelector(type="agent")
    await stub.SignalEntities(
        api.SignalEntitiesRequest(selector=selector, signal=pb.SIGNAL_SIGHUP, idempotency_key="b")
    )
    await expect_reused(
        server,
        stub,
        stub.SignalEntities(
            api.SignalEntitiesRequest(selector=selector, signal=pb.SIGNAL_SIGINT, idempotency_key="b")
        ),
        REF,
    )


async def test_keys_are_scoped_per_entity(server: ElectricServer, stub: Stub) -> None:
    one, two = pb.EntityRef(type="agent", id="one"), pb.EntityRef(type="agent", id="two")
    for ref in (one, two):
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref, idempotency_key="spawn"))
    a = await stub.SignalEntity(
        api.SignalEntityRequest(ref=one, signal=pb.SIGNAL_SIGKILL, idempotency_key="same")
    )
    b = await stub.SignalEntity(
        api.SignalEntityRequest(ref=two, signal=pb.SIGNAL_SIGKILL, idempotency_key="same")
    )
    assert (a.url, b.url) == ("/agent/one", "/agent/two")
    assert a.txid != b.txid
    for ref in (one, two):
        entity = (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity
        assert (entity.state, entity.head_offset) == (pb.STATE_KILLED, 3)


@asynccontextmanager
async def connect(server: ElectricServer) -> AsyncIterator[Stub]:
    async with grpc.aio.insecure_channel(server.address) as channel:
        yield api_grpc.EntityServiceStub(channel)


async def test_keys_survive_a_restart(start_server: StartServer) -> None:
    first_server = await start_server()
    signal = api.SignalEntityRequest(ref=REF, signal=pb.SIGNAL_SIGTERM, idempotency_key="t1")
    bulk = api.SignalEntitiesRequest(
        selector=api.EntitySelector(refs=[REF]), signal=pb.SIGNAL_SIGUSR, idempotency_key="b1"
    )
    async with connect(first_server) as stub:
        spawned = await stub.SpawnEntity(api.SpawnEntityRequest(ref=REF, idempotency_key="spawn"))
        signalled = await stub.SignalEntity(signal)
        bulked = await stub.SignalEntities(bulk)
    await first_server.stop()

    second_server = await start_server(data_dir=first_server.config.data_dir)
    async with connect(second_server) as stub:
        before = await snapshot(second_server, stub, REF)
        assert await stub.SpawnEntity(api.SpawnEntityRequest(ref=REF, idempotency_key="spawn")) == spawned
        assert await stub.SignalEntity(signal) == signalled
        assert await stub.SignalEntities(bulk) == bulked
        assert await snapshot(second_server, stub, REF) == before
        changed = api.SignalEntityRequest(ref=REF, signal=pb.SIGNAL_SIGKILL, idempotency_key="t1")
        await expect_reused(second_server, stub, stub.SignalEntity(changed), REF)
