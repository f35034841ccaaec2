"""The standard gRPC health and reflection services, as grpcurl and load balancers use them."""

from __future__ import annotations

import logging

import anyio
import grpc
import pytest
from electric_server.app import ElectricServer
from electric_server.handlers import guard_server
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers import error_info

pytestmark = pytest.mark.anyio

SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("service", ["", "electric.v1.EntityService"])
async def test_health_check_serving(channel: grpc.aio.Channel, service: str) -> None:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service))
    assert reply.status == SERVING


async def test_health_check_unknown_service_not_found(channel: grpc.aio.Channel) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="nope.Svc"))
    assert info.value.code() is grpc.StatusCode.NOT_FOUND


async def test_health_not_serving_once_draining(server: ElectricServer) -> None:
    async with grpc.aio.insecure_channel(server.address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        watch = stub.Watch(health_pb2.HealthCheckRequest(service="electric.v1.EntityService"))
        assert (await watch.read()).status == SERVING
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                # The drain waits for in-flight calls (this watch) up to its grace.
                tg.start_soon(server.stop, 10.0)
                assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
                watch.cancel()


async def reflect(
    channel: grpc.aio.Channel, *requests: reflection_pb2.ServerReflectionRequest
) -> list[reflection_pb2.ServerReflectionResponse]:
    call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo()
    answers = []
    for request in requests:
        await call.write(request)
        answers.append(await call.read())
    await call.done_writing()
    return answers


async def test_reflection_lists_services(channel: grpc.aio.Channel) -> None:
    (answer,) = await reflect(channel, reflection_pb2.ServerReflectionRequest(list_services=""))
    names = {s.name for s in answer.list_services_response.service}
    assert {
        "electric.v1.EntityService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= names


async def test_reflection_describes_entity_service(channel: grpc.aio.Channel) -> None:
    (answer,) = await reflect(
        channel, reflection_pb2.ServerReflectionRequest(file_containing_symbol="electric.v1.EntityService")
    )
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in answer.file_descriptor_response.file_descriptor_proto
    ]
    by_name = {f.name: f for f in files}
    service = by_name["electric/v1/entity_service.proto"].service[0]
    assert service.name == "EntityService"
    assert {"SpawnEntity", "SignalEntity", "WatchEvents"} <= {m.name for m in service.method}


async def test_an_unimplemented_method_answers_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """A generated servicer's stub, not overridden (as Health/List was), answers UNIMPLEMENTED
    with its reason, and logs nothing: grpc would log its NotImplementedError's traceback."""
    server = grpc.aio.server()
    guard_server(server)
    health_pb2_grpc.add_HealthServicer_to_server(health_pb2_grpc.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with caplog.at_level(logging.DEBUG):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as unary:
                    await stub.List(health_pb2.HealthListRequest(), timeout=10)
                with pytest.raises(grpc.aio.AioRpcError) as streamed:
                    await stub.Watch(health_pb2.HealthCheckRequest(), timeout=10).read()
    finally:
        await server.stop(None)
    for info, method in ((unary.value, "List"), (streamed.value, "Watch")):
        assert info.code() is grpc.StatusCode.UNIMPLEMENTED
        reason = error_info(info)
        assert reason.reason == "METHOD_NOT_IMPLEMENTED"
        assert reason.metadata["method"] == f"/grpc.health.v1.Health/{method}"
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []
