"""Strings a worker sends that would become the store's keys, on both stores: a NUL (which
PostgreSQL's text cannot hold), a control character, a value longer than an index row. Each gets
its own clear refusal and writes nothing, never INTERNAL, and SQLite answers as PostgreSQL does."""

from __future__ import annotations

import anyio
import grpc
import pytest
from conftest import StartServer
from helpers import error_info
from test_runtime_protocol import RawWorker, events, read_to_end, running

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import types_pb2 as pb

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]


@pytest.mark.parametrize(
    ("version", "types", "reason"),
    [
        ("v\x00", ["agent"], "INVALID_CODE_VERSION"),
        ("v\n1", ["agent"], "INVALID_CODE_VERSION"),
        ("v" * 129, ["agent"], "INVALID_CODE_VERSION"),
        ("v1", [f"t{i}" for i in range(1001)], "TOO_MANY_TYPES"),
        ("v1", ["agent", "tool", "agent"], "DUPLICATE_TYPE"),
    ],
    ids=["nul", "newline", "129-chars", "1001-types", "a-type-twice"],
)
async def test_a_hello_the_store_could_not_key_is_refused(
    start_server: StartServer, version: str, types: list[str], reason: str
) -> None:
    server = await start_server(lease_ttl_ms=10_000, heartbeat_interval_ms=50)
    async with grpc.aio.insecure_channel(server.address) as channel:
        worker = RawWorker(channel, "w-hostile", types, version=version, heartbeats=False)
        with anyio.fail_after(10), pytest.raises(grpc.aio.AioRpcError) as caught:
            await read_to_end(worker.call)
        worker.requests.put_nowait(None)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(caught.value).reason == reason
        listed = await api_grpc.EntityServiceStub(channel).ListWorkers(api.ListWorkersRequest())
        assert list(listed.workers) == []  # no session was opened for it


async def test_the_longest_code_version_and_most_types_are_taken(start_server: StartServer) -> None:
    """The limits' edges: 128 characters (any printable ones) and 1,000 types."""
    server = await start_server(lease_ttl_ms=10_000, heartbeat_interval_ms=50)
    async with grpc.aio.insecure_channel(server.address) as channel:
        version = "é" * 127 + "x"
        worker = RawWorker(channel, "w-edge", [f"t{i}" for i in range(1000)], version=version)
        assert (await worker.next("welcome")) is not None
        listed = await api_grpc.EntityServiceStub(channel).ListWorkers(api.ListWorkersRequest())
        assert [(w.code_version, len(w.types)) for w in listed.workers] == [(version, 1000)]
        worker.close()


@pytest.mark.parametrize(
    "kind",
    ["a\x00b", "a\nb", "\x7f", "x" * 129, "", "state"],
    ids=["nul", "newline", "del", "129", "empty", "builtin"],
)
async def test_a_custom_event_type_the_store_could_not_key_is_refused(
    start_server: StartServer, kind: str
) -> None:
    """Refused with INVALID_EVENT_TYPE, nothing written, and the session goes on: the worker's
    next write applies."""
    server = await start_server(lease_ttl_ms=10_000, heartbeat_interval_ms=50)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w-custom", ["agent"])
        ref, lease = await running(stub, worker, "c1")
        before = await events(stub, ref)
        data = {"custom": rt.CustomEvent(type=kind)}
        refused = await worker.write(ref, lease.epoch, pb.STATE_RUNNING, **data)
        assert (refused.applied, refused.reason) == (False, "INVALID_EVENT_TYPE")
        assert await events(stub, ref) == before
        fine = await worker.write(
            ref, lease.epoch, pb.STATE_RUNNING, custom=rt.CustomEvent(type="tool.call é")
        )
        assert fine.applied, fine
        assert [e.type for e in await events(stub, ref)] == [*(e.type for e in before), "tool.call é"]
        worker.close()


@pytest.mark.parametrize("key", ["msg_1\x00", "m" * 129, "msg 1"], ids=["nul", "129", "space"])
async def test_a_run_naming_a_message_key_no_message_has_ends_the_session(
    start_server: StartServer, key: str
) -> None:
    """A run's message key is the server's own (``msg_N``), echoed: one that is not a key's name
    is a broken worker, whose session ends with INVALID_ARGUMENT; only its end is written."""
    server = await start_server(lease_ttl_ms=10_000, heartbeat_interval_ms=50)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w-run", ["agent"])
        ref, lease = await running(stub, worker, "r1")
        await stub.SendMessage(api.SendMessageRequest(ref=ref, text="hi"))
        delivery = await worker.next("delivery")
        before = await events(stub, ref)
        worker.stop_heartbeats()
        run = pb.RunValue(message_key=key, status=pb.RUN_STATUS_STARTED, message_offset=delivery.event.offset)
        worker.requests.put_nowait(
            rt.ConnectRequest(
                write=rt.RuntimeWrite(
                    request_id=99, ref=ref, epoch=lease.epoch, expect_state=pb.STATE_RUNNING, run=run
                )
            )
        )
        with anyio.fail_after(10), pytest.raises(grpc.aio.AioRpcError) as caught:
            await read_to_end(worker.call)
        worker.requests.put_nowait(None)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(caught.value).reason == "INVALID_NAME"
        after = await events(stub, ref)
        assert after[: len(before)] == before
        assert [(e.type, e.state.cause) for e in after[len(before) :]] == [("state", "runtime_lost")]


async def test_a_run_started_past_every_message_is_refused_and_skips_none(start_server: StartServer) -> None:
    """A run may start only where a message waits: one past the newest would move the cursor over
    the real ones, never run. Refused with INVALID_MESSAGE_OFFSET, nothing written; the message
    still runs."""
    server = await start_server(lease_ttl_ms=10_000, heartbeat_interval_ms=50)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w-offset", ["agent"])
        ref, lease = await running(stub, worker, "o1")
        await stub.SendMessage(api.SendMessageRequest(ref=ref, text="hi"))
        delivery = await worker.next("delivery")
        await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGUSR, reason="after"))
        head = (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity.head_offset
        before = await events(stub, ref)
        key, offset = delivery.event.key, delivery.event.offset
        for bogus in (offset + 1, head, head + 1000):  # a signal's offset, the head, far past it
            run = pb.RunValue(message_key=key, status=pb.RUN_STATUS_STARTED, message_offset=bogus)
            refused = await worker.write(ref, lease.epoch, pb.STATE_RUNNING, run=run)
            assert (refused.applied, refused.reason) == (False, "INVALID_MESSAGE_OFFSET"), bogus
        assert await events(stub, ref) == before
        run = pb.RunValue(message_key=key, status=pb.RUN_STATUS_STARTED, message_offset=offset)
        started = await worker.write(ref, lease.epoch, pb.STATE_RUNNING, run=run)
        assert started.applied, started
        worker.close()
