"""The standard gRPC health and reflection services, as grpcurl and load balancers use them.

Reflection answers under both of its names, v1 and v1alpha; tests/test_grpc_tools.py
drives them with the real buf binary.
"""

from __future__ import annotations

import logging
from types import ModuleType

import anyio
import grpc
import pytest
from electric_server.app import RUNTIME_SERVICE_NAME, SERVICE_NAME, WRITES_HEALTH_NAME, ElectricServer
from electric_server.grpc.handlers import guard_server
from google.protobuf import descriptor_pb2
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers import error_info

from electric_sdk._proto.grpc.reflection.v1 import reflection_pb2 as reflection_v1
from electric_sdk._proto.grpc.reflection.v1 import reflection_pb2_grpc as reflection_v1_grpc

pytestmark = pytest.mark.anyio

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# Each protocol's messages and stub: the same test runs under both names.
PROTOCOLS = {
    "v1": (reflection_v1, reflection_v1_grpc),
    "v1alpha": (reflection_pb2, reflection_pb2_grpc),
}


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


async def health_list(channel: grpc.aio.Channel) -> dict[str, int]:
    reply = await health_pb2_grpc.HealthStub(channel).List(health_pb2.HealthListRequest(), timeout=10)
    return {name: answer.status for name, answer in reply.statuses.items()}


async def test_health_list_names_every_service(channel: grpc.aio.Channel) -> None:
    assert await health_list(channel) == dict.fromkeys(
        ("", SERVICE_NAME, RUNTIME_SERVICE_NAME, WRITES_HEALTH_NAME), SERVING
    )


async def test_health_list_follows_what_check_answers(
    server: ElectricServer, channel: grpc.aio.Channel
) -> None:
    """List is Check for every name at once: after a change, and after the shutdown that ends
    all changes (the server makes both through the servicer, as here)."""
    check = health_pb2_grpc.HealthStub(channel).Check

    async def checked(names: list[str]) -> dict[str, int]:
        return {n: (await check(health_pb2.HealthCheckRequest(service=n))).status for n in names}

    await server.health.set(WRITES_HEALTH_NAME, NOT_SERVING)  # what a full disk does
    listed = await health_list(channel)
    assert listed[WRITES_HEALTH_NAME] == NOT_SERVING
    assert listed == await checked(list(listed))

    await server.health.enter_graceful_shutdown()
    await server.health.set(SERVICE_NAME, SERVING)  # ignored from now on, by Check and List alike
    listed = await health_list(channel)
    assert listed == dict.fromkeys(listed, NOT_SERVING)
    assert listed == await checked(list(listed))


async def reflect(
    channel: grpc.aio.Channel, protocol: str, **request: str
) -> reflection_pb2.ServerReflectionResponse:
    """One answer of reflection under ``protocol``'s name, as a v1alpha message either way."""
    messages, stubs = PROTOCOLS[protocol]
    call = stubs.ServerReflectionStub(channel).ServerReflectionInfo()
    await call.write(messages.ServerReflectionRequest(**request))
    answer = await call.read()
    await call.done_writing()
    return reflection_pb2.ServerReflectionResponse.FromString(answer.SerializeToString())


def described(
    answer: reflection_pb2.ServerReflectionResponse,
) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in answer.file_descriptor_response.file_descriptor_proto
    ]
    return {f.name: f for f in files}


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_reflection_lists_services(channel: grpc.aio.Channel, protocol: str) -> None:
    answer = await reflect(channel, protocol, list_services="")
    assert [s.name for s in answer.list_services_response.service] == [
        "electric.v1.EntityService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_reflection_describes_entity_service(channel: grpc.aio.Channel, protocol: str) -> None:
    answer = await reflect(channel, protocol, file_containing_symbol="electric.v1.EntityService")
    service = described(answer)["electric/v1/entity_service.proto"].service[0]
    assert service.name == "EntityService"
    assert {"SpawnEntity", "SignalEntity", "WatchEvents"} <= {m.name for m in service.method}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    "symbol", ["grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"]
)
async def test_reflection_describes_itself_under_both_names(
    channel: grpc.aio.Channel, protocol: str, symbol: str
) -> None:
    """What it lists it can describe: a tool resolves every listed service."""
    answer = await reflect(channel, protocol, file_containing_symbol=symbol)
    package = symbol.rsplit(".", 1)[0]
    (file,) = [f for f in described(answer).values() if f.package == package]
    assert [s.name for s in file.service] == ["ServerReflection"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_reflection_serves_the_error_details(channel: grpc.aio.Channel, protocol: str) -> None:
    """Every error's ErrorInfo detail resolves by name and by file, for tools that decode it."""
    by_symbol = described(await reflect(channel, protocol, file_containing_symbol="google.rpc.ErrorInfo"))
    by_file = described(await reflect(channel, protocol, file_by_filename="google/rpc/error_details.proto"))
    assert by_symbol == by_file
    file = by_symbol["google/rpc/error_details.proto"]
    assert file == descriptor_pb2.FileDescriptorProto.FromString(error_details_pb2.DESCRIPTOR.serialized_pb)
    assert "ErrorInfo" in [m.name for m in file.message_type]


def test_reflection_v1_is_v1alpha_renamed() -> None:
    """Why one servicer answers both names: v1's messages are v1alpha's, field for field."""

    def shape(module: ModuleType) -> descriptor_pb2.FileDescriptorProto:
        file = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        package = file.package
        for message in file.message_type:
            for f in message.field:
                f.type_name = f.type_name.replace(f".{package}.", ".")
        for service in file.service:
            for m in service.method:
                m.input_type = m.input_type.replace(f".{package}.", ".")
                m.output_type = m.output_type.replace(f".{package}.", ".")
        return descriptor_pb2.FileDescriptorProto(message_type=file.message_type, service=file.service)

    assert shape(reflection_v1) == shape(reflection_pb2)


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
