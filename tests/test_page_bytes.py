"""Pages bounded in bytes as well as in count (issue 18, point 6): 100 events of 64 KiB were a
6.5 MB ReadEvents page, more than a gRPC client with the default 4 MiB receive limit takes."""

from __future__ import annotations

import grpc
import pytest
from conftest import StartServer

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.limits import CHANNEL_OPTIONS, PAGE_BYTES, RECEIVE_LIMIT_BYTES
from electric_sdk.client import AsyncClient

pytestmark = pytest.mark.anyio

REF = pb.EntityRef(type="agent", id="big")
TEXT = "x" * (64 * 1024)  # the largest message text


async def test_a_page_of_large_events_fits_a_default_client(start_server: StartServer) -> None:
    server = await start_server()
    # A bare channel with gRPC's default receive limit, as any generated client has.
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=REF))
        for _ in range(100):
            await stub.SendMessage(api.SendMessageRequest(ref=REF, text=TEXT))
        offsets: list[int] = []
        offset, pages = 0, 0
        while True:
            page = await stub.ReadEvents(api.ReadEventsRequest(ref=REF, from_offset=offset, limit=1000))
            assert page.ByteSize() <= PAGE_BYTES + 70 * 1024  # the bound, plus the one that crossed it
            assert page.events or page.next_offset == page.head_offset
            offsets.extend(e.offset for e in page.events)
            pages += 1
            if page.next_offset == page.head_offset:
                break
            offset = page.next_offset
        assert offsets == list(range(101))  # the spawn's state event and 100 messages
        assert pages > 6  # ~6.5 MB in pages of at most ~1 MiB

        # A watch that takes batches gets them bounded the same way.
        call = stub.WatchEvents(api.WatchEventsRequest(ref=REF, accepts_batches=True))
        watched: list[int] = []
        async for item in call:
            assert item.ByteSize() <= PAGE_BYTES + 70 * 1024
            watched.extend(e.offset for e in item.events.events)
            if watched[-1] == 100:
                break
        call.cancel()
        assert watched == list(range(101))


async def test_one_event_larger_than_a_page_still_comes_alone(start_server: StartServer) -> None:
    """At least one event per page: the page's byte bound never stalls a reader."""
    server = await start_server()
    async with AsyncClient(server.address) as client:
        await client.spawn("agent/big")
        big = {"blob": "y" * (60 * 1024)}
        for _ in range(20):
            await client.send("agent/big", TEXT, data=big)
        page = await client.events("agent/big", 1, limit=1000)
        assert 1 <= len(page.events) < 20
        assert page.next_offset == 1 + len(page.events)
        watched = []
        async for event in client.watch("agent/big", 1):
            watched.append(event.offset)
            if event.offset == 20:
                break
        assert watched == list(range(1, 21))


def test_the_sdk_takes_the_largest_response_the_server_builds() -> None:
    """A page stops past PAGE_BYTES, so its largest is PAGE_BYTES plus one largest event; every
    SDK channel's receive limit must hold that (the largest event is built here for real)."""
    largest = pb.Event(
        offset=2**63 - 1,
        type="message",
        key="k" * 128,
        message=pb.MessageValue(text=TEXT, sender="s" * 256),
    )
    largest.message.data.string_value = "d" * (64 * 1024)
    largest.headers.txid = 2**63 - 1
    response = api.ReadEventsResponse(events=[largest], next_offset=2**63 - 1, head_offset=2**63 - 1)
    assert PAGE_BYTES + response.ByteSize() < RECEIVE_LIMIT_BYTES
    assert ("grpc.max_receive_message_length", RECEIVE_LIMIT_BYTES) in CHANNEL_OPTIONS
