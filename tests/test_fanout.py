"""Many watchers of one entity: the writer does nothing per watcher, each event is encoded
once, a watcher that falls behind catches up from the store in batches, and every watcher
gets every event once, in order (issue 18, point 5). bench/bench_fanout.py measures the rates."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from conftest import StartServer
from electric_server.app import ElectricServer

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.client import AsyncClient

pytestmark = pytest.mark.anyio

REF = pb.EntityRef(type="agent", id="busy")


async def send(stub: api_grpc.EntityServiceStub, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        await stub.SendMessage(api.SendMessageRequest(ref=REF, text=f"m{i}"))


async def collect(call: Any, until: int) -> tuple[list[int], int]:
    """Offsets received until ``until`` (exclusive), and how many messages carried them."""
    offsets: list[int] = []
    messages = 0
    async for item in call:
        messages += 1
        kind = item.WhichOneof("item")
        events = item.events.events if kind == "events" else [item.event]
        offsets.extend(e.offset for e in events)
        if offsets and offsets[-1] >= until - 1:
            return offsets, messages
    raise AssertionError(f"the watch ended at {offsets[-1:]}")


async def opened(
    stub: api_grpc.EntityServiceStub, from_offset: int = 0, batches: bool = True
) -> grpc.aio.UnaryStreamCall[Any, Any]:
    """A watch; whether the server has it before the next write or not, it misses nothing."""
    return stub.WatchEvents(api.WatchEventsRequest(ref=REF, from_offset=from_offset, accepts_batches=batches))


async def test_the_writer_hands_a_commit_to_one_feed_whatever_the_watchers(start_server: StartServer) -> None:
    """On main every watcher subscribed to the hub itself, so the writer called 200 callbacks per
    commit; now an entity's watchers share one feed: one subscriber, however many watch."""
    server = await start_server()
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=REF))
        calls = [await opened(stub) for _ in range(200)]
        await send(stub, 1)
        got = await asyncio.gather(*(collect(c, 2) for c in calls))  # spawn's state event + the message
        assert all(offsets == [0, 1] for offsets, _ in got)
        assert server.store.hub.subscribers(("agent", "busy")) == 1
        for c in calls:
            c.cancel()


async def test_each_event_is_encoded_once_for_every_watcher(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted where the feed encodes: 50 watchers × 20 live events cost 20 encodings, not 1,000."""
    from electric_server.core import event_feed

    encoded: list[int] = []
    real = event_feed.event_entry

    def counting(stored: Any) -> bytes:
        encoded.append(stored.offset)
        return real(stored)

    monkeypatch.setattr(event_feed, "event_entry", counting)
    server = await start_server()
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=REF))
        calls = [await opened(stub, from_offset=1, batches=i % 2 == 0) for i in range(50)]
        await send(stub, 20)
        got = await asyncio.gather(*(collect(c, 21) for c in calls))
        assert all(offsets == list(range(1, 21)) for offsets, _ in got)
        assert sorted(encoded) == list(range(1, 21))
        for c in calls:
            c.cancel()


async def test_a_watcher_behind_the_feed_catches_up_from_the_store_in_batches(
    start_server: StartServer,
) -> None:
    """A feed that keeps 5 events and a watcher paced to 50 messages a second (a message costs
    16 KiB of bandwidth at least): 300 events written at full speed leave it far behind the feed;
    it reads the rest from the store, batched, and gets every event once, in order."""
    server = await start_server(watch_feed_events=5, watch_bandwidth=50 * 16 * 1024)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=REF))
        batched = await opened(stub)
        # All at once, so they commit in a few batches: written one by one, on a loaded machine
        # they took long enough for the paced watcher to keep up with one message per event.
        await asyncio.gather(*(send(stub, 1, start=i) for i in range(300)))
        offsets, messages = await collect(batched, 301)
        assert offsets == list(range(301))
        assert messages < 100  # batched: at 50 messages a second, one per event would take 6 s
        assert server.watches is not None
        feed = server.watches.feed(("agent", "busy"))
        assert feed is not None
        assert feed.start is not None
        assert feed.start > 0
        batched.cancel()


async def test_a_watcher_that_takes_no_batches_gets_one_event_per_message(start_server: StartServer) -> None:
    server = await start_server(watch_feed_events=5)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=REF))
        early = await opened(stub, batches=False)
        await send(stub, 150)
        late = await opened(stub, batches=False)  # from the store, behind the 5 the feed keeps
        await send(stub, 150, start=150)
        for call in (early, late):
            offsets, messages = await collect(call, 301)
            assert offsets == list(range(301))
            assert messages == 301
            call.cancel()


async def test_a_closed_stream_ends_every_watcher_after_its_last_event(start_server: StartServer) -> None:
    server = await start_server()
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=REF))
        calls = [await opened(stub, batches=i % 2 == 0) for i in range(20)]
        await send(stub, 5)
        await stub.SignalEntity(api.SignalEntityRequest(ref=REF, signal=pb.SIGNAL_SIGKILL))
        head = (await stub.GetEntity(api.GetEntityRequest(ref=REF))).entity.head_offset
        for call in calls:
            offsets: list[int] = []
            async for item in call:
                kind = item.WhichOneof("item")
                if kind == "end_of_stream":
                    assert item.end_of_stream.head_offset == head
                    break
                offsets.extend(e.offset for e in (item.events.events if kind == "events" else [item.event]))
            assert offsets == list(range(head))
        assert server.watches is not None
        assert server.watches.feed(("agent", "busy")) is None


async def test_watchers_and_other_calls_are_served_while_writers_run(server: ElectricServer) -> None:
    """200 watchers of one entity with two writers on it: every watcher gets all 300 events once,
    in order, through the SDK (which takes batches), while GetEntity on another entity answers."""
    async with AsyncClient(server.address) as client:
        await client.spawn("agent/busy")
        await client.spawn("agent/quiet")

        async def watcher() -> list[int]:
            got = []
            async for event in client.watch("agent/busy", 1):
                got.append(event.offset)
                if event.offset == 300:
                    return got
            raise AssertionError("the watch ended")

        async def writer(n: int) -> None:
            for i in range(150):
                await client.send("agent/busy", f"{n}:{i}")

        watchers = [asyncio.create_task(watcher()) for _ in range(200)]
        await asyncio.sleep(0)
        writers = asyncio.gather(writer(0), writer(1))
        while not writers.done():
            assert (await client.get("agent/quiet")).state.value == "spawning"
            await asyncio.sleep(0.01)
        await writers
        for got in await asyncio.gather(*watchers):
            assert got == list(range(1, 301))
