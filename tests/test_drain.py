"""Our own process on SIGTERM/SIGINT (ARCHITECTURE §5): drain, exit 0; a second signal exits at once.

A real `electric server` process. Draining is observed through the standard health
service (grpc.health.v1 Watch goes NOT_SERVING) and through an open WatchEvents that ends
with UNAVAILABLE / SERVER_DRAINING. An open Health.Watch is itself an in-flight call, so
while a test holds one the drain waits for it (up to --drain-grace): that makes "a second
signal during the drain" deterministic without any timing.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any, TypeAlias

import anyio
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import error_info

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb

pytestmark = pytest.mark.anyio

Stub: TypeAlias = "api_grpc.EntityServiceAsyncStub"

ServerProcessFactory = Callable[..., Any]
REF = pb.EntityRef(type="agent", id="durable")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def write_some(stub: Stub) -> tuple[bytes, list[bytes]]:
    """Spawn and signal REF; returns its entity and events, serialized, for comparison later."""
    await stub.SpawnEntity(api.SpawnEntityRequest(ref=REF))
    for _ in range(3):
        await stub.SignalEntity(api.SignalEntityRequest(ref=REF, signal=pb.SIGNAL_SIGUSR, reason="before"))
    return await state_of(stub)


async def state_of(stub: Stub) -> tuple[bytes, list[bytes]]:
    entity = (await stub.GetEntity(api.GetEntityRequest(ref=REF))).entity
    events = (await stub.ReadEvents(api.ReadEventsRequest(ref=REF))).events
    return entity.SerializeToString(deterministic=True), [
        e.SerializeToString(deterministic=True) for e in events
    ]


async def check_intact(
    server_process: ServerProcessFactory, data_dir: Any, expected: tuple[bytes, list[bytes]]
) -> None:
    """Restart on the same data: the entity and its stream are exactly as acknowledged."""
    again = server_process(data_dir)
    async with grpc.aio.insecure_channel(again.address) as channel:
        assert await state_of(api_grpc.EntityServiceStub(channel)) == expected
    again.send(signal.SIGTERM)
    assert await anyio.to_thread.run_sync(again.wait) == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: signal.Signals(s).name)
async def test_signal_drains_and_exits_zero(server_process: ServerProcessFactory, signum: int) -> None:
    srv = server_process()
    with anyio.fail_after(30):
        async with grpc.aio.insecure_channel(srv.address) as channel:
            stub = api_grpc.EntityServiceStub(channel)
            before = await write_some(stub)
            health = health_pb2_grpc.HealthStub(channel)
            overall = health.Watch(health_pb2.HealthCheckRequest(service=""))
            entity_service = health.Watch(health_pb2.HealthCheckRequest(service="electric.v1.EntityService"))
            for watch in (overall, entity_service):
                assert (await watch.read()).status == SERVING
            events = stub.WatchEvents(api.WatchEventsRequest(ref=REF))
            for offset in range(4):  # caught up: now following the live tail
                item = await events.read()
                assert isinstance(item, api.WatchEventsResponse)
                assert item.event.offset == offset

            srv.send(signum)
            for watch in (overall, entity_service):
                assert (await watch.read()).status == NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await events.read()
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert error_info(caught.value).reason == "SERVER_DRAINING"
            # No new calls are accepted while draining.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetEntity(api.GetEntityRequest(ref=REF), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            # Our open health watches are the last in-flight calls; ending them lets the drain finish.
            overall.cancel()
            entity_service.cancel()
        assert await anyio.to_thread.run_sync(srv.wait) == 0
    assert srv.proc.stdout is not None
    log = srv.proc.stdout.read()
    assert f"received {signal.Signals(signum).name}: draining" in log
    assert "electric server stopped" in log
    await check_intact(server_process, srv.data_dir, before)


@pytest.mark.parametrize(
    ("first", "second"),
    [(signal.SIGTERM, signal.SIGTERM), (signal.SIGINT, signal.SIGINT), (signal.SIGTERM, signal.SIGINT)],
    ids=lambda s: signal.Signals(s).name,
)
async def test_second_signal_while_draining_exits_at_once(
    server_process: ServerProcessFactory, first: int, second: int
) -> None:
    # A drain grace far longer than the test's bound: only the second signal can end it in time.
    srv = server_process(None, "--drain-grace", "300s")
    with anyio.fail_after(30):
        async with grpc.aio.insecure_channel(srv.address) as channel:
            before = await write_some(api_grpc.EntityServiceStub(channel))
            held = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await held.read()).status == SERVING
            srv.send(first)
            assert (await held.read()).status == NOT_SERVING  # draining, held open by this very call
            assert srv.proc.poll() is None
            srv.send(second)
            assert await anyio.to_thread.run_sync(srv.wait) == 128 + second
    # Acknowledged writes were durable before the hard exit.
    await check_intact(server_process, srv.data_dir, before)
