"""Entity types starting with "." are reserved (issue 49: A2A's /.well-known/agent-card.json is
no entity): both doors refuse to make one, writing nothing; types made before the rule still
serve, and the server names them in a warning at start."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import httpx
import pytest
from conftest import StartServer
from electric_server.core import entity_writes
from electric_server.store.base import Write
from helpers import error_info

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]


async def test_both_doors_refuse_a_type_starting_with_a_dot(start_server: StartServer) -> None:
    srv = await start_server(http="127.0.0.1:0")
    assert srv.http is not None
    async with httpx.AsyncClient(base_url=srv.http.address) as http:
        answer = await http.put("/.well-known/agent-card.json")
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "RESERVED_NAME"
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.SpawnEntity(api.SpawnEntityRequest(ref=pb.EntityRef(type=".hidden", id="a")))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(refused.value).reason == "RESERVED_NAME"
        listed = await stub.ListEntities(api.ListEntitiesRequest())
    assert list(listed.entities) == []


async def test_a_type_made_before_the_rule_serves_and_is_warned_of(
    start_server: StartServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    srv = await start_server(tmp_path / "d")
    for ref in ((".old", "a"), (".old", "b"), (".older", "a"), ("plain", "a")):
        # As a server before the rule wrote it: the spawn's own write, without its check.
        await srv.store.write(Write(ref, entity_writes.spawn(ref, None, None)))
    await srv.stop(0)
    with caplog.at_level(logging.WARNING, logger="electric.server"):
        again = await start_server(tmp_path / "d")
    warned = [r.getMessage() for r in caplog.records if "reserved" in r.getMessage()]
    assert warned == ["entity types starting with '.' are reserved, no new one is made: ['.old', '.older']"]
    async with grpc.aio.insecure_channel(again.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        got = await stub.GetEntity(api.GetEntityRequest(ref=pb.EntityRef(type=".old", id="a")))
        assert got.entity.ref.type == ".old"
        sent = await stub.SendMessage(
            api.SendMessageRequest(ref=pb.EntityRef(type=".old", id="a"), text="hi")
        )
        assert sent.key


async def test_a_fork_of_a_type_made_before_the_rule_is_refused(start_server: StartServer) -> None:
    srv = await start_server()
    ref = (".old", "a")
    await srv.store.write(Write(ref, entity_writes.spawn(ref, None, None)))
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        for origin, code, reason in (
            (pb.EntityRef(type=".old", id="a"), grpc.StatusCode.INVALID_ARGUMENT, "RESERVED_NAME"),
            (pb.EntityRef(type=".none", id="a"), grpc.StatusCode.NOT_FOUND, "ENTITY_NOT_FOUND"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ForkEntity(api.ForkEntityRequest(origin=origin, id="b"))
            assert (refused.value.code(), error_info(refused.value).reason) == (code, reason)
        listed = await stub.ListEntities(api.ListEntitiesRequest())
    assert [(e.ref.type, e.ref.id) for e in listed.entities] == [(".old", "a")]
