"""Every cell of the signal table the server decides, end to end over real gRPC and SQLite.

States a runtime would reach (running, idle, paused, stopping) are seeded through the
store's own write API (``seed_state``); every signal is then sent over gRPC and judged
against ``electric_sdk.lifecycle`` and, independently, against the RFC's table as typed
in below.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import grpc
import pytest
from electric_server.app import ElectricServer
from electric_server.tools.verify import compare, replay
from google.protobuf import duration_pb2
from helpers import error_info

from electric_sdk import lifecycle
from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import Outcome, Signal, State

pytestmark = pytest.mark.anyio

Stub: TypeAlias = "api_grpc.EntityServiceAsyncStub"
Seed = Callable[..., Awaitable[Any]]
S, G = State, Signal
LONG_GRACE_MS = 600_000  # long enough that the reaper never interferes with a cell test

# The RFC's table, typed in from the RFC text (not derived from lifecycle.py): the state a
# signal moves an entity to; a missing cell leaves the state unchanged.
RFC_NEW_STATE: dict[State, dict[Signal, State]] = {
    S.SPAWNING: {G.SIGKILL: S.KILLED},
    S.RUNNING: {G.SIGTERM: S.STOPPING, G.SIGKILL: S.KILLED, G.SIGSTOP: S.PAUSED},
    S.IDLE: {G.SIGTERM: S.STOPPED, G.SIGKILL: S.KILLED, G.SIGSTOP: S.PAUSED},
    S.PAUSED: {G.SIGTERM: S.STOPPING, G.SIGKILL: S.KILLED, G.SIGCONT: S.RUNNING},
    S.STOPPING: {G.SIGKILL: S.KILLED},
}
SEEDED = [S.RUNNING, S.IDLE, S.PAUSED, S.STOPPING]


def pb_state(state: State) -> pb.State.ValueType:
    return pb.State.Value(f"STATE_{state.name}")


def pb_signal(signal: Signal) -> pb.Signal.ValueType:
    return pb.Signal.Value(f"SIGNAL_{signal.name}")


def pb_outcome(outcome: Outcome) -> pb.SignalOutcome.ValueType:
    return pb.SignalOutcome.Value(f"SIGNAL_OUTCOME_{outcome.name}")


def ms(ts: Any) -> int:
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


async def spawn(stub: Stub, type_: str, id_: str, grace_ms: int = LONG_GRACE_MS) -> pb.EntityRef:
    ref = pb.EntityRef(type=type_, id=id_)
    grace = duration_pb2.Duration(seconds=grace_ms // 1000, nanos=grace_ms % 1000 * 1_000_000)
    resp = await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref, profile=pb.Profile(grace_period=grace)))
    assert resp.entity.state == pb.STATE_SPAWNING
    return ref


async def reach(
    server: ElectricServer, stub: Stub, seed: Seed, type_: str, id_: str, state: State
) -> pb.EntityRef:
    """A fresh entity in ``state``, seeded through the store API where a runtime would write it."""
    ref = await spawn(stub, type_, id_)
    key = (type_, id_)
    if state is not S.SPAWNING:
        await seed(server.store, key, S.RUNNING, cause="started")
    if state is S.IDLE:
        await seed(server.store, key, S.IDLE, cause="idle_timeout")
    elif state is S.PAUSED:
        await seed(server.store, key, S.PAUSED, cause="seed")
    elif state is S.STOPPING:
        now = (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity.updated_at
        await seed(server.store, key, S.STOPPING, cause="seed", deadline_ms=ms(now) + LONG_GRACE_MS)
    got = (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity
    assert got.state == pb_state(state)
    return ref


async def read_all(stub: Stub, ref: pb.EntityRef) -> list[pb.Event]:
    return list((await stub.ReadEvents(api.ReadEventsRequest(ref=ref, limit=1000))).events)


async def signal_and_check(
    stub: Stub, ref: pb.EntityRef, state: State, signal: Signal, expected_outcome: Outcome
) -> api.SignalEntityResponse:
    """Send one signal and check the response, the entity and the appended events."""
    before = (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity
    assert before.state == pb_state(state)
    resp = await stub.SignalEntity(
        api.SignalEntityRequest(ref=ref, signal=pb_signal(signal), reason=f"test {signal.value}")
    )
    new_state = RFC_NEW_STATE[state].get(signal, state)
    assert lifecycle.decide(state, signal).new_state is new_state, "lifecycle.py disagrees with the RFC"
    assert resp.url == f"/{ref.type}/{ref.id}"
    assert resp.signal == pb_signal(signal)
    assert (resp.previous_state, resp.new_state) == (pb_state(state), pb_state(new_state))
    assert resp.outcome == pb_outcome(expected_outcome)
    assert resp.txid > before.txid
    assert resp.key
    assert ms(resp.created_at) >= ms(before.updated_at)

    after = (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity
    assert after.state == resp.new_state
    assert after.txid == resp.txid
    assert ms(after.updated_at) == ms(resp.created_at)
    page = await stub.ReadEvents(api.ReadEventsRequest(ref=ref, from_offset=before.head_offset))
    transitions = new_state is not state
    assert [e.type for e in page.events] == (["signal", "state"] if transitions else ["signal"])
    assert after.head_offset == before.head_offset + len(page.events)
    assert [e.offset for e in page.events] == list(range(before.head_offset, after.head_offset))
    # One transaction: every appended event carries the response's txid and timestamp.
    assert {e.headers.txid for e in page.events} == {resp.txid}
    assert {ms(e.headers.timestamp) for e in page.events} == {ms(resp.created_at)}
    sig = page.events[0]
    assert (sig.key, sig.headers.operation) == (resp.key, pb.OPERATION_INSERT)
    assert sig.signal.signal == pb_signal(signal)
    assert (sig.signal.sender, sig.signal.reason) == ("anonymous", f"test {signal.value}")
    assert sig.signal.outcome == resp.outcome
    assert (sig.signal.previous_state, sig.signal.new_state) == (resp.previous_state, resp.new_state)
    if transitions:
        st = page.events[1].state
        assert (st.state, st.previous_state) == (resp.new_state, resp.previous_state)
        assert (st.cause, st.signal_key) == ("signal", resp.key)
        if new_state is S.STOPPING:
            deadline = ms(resp.created_at) + LONG_GRACE_MS
            assert ms(st.deadline) == deadline
            assert ms(after.stopping_deadline) == deadline
        else:
            assert not st.HasField("deadline")
            assert not after.HasField("stopping_deadline")
    assert after.closed is new_state.terminal
    assert page.end_of_stream is new_state.terminal
    return resp


@pytest.mark.parametrize("signal", list(Signal), ids=lambda s: s.value)
async def test_spawning_cells(stub: Stub, signal: Signal) -> None:
    ref = await spawn(stub, "agent", f"spawning_{signal.value}")
    # RFC: in `spawning` only SIGKILL does anything (→ killed); everything else is ignored.
    rfc = Outcome.TRANSITIONED if signal is G.SIGKILL else Outcome.IGNORED
    assert lifecycle.decide(S.SPAWNING, signal).outcome is rfc
    await signal_and_check(stub, ref, S.SPAWNING, signal, rfc)


@pytest.mark.parametrize("state", SEEDED, ids=lambda s: s.value)
@pytest.mark.parametrize("signal", list(Signal), ids=lambda s: s.value)
async def test_seeded_cells(
    server: ElectricServer, stub: Stub, seed_state: Seed, state: State, signal: Signal
) -> None:
    ref = await reach(server, stub, seed_state, "agent", f"{state.value}_{signal.value}", state)
    expected = lifecycle.decide(state, signal)  # the server's view: run_in_progress unknown
    # The server only ever decides these three; the runtime fills in the rest later.
    assert expected.outcome in {Outcome.PENDING, Outcome.IGNORED, Outcome.TRANSITIONED}
    await signal_and_check(stub, ref, state, signal, expected.outcome)


async def check_rejects_all(stub: Stub, ref: pb.EntityRef, state: State) -> None:
    before = (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity
    events_before = await read_all(stub, ref)
    assert before.state == pb_state(state)
    for signal in Signal:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb_signal(signal)))
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert caught.value.details() == f"Cannot signal a {state.value} entity"
        info = error_info(caught.value)
        assert (info.reason, info.domain) == ("INVALID_SIGNAL", "electric.v1")
        after = (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity
        assert (after.head_offset, after.txid, after.state) == (before.head_offset, before.txid, before.state)
        assert await read_all(stub, ref) == events_before


async def test_killed_entity_rejects_every_signal(stub: Stub) -> None:
    ref = await spawn(stub, "agent", "doomed")
    await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGKILL))
    await check_rejects_all(stub, ref, S.KILLED)


async def test_stopped_entity_rejects_every_signal(
    server: ElectricServer, stub: Stub, seed_state: Seed
) -> None:
    ref = await reach(server, stub, seed_state, "agent", "done", S.IDLE)
    resp = await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGTERM))
    assert resp.new_state == pb.STATE_STOPPED  # idle + SIGTERM → stopped at once
    await check_rejects_all(stub, ref, S.STOPPED)


async def test_delete_entity_is_sigkill(stub: Stub) -> None:
    ref = await spawn(stub, "agent", "legacy")
    result = (await stub.DeleteEntity(api.DeleteEntityRequest(ref=ref))).result
    assert (result.url, result.signal) == ("/agent/legacy", pb.SIGNAL_SIGKILL)
    assert (result.previous_state, result.new_state) == (pb.STATE_SPAWNING, pb.STATE_KILLED)
    assert result.outcome == pb.SIGNAL_OUTCOME_TRANSITIONED
    events = await read_all(stub, ref)
    assert [e.type for e in events] == ["state", "signal", "state"]
    assert (events[1].key, events[1].signal.signal, events[1].signal.reason) == (
        result.key,
        pb.SIGNAL_SIGKILL,
        "legacy delete",
    )
    assert events[1].headers.txid == events[2].headers.txid == result.txid
    assert events[2].state.state == pb.STATE_KILLED
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.DeleteEntity(api.DeleteEntityRequest(ref=ref))
    assert error_info(caught.value).reason == "INVALID_SIGNAL"


async def signal_records(stub: Stub, ref: pb.EntityRef, reason: str) -> list[pb.Event]:
    return [e for e in await read_all(stub, ref) if e.type == "signal" and e.signal.reason == reason]


async def test_signal_entities_by_type_skips_terminal(
    server: ElectricServer, stub: Stub, seed_state: Seed
) -> None:
    live = [await spawn(stub, "fleet", f"a{i}") for i in range(3)]
    killed = await spawn(stub, "fleet", "killed")
    await stub.SignalEntity(api.SignalEntityRequest(ref=killed, signal=pb.SIGNAL_SIGKILL))
    stopped = await reach(server, stub, seed_state, "fleet", "stopped", S.IDLE)
    await stub.SignalEntity(api.SignalEntityRequest(ref=stopped, signal=pb.SIGNAL_SIGTERM))
    other = await spawn(stub, "other", "x")
    heads = {
        r.id: (await stub.GetEntity(api.GetEntityRequest(ref=r))).entity.head_offset
        for r in (killed, stopped, other)
    }

    resp = await stub.SignalEntities(
        api.SignalEntitiesRequest(
            selector=api.EntitySelector(type="fleet"), signal=pb.SIGNAL_SIGUSR, reason="bulk"
        )
    )
    assert (resp.signalled, resp.ignored, resp.skipped, resp.not_found) == (0, 3, 2, 0)
    txids = set()
    for ref in live:
        (record,) = await signal_records(stub, ref, "bulk")
        assert record.signal.outcome == pb.SIGNAL_OUTCOME_IGNORED  # spawning + SIGUSR
        txids.add(record.headers.txid)
    assert len(txids) == len(live), "each entity's signal is its own transaction"
    for ref in (killed, stopped, other):
        assert (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity.head_offset == heads[ref.id]


async def test_signal_entities_by_states(server: ElectricServer, stub: Stub, seed_state: Seed) -> None:
    running = [
        await reach(server, stub, seed_state, t, i, S.RUNNING)
        for t, i in [("a", "r0"), ("a", "r1"), ("b", "r2")]
    ]
    idle = await reach(server, stub, seed_state, "a", "i0", S.IDLE)
    resp = await stub.SignalEntities(
        api.SignalEntitiesRequest(
            selector=api.EntitySelector(states=[pb.STATE_RUNNING]),
            signal=pb.SIGNAL_SIGSTOP,
            reason="pause all",
        )
    )
    assert (resp.signalled, resp.ignored, resp.skipped, resp.not_found) == (3, 0, 0, 0)
    for ref in running:
        assert (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity.state == pb.STATE_PAUSED
        assert len(await signal_records(stub, ref, "pause all")) == 1
    assert (await stub.GetEntity(api.GetEntityRequest(ref=idle))).entity.state == pb.STATE_IDLE
    assert await signal_records(stub, idle, "pause all") == []


async def test_signal_entities_explicit_refs(stub: Stub) -> None:
    alive = await spawn(stub, "agent", "alive")
    dead = await spawn(stub, "agent", "dead")
    await stub.SignalEntity(api.SignalEntityRequest(ref=dead, signal=pb.SIGNAL_SIGKILL))
    missing = pb.EntityRef(type="agent", id="missing")
    selector = api.EntitySelector(refs=[alive, dead, missing])
    resp = await stub.SignalEntities(
        api.SignalEntitiesRequest(selector=selector, signal=pb.SIGNAL_SIGKILL, reason="explicit")
    )
    assert (resp.signalled, resp.ignored, resp.skipped, resp.not_found) == (1, 0, 1, 1)
    assert (await stub.GetEntity(api.GetEntityRequest(ref=alive))).entity.state == pb.STATE_KILLED
    assert len(await signal_records(stub, alive, "explicit")) == 1
    assert await signal_records(stub, dead, "explicit") == []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetEntity(api.GetEntityRequest(ref=missing))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_deploy_sighup_to_every_running_entity_of_a_type(
    server: ElectricServer, stub: Stub, seed_state: Seed
) -> None:
    running = [await reach(server, stub, seed_state, "svc", f"r{i}", S.RUNNING) for i in range(4)]
    bystanders = [
        await reach(server, stub, seed_state, "svc", "idle", S.IDLE),
        await reach(server, stub, seed_state, "svc", "spawning", S.SPAWNING),
        await reach(server, stub, seed_state, "other", "r", S.RUNNING),
    ]
    heads = [(await stub.GetEntity(api.GetEntityRequest(ref=r))).entity.head_offset for r in bystanders]
    selector = api.EntitySelector(type="svc", states=[pb.STATE_RUNNING])
    resp = await stub.SignalEntities(
        api.SignalEntitiesRequest(selector=selector, signal=pb.SIGNAL_SIGHUP, reason="deploy v2")
    )
    # running + SIGHUP: recorded, runtime action pending (reload after the current run).
    assert (resp.signalled, resp.ignored, resp.skipped, resp.not_found) == (4, 0, 0, 0)
    for ref in running:
        (record,) = await signal_records(stub, ref, "deploy v2")
        assert record.signal.signal == pb.SIGNAL_SIGHUP
        assert record.signal.outcome == pb_outcome(lifecycle.decide(S.RUNNING, G.SIGHUP).outcome)
        assert (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity.state == pb.STATE_RUNNING
    for ref, head in zip(bystanders, heads, strict=True):
        assert (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity.head_offset == head


async def test_racing_sigterm_and_sigkill_are_linearized(
    server: ElectricServer, stub: Stub, seed_state: Seed
) -> None:
    for i in range(30):
        ref = await reach(server, stub, seed_state, "race", f"r{i}", S.RUNNING)
        term = stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGTERM))
        kill = stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGKILL))
        pair = (term, kill) if i % 2 else (kill, term)
        results = await asyncio.gather(*pair, return_exceptions=True)
        t, k = (results[0], results[1]) if i % 2 else (results[1], results[0])
        assert isinstance(k, api.SignalEntityResponse), k  # SIGKILL always applies
        assert k.new_state == pb.STATE_KILLED
        if isinstance(t, api.SignalEntityResponse):  # SIGTERM first: the kill is judged in `stopping`
            assert (t.previous_state, t.new_state) == (pb.STATE_RUNNING, pb.STATE_STOPPING)
            assert k.previous_state == pb.STATE_STOPPING
            assert t.txid < k.txid
        else:  # SIGKILL first: SIGTERM found a killed entity and wrote nothing
            assert isinstance(t, grpc.aio.AioRpcError), t
            assert error_info(t).reason == "INVALID_SIGNAL"
            assert k.previous_state == pb.STATE_RUNNING
        signals = [e.signal.signal for e in await read_all(stub, ref) if e.type == "signal"]
        assert signals == (
            [pb.SIGNAL_SIGTERM, pb.SIGNAL_SIGKILL]
            if not isinstance(t, BaseException)
            else [pb.SIGNAL_SIGKILL]
        )
        record = await server.store.get_entity((ref.type, ref.id))
        assert record is not None
        assert compare(record, await replay(server.store, (ref.type, ref.id))) == []
