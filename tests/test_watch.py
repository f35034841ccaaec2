"""Watches and reads: catch-up then live, exact resumption, EOF, paging, entity snapshots, drain."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import anyio
import grpc
import pytest
from electric_server.app import ElectricServer
from helpers import error_info

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import State

pytestmark = pytest.mark.anyio

Stub: TypeAlias = "api_grpc.EntityServiceAsyncStub"
Seed = Callable[..., Awaitable[Any]]


async def spawn(stub: Stub, type_: str, id_: str) -> pb.EntityRef:
    ref = pb.EntityRef(type=type_, id=id_)
    await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref))
    return ref


async def signal(stub: Stub, ref: pb.EntityRef, sig: pb.Signal.ValueType) -> api.SignalEntityResponse:
    return await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=sig))


async def next_item(call: Any) -> Any:
    item = await call.read()
    assert item is not grpc.aio.EOF, "the watch ended early"
    return item


@pytest.mark.both_stores
async def test_watch_events_catch_up_then_live_then_eof(stub: Stub) -> None:
    ref = await spawn(stub, "agent", "w")
    for _ in range(3):
        await signal(stub, ref, pb.SIGNAL_SIGUSR)
    with anyio.fail_after(10):
        call = stub.WatchEvents(api.WatchEventsRequest(ref=ref, from_offset=0))
        caught_up = [(await next_item(call)).event for _ in range(4)]
        assert [(e.offset, e.type) for e in caught_up] == [
            (0, "state"),
            (1, "signal"),
            (2, "signal"),
            (3, "signal"),
        ]
        live = await signal(stub, ref, pb.SIGNAL_SIGUSR)
        event = (await next_item(call)).event
        assert (event.offset, event.key, event.headers.txid) == (4, live.key, live.txid)
        kill = await signal(stub, ref, pb.SIGNAL_SIGKILL)
        tail = [(await next_item(call)).event for _ in range(2)]
        assert [(e.offset, e.type, e.headers.txid) for e in tail] == [
            (5, "signal", kill.txid),
            (6, "state", kill.txid),
        ]
        end = await next_item(call)
        assert end.WhichOneof("item") == "end_of_stream"
        assert end.end_of_stream.head_offset == 7
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK


@pytest.mark.both_stores
async def test_resume_from_last_offset_misses_and_repeats_nothing(stub: Stub) -> None:
    ref = await spawn(stub, "agent", "resume")
    writes = 200

    async def writer() -> None:
        for _ in range(writes):
            await signal(stub, ref, pb.SIGNAL_SIGUSR)
        await signal(stub, ref, pb.SIGNAL_SIGKILL)

    seen: list[pb.Event] = []
    end_head = -1
    connections = 0
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer)
            while end_head < 0:
                # Reconnect after every 7 events, from the last offset seen plus one.
                call = stub.WatchEvents(api.WatchEventsRequest(ref=ref, from_offset=len(seen)))
                connections += 1
                for _ in range(7):
                    item = await next_item(call)
                    if item.WhichOneof("item") == "end_of_stream":
                        end_head = item.end_of_stream.head_offset
                        break
                    seen.append(item.event)
                call.cancel()
    stored = (await stub.ReadEvents(api.ReadEventsRequest(ref=ref, limit=1000))).events
    assert end_head == len(stored) == 1 + writes + 2
    assert [e.offset for e in seen] == list(range(end_head))
    assert [e.SerializeToString(deterministic=True) for e in seen] == [
        e.SerializeToString(deterministic=True) for e in stored
    ]
    assert connections >= end_head // 7


@pytest.mark.both_stores
async def test_watch_closed_stream_from_zero(stub: Stub) -> None:
    ref = await spawn(stub, "agent", "closed")
    await signal(stub, ref, pb.SIGNAL_SIGUSR)
    await signal(stub, ref, pb.SIGNAL_SIGKILL)
    with anyio.fail_after(10):
        items = [item async for item in stub.WatchEvents(api.WatchEventsRequest(ref=ref, from_offset=0))]
        assert [i.event.offset for i in items[:-1]] == [0, 1, 2, 3]
        assert items[-1].end_of_stream.head_offset == 4
        at_head = [item async for item in stub.WatchEvents(api.WatchEventsRequest(ref=ref, from_offset=4))]
        assert [i.WhichOneof("item") for i in at_head] == ["end_of_stream"]


@pytest.mark.both_stores
async def test_read_events_paging(stub: Stub) -> None:
    ref = await spawn(stub, "agent", "pages")
    for _ in range(9):
        await signal(stub, ref, pb.SIGNAL_SIGUSR)
    pages, offset = [], 0
    while offset < 10:
        page = await stub.ReadEvents(api.ReadEventsRequest(ref=ref, from_offset=offset, limit=3))
        assert page.head_offset == 10
        assert not page.end_of_stream  # open stream: never EOF, even at the head
        pages.append([e.offset for e in page.events])
        offset = page.next_offset
    assert pages == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    empty = await stub.ReadEvents(api.ReadEventsRequest(ref=ref, from_offset=10, limit=3))
    assert (list(empty.events), empty.next_offset, empty.end_of_stream) == ([], 10, False)
    await signal(stub, ref, pb.SIGNAL_SIGKILL)
    first = await stub.ReadEvents(api.ReadEventsRequest(ref=ref, from_offset=0, limit=11))
    assert (first.next_offset, first.head_offset, first.end_of_stream) == (11, 12, False)
    last = await stub.ReadEvents(api.ReadEventsRequest(ref=ref, from_offset=11, limit=3))
    assert ([e.offset for e in last.events], last.next_offset, last.end_of_stream) == ([11], 12, True)
    whole = await stub.ReadEvents(api.ReadEventsRequest(ref=ref))  # limit 0 means 100
    assert (len(whole.events), whole.end_of_stream) == (12, True)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ReadEvents(api.ReadEventsRequest(ref=ref, limit=1001))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def read_snapshot(call: Any) -> tuple[list[pb.Entity], int, int]:
    """(entities, number of snapshot chunks, snapshot_complete.txid)."""
    entities: list[pb.Entity] = []
    chunks = 0
    while True:
        item = await next_item(call)
        kind = item.WhichOneof("item")
        if kind == "snapshot_complete":
            return entities, chunks, item.snapshot_complete.txid
        assert kind == "snapshot", f"{kind} before snapshot_complete"
        chunks += 1
        entities.extend(item.snapshot.entities)


@pytest.mark.both_stores
async def test_watch_entities_snapshot_then_live_by_type(stub: Stub) -> None:
    refs = await asyncio.gather(*(spawn(stub, "many", f"e{i:03}") for i in range(520)))
    other = await spawn(stub, "other", "x")
    with anyio.fail_after(20):
        call = stub.WatchEntities(api.WatchEntitiesRequest(type="many"))
        entities, chunks, txid = await read_snapshot(call)
        assert chunks >= 2, "520 entities come in more than one chunk"
        ids = [e.ref.id for e in entities]
        assert sorted(ids) == sorted(r.id for r in refs)
        assert len(set(ids)) == len(ids)
        assert {e.ref.type for e in entities} == {"many"}
        assert txid >= max(e.txid for e in entities)
        await signal(stub, other, pb.SIGNAL_SIGKILL)  # another type: not delivered
        kill = await signal(stub, refs[0], pb.SIGNAL_SIGKILL)
        change = (await next_item(call)).change
        assert (change.entity.ref.id, change.entity.state, change.previous_state) == (
            "e000",
            pb.STATE_KILLED,
            pb.STATE_SPAWNING,
        )
        assert change.entity.txid == kill.txid
        await spawn(stub, "other", "y")
        await spawn(stub, "many", "new")
        born = (await next_item(call)).change
        assert (born.entity.ref.id, born.entity.state, born.previous_state) == (
            "new",
            pb.STATE_SPAWNING,
            pb.STATE_UNSPECIFIED,
        )
        call.cancel()


async def test_watch_entities_filtered_by_state(server: ElectricServer, stub: Stub, seed_state: Seed) -> None:
    runner = await spawn(stub, "agent", "runner")
    await seed_state(server.store, ("agent", "runner"), State.RUNNING)
    bystander = await spawn(stub, "agent", "bystander")
    with anyio.fail_after(10):
        call = stub.WatchEntities(api.WatchEntitiesRequest(states=[pb.STATE_RUNNING]))
        entities, _, _ = await read_snapshot(call)
        assert [e.ref.id for e in entities] == ["runner"]
        await signal(stub, bystander, pb.SIGNAL_SIGKILL)  # spawning → killed: neither side matches
        await signal(stub, runner, pb.SIGNAL_SIGUSR)  # no state change: nothing to send
        await signal(stub, runner, pb.SIGNAL_SIGSTOP)  # running → paused: the old state matches
        await signal(stub, runner, pb.SIGNAL_SIGCONT)  # paused → running: the new state matches
        await signal(stub, runner, pb.SIGNAL_SIGKILL)
        changes = [(await next_item(call)).change for _ in range(3)]
        assert [(c.entity.ref.id, c.previous_state, c.entity.state) for c in changes] == [
            ("runner", pb.STATE_RUNNING, pb.STATE_PAUSED),
            ("runner", pb.STATE_PAUSED, pb.STATE_RUNNING),
            ("runner", pb.STATE_RUNNING, pb.STATE_KILLED),
        ]
        call.cancel()


@pytest.mark.both_stores
async def test_no_change_is_repeated_after_the_snapshot(stub: Stub) -> None:
    refs = await asyncio.gather(*(spawn(stub, "dup", f"d{i:03}") for i in range(600)))
    views: dict[str, int] = {}
    changes: dict[str, list[tuple[int, int]]] = {}
    acked = 0
    some_acked = anyio.Event()

    async def killer(mine: list[pb.EntityRef]) -> None:
        nonlocal acked
        for ref in mine:  # one at a time: a steady trickle of commits
            await signal(stub, ref, pb.SIGNAL_SIGKILL)
            acked += 1
            if acked == 100:
                some_acked.set()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            # Kills land before, while and after the watch subscribes and reads its snapshot.
            # The snapshot comes in two chunks (d000-d499, d500-d599): the second chunk's
            # entities die just as the watch starts, some after it read the first chunk.
            order = refs[:100] + refs[500:] + refs[100:500]
            for worker in range(8):
                tg.start_soon(killer, order[worker::8])
            await some_acked.wait()
            call = stub.WatchEntities(api.WatchEntitiesRequest(type="dup"))
            entities, _, _ = await read_snapshot(call)
            views = {e.ref.id: e.state for e in entities}
            assert len(views) == len(refs)
            while any(state != pb.STATE_KILLED for state in views.values()):
                change = (await next_item(call)).change
                name = change.entity.ref.id
                assert change.previous_state == views[name], f"{name}: change does not follow what was shown"
                changes.setdefault(name, []).append((change.previous_state, change.entity.state))
                views[name] = change.entity.state
        # Nothing may follow but the next real change: a sentinel spawn.
        await spawn(stub, "dup", "sentinel")
        change = (await next_item(call)).change
        assert (change.entity.ref.id, change.previous_state) == ("sentinel", pb.STATE_UNSPECIFIED)
        call.cancel()
    for name, seen in changes.items():
        assert seen == [(pb.STATE_SPAWNING, pb.STATE_KILLED)], name


async def test_reconnecting_watcher_gets_a_fresh_snapshot(stub: Stub) -> None:
    ref = await spawn(stub, "agent", "again")
    with anyio.fail_after(10):
        call = stub.WatchEntities(api.WatchEntitiesRequest(type="agent"))
        before, _, txid_before = await read_snapshot(call)
        call.cancel()
        await signal(stub, ref, pb.SIGNAL_SIGKILL)
        call = stub.WatchEntities(api.WatchEntitiesRequest(type="agent"))
        after, _, txid_after = await read_snapshot(call)
        call.cancel()
    assert [e.state for e in before] == [pb.STATE_SPAWNING]
    assert [(e.state, e.closed) for e in after] == [(pb.STATE_KILLED, True)]
    assert txid_after > txid_before


async def test_server_drain_ends_watches_with_unavailable(server: ElectricServer, stub: Stub) -> None:
    ref = await spawn(stub, "agent", "drained")
    with anyio.fail_after(10):
        events = stub.WatchEvents(api.WatchEventsRequest(ref=ref))
        assert (await next_item(events)).event.offset == 0  # caught up, now following live
        entities = stub.WatchEntities(api.WatchEntitiesRequest())
        await read_snapshot(entities)
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.stop)
            for call in (events, entities):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call.read()
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
                info = error_info(caught.value)
                assert (info.reason, info.domain) == ("SERVER_DRAINING", "electric.v1")


async def read_changes(call: Any, count: int) -> tuple[list[api.EntityChange], list[int]]:
    """``count`` changes, flattened, and how many each stream message carried."""
    changes: list[api.EntityChange] = []
    sizes: list[int] = []
    while len(changes) < count:
        item = await next_item(call)
        kind = item.WhichOneof("item")
        batch = [item.change] if kind == "change" else list(item.changes.changes)
        assert batch, f"unexpected {kind}"
        changes.extend(batch)
        sizes.append(len(batch))
    return changes, sizes


@pytest.mark.parametrize("batches", [True, False])
async def test_a_burst_of_changes_comes_batched_only_to_a_watcher_that_accepts_it(
    stub: Stub, batches: bool
) -> None:
    """One SignalEntities(SIGKILL) commits 300 state changes together: a watcher that set
    `accepts_batches` gets them in few messages, in commit order; any other gets one each."""
    refs = await asyncio.gather(*(spawn(stub, "burst", f"b{i:03}") for i in range(300)))
    with anyio.fail_after(20):
        call = stub.WatchEntities(api.WatchEntitiesRequest(type="burst", accepts_batches=batches))
        await read_snapshot(call)
        killed = await stub.SignalEntities(
            api.SignalEntitiesRequest(signal=pb.SIGNAL_SIGKILL, selector=api.EntitySelector(type="burst"))
        )
        assert killed.signalled == 300
        changes, sizes = await read_changes(call, 300)
        assert sorted(c.entity.ref.id for c in changes) == sorted(r.id for r in refs)
        assert {c.entity.state for c in changes} == {pb.STATE_KILLED}
        txids = [c.entity.txid for c in changes]
        assert txids == sorted(txids)  # commit order, batched or not
        if batches:
            assert max(sizes) > 1, sizes
        else:
            assert set(sizes) == {1}
        call.cancel()
