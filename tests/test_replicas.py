"""Several `electric server` replicas on one PostgreSQL database, as real processes (issue 20).

Leases, sessions and deadlines live in the database (store/sessions.py, lease_sweep.py), so any
replica may die at any moment: these tests kill them with SIGKILL, drain them with SIGTERM, and
check through the others, and through the database, that nothing is granted twice, nothing
acknowledged is lost, and every deadline still fires on time. All but one hold without the commit
feed between replicas (each replica's poll finds what the others did, and what they wrote is read
back from the database); that one shows signals sent through B and C reaching a worker on A.

ELECTRIC_REPLICA_RACE_S sets how long the signal race runs (10 s, as issue 20 asks).
"""

from __future__ import annotations

import os
import random
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import grpc
import pytest
from conftest import ServerProcess
from test_runtime_protocol import RawWorker, running, usr_then_kill

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.times import duration_from_ms

pytestmark = pytest.mark.anyio

RACE_S = float(os.environ.get("ELECTRIC_REPLICA_RACE_S", "10"))
StartReplica = Callable[..., ServerProcess]
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """One event loop for the module: grpc may deliver the last events of a call to a replica that
    was killed after its test ended, and a closed loop would fail the next test with them."""
    return "asyncio"


@pytest.fixture(scope="module", autouse=True)
async def one_loop() -> AsyncIterator[None]:
    """Holds the module's loop open (anyio keeps a runner while an async fixture of its scope lives)."""
    yield  # noqa: PT022 (the fixture's life is what keeps the loop, not a teardown)


@pytest.fixture
def replica(postgres_url: str, server_process: Callable[..., ServerProcess], tmp_path: Path) -> StartReplica:
    """Starts a replica on the test's database (postgres_url first: it outlives the processes).
    Deadlines are polled every 20 ms and sessions expire 1 s after their last heartbeat."""
    count = iter(range(100))

    def start(*extra: str, port: int = 0) -> ServerProcess:
        args = ("--database", postgres_url, "--poll", "20ms", "--lease-ttl", "1s", *extra)
        return server_process(tmp_path / f"replica{next(count)}", *args, port=port)

    return start


async def read_all(entities: api_grpc.EntityServiceStub, ref: pb.EntityRef) -> list[pb.Event]:
    events: list[pb.Event] = []
    while True:
        page = await entities.ReadEvents(api.ReadEventsRequest(ref=ref, from_offset=len(events), limit=1000))
        events.extend(page.events)
        if not page.events:
            return events


async def closed(worker: RawWorker) -> None:
    """Close a raw worker and wait for its call's end, so grpc has nothing left to tell the loop."""
    worker.close()
    await worker.call.code()


def stub(channel: grpc.aio.Channel) -> api_grpc.EntityServiceStub:
    return api_grpc.EntityServiceStub(channel)


async def until_state(
    entities: api_grpc.EntityServiceStub, ref: pb.EntityRef, state: int
) -> tuple[pb.Event, list[pb.Event]]:
    """Watch ``ref`` (from its start) until a state event says ``state``; that event and all before."""
    seen: list[pb.Event] = []
    call = entities.WatchEvents(api.WatchEventsRequest(ref=ref))
    try:
        with anyio.fail_after(20):
            async for item in call:
                if item.HasField("event"):
                    seen.append(item.event)
                    if item.event.type == "state" and item.event.state.state == state:
                        return item.event, seen
    finally:
        call.cancel()  # ended now, not by a later test's loop when the channel closes
        await call.code()
    raise AssertionError(f"the watch ended before {state}: {seen}")


async def until_entity(
    entities: api_grpc.EntityServiceStub, ref: pb.EntityRef, predicate: Callable[[pb.Entity], bool]
) -> pb.Entity:
    """Read ``ref`` through a replica until ``predicate`` holds. A commit another replica made
    reaches this one's watchers only with the feed between replicas, so this reads the database."""
    with anyio.fail_after(20):
        while True:
            entity = (await entities.GetEntity(api.GetEntityRequest(ref=ref))).entity
            if predicate(entity):
                return entity
            await anyio.sleep(0.02)  # nothing to wait on but the database


async def test_a_replica_killed_in_a_grace_period_does_not_delay_stopped(replica: StartReplica) -> None:
    """The SIGTERM goes through replica A, where the entity's worker is; A is killed at once:
    replica B finds the deadline due by polling the database and writes `stopped` in time."""
    a, b = replica(), replica()
    ref = pb.EntityRef(type="agent", id="grace")
    async with grpc.aio.insecure_channel(a.address) as to_a, grpc.aio.insecure_channel(b.address) as to_b:
        worker = RawWorker(to_a, "w-grace", ["agent"])
        await stub(to_a).SpawnEntity(
            api.SpawnEntityRequest(ref=ref, profile=pb.Profile(grace_period=duration_from_ms(1000)))
        )
        lease = (await worker.next("lease_granted")).lease
        started = await worker.write(
            ref,
            lease.epoch,
            pb.STATE_SPAWNING,
            transition=rt.Transition(to=pb.STATE_RUNNING, cause="started"),
        )
        assert started.applied
        await stub(to_a).SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGTERM))
        a.send(signal.SIGKILL)
        stopping, _ = await until_state(stub(to_b), ref, pb.STATE_STOPPING)
        stopped, _ = await until_state(stub(to_b), ref, pb.STATE_STOPPED)
        await closed(worker)
    deadline = stopping.state.deadline.ToMilliseconds()
    late_ms = stopped.headers.timestamp.ToMilliseconds() - deadline
    assert stopped.state.cause == "grace_expired"
    assert 0 <= late_ms <= 1000, late_ms


async def test_a_killed_replicas_leases_end_on_another_after_the_ttl(replica: StartReplica) -> None:
    """No worker anywhere after A dies: B still ends A's lease once its session expired (1 s), and
    the `running` entity goes idle with cause runtime_lost, its epoch fenced."""
    a, b = replica(), replica()
    async with grpc.aio.insecure_channel(a.address) as to_a, grpc.aio.insecure_channel(b.address) as to_b:
        worker = RawWorker(to_a, "w-alone", ["agent"])
        ref, _ = await running(stub(to_a), worker, "alone")
        a.send(signal.SIGKILL)
        await until_entity(stub(to_b), ref, lambda e: e.state == pb.STATE_IDLE)
        await closed(worker)
        states = [e.state for e in await read_all(stub(to_b), ref) if e.type == "state"]
    assert (states[-1].state, states[-1].cause) == (pb.STATE_IDLE, "runtime_lost")


async def test_an_ended_stream_whose_replica_died_is_closed_by_another(replica: StartReplica) -> None:
    """SIGKILL through A while its worker holds the entity, and A dies before the worker lets go:
    B closes the stream once no live runtime may append to it, the SIGUSR its runtime never
    reported on settled `ignored`."""
    a, b = replica("--settle", "60s"), replica("--settle", "60s")  # only the holder's end can close it
    async with grpc.aio.insecure_channel(a.address) as to_a, grpc.aio.insecure_channel(b.address) as to_b:
        worker = RawWorker(to_a, "w-ended", ["agent"])
        ref, _ = await running(stub(to_a), worker, "ended")
        usr, _ = await usr_then_kill(stub(to_a), worker, ref)
        a.send(signal.SIGKILL)
        ended = await until_entity(stub(to_b), ref, lambda e: e.closed)
        await closed(worker)
        signals = [e for e in await read_all(stub(to_b), ref) if e.type == "signal" and e.key == usr.key]
    assert ended.state == pb.STATE_KILLED
    assert signals[-1].signal.outcome == pb.SIGNAL_OUTCOME_IGNORED


async def test_a_spawn_through_one_replica_is_leased_to_a_worker_on_another(replica: StartReplica) -> None:
    """The worker is on B; the spawn and a message go through A. B finds what its worker may take
    by polling the database (the feed between replicas only makes it sooner)."""
    a, b = replica(), replica()
    async with grpc.aio.insecure_channel(a.address) as to_a, grpc.aio.insecure_channel(b.address) as to_b:
        worker = RawWorker(to_b, "w-far", ["agent"])
        await worker.next("welcome")
        ref = pb.EntityRef(type="agent", id="far")
        await stub(to_a).SpawnEntity(api.SpawnEntityRequest(ref=ref))
        lease = (await worker.next("lease_granted")).lease
        for expect, to, cause in (
            (pb.STATE_SPAWNING, pb.STATE_RUNNING, "started"),
            (pb.STATE_RUNNING, pb.STATE_IDLE, "idle_timeout"),
        ):
            moved = await worker.write(ref, lease.epoch, expect, transition=rt.Transition(to=to, cause=cause))
            assert moved.applied, moved
        worker.requests.put_nowait(rt.ConnectRequest(release=rt.Release(ref=ref, epoch=lease.epoch)))
        await until_entity(stub(to_a), ref, lambda e: e.state == pb.STATE_IDLE)
        await stub(to_a).SendMessage(api.SendMessageRequest(ref=ref, text="wake"))
        woken = (await worker.next("lease_granted")).lease
        await closed(worker)
    assert woken.epoch > lease.epoch


async def test_signals_through_other_replicas_reach_the_worker_through_the_feed(
    replica: StartReplica,
) -> None:
    """The worker is on A; SIGUSRs through B and C reach it (the commit feed between replicas),
    each once and in order, and its outcomes, written through A, are read back through B."""
    a, b, c = replica(), replica(), replica()
    async with (
        grpc.aio.insecure_channel(a.address) as to_a,
        grpc.aio.insecure_channel(b.address) as to_b,
        grpc.aio.insecure_channel(c.address) as to_c,
    ):
        worker = RawWorker(to_a, "w-fed", ["agent"])
        ref, lease = await running(stub(to_a), worker, "fed")
        sent = []
        for n in range(6):
            channel = to_b if n % 2 else to_c
            request = api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGUSR, reason=f"n{n}")
            sent.append((await stub(channel).SignalEntity(request)).key)
        delivered = [(await worker.next("delivery")).event.key for _ in sent]
        for key in delivered:
            update = rt.SignalOutcomeUpdate(signal_key=key, outcome=pb.SIGNAL_OUTCOME_DELIVERED)
            reported = await worker.write(ref, lease.epoch, pb.STATE_RUNNING, signal_outcome=update)
            assert reported.applied, reported
        await closed(worker)
        latest = {e.key: e.signal.outcome for e in await read_all(stub(to_b), ref) if e.type == "signal"}
    assert delivered == sent
    assert set(latest.values()) == {pb.SIGNAL_OUTCOME_DELIVERED}


async def test_a_hello_on_another_replica_ends_the_old_session_at_once(replica: StartReplica) -> None:
    """Worker w holds an entity through A, then says hello to B (as after a network split): its
    session on A ends (A's stream closes), and B grants the entity to it under a higher epoch."""
    a, b = replica(), replica()
    async with grpc.aio.insecure_channel(a.address) as to_a, grpc.aio.insecure_channel(b.address) as to_b:
        old = RawWorker(to_a, "w", ["agent"])
        ref, lease = await running(stub(to_a), old, "split")
        new = RawWorker(to_b, "w", ["agent"])
        await new.next("welcome")
        # Its lease ended as lost (running → idle): a message through B wakes it on the new session.
        await until_entity(stub(to_b), ref, lambda e: e.state == pb.STATE_IDLE)
        await stub(to_b).SendMessage(api.SendMessageRequest(ref=ref, text="wake"))
        granted = (await new.next("lease_granted")).lease
        assert granted.ref == ref
        assert granted.epoch > lease.epoch
        with anyio.fail_after(10):
            await old.until_ended()  # heartbeating still: it is the hello on B that ends it
        stale = await new.write(
            ref, lease.epoch, pb.STATE_IDLE, transition=rt.Transition(to=pb.STATE_RUNNING, cause="woke")
        )
        assert stale.reason == "STALE_EPOCH"
        await closed(old)
        await closed(new)


async def test_draining_a_replica_hands_its_leases_over_at_once(replica: StartReplica) -> None:
    """Sessions live 30 s here: only the drain's handover can give B the entity within the bound."""
    a, b = replica("--lease-ttl", "30s"), replica("--lease-ttl", "30s")
    async with grpc.aio.insecure_channel(a.address) as to_a, grpc.aio.insecure_channel(b.address) as to_b:
        on_a = RawWorker(to_a, "w-a", ["agent"])
        ref, lease = await running(stub(to_a), on_a, "drained")
        on_b = RawWorker(to_b, "w-b", ["agent"])
        await on_b.next("welcome")
        a.send(signal.SIGTERM)
        await until_entity(stub(to_b), ref, lambda e: e.state == pb.STATE_IDLE)  # handed over, as lost
        await stub(to_b).SendMessage(api.SendMessageRequest(ref=ref, text="wake"))
        with anyio.fail_after(10):
            granted = (await on_b.next("lease_granted")).lease
        assert granted.ref == ref
        assert granted.epoch > lease.epoch
        assert a.wait() == 0
        await closed(on_a)
        await closed(on_b)


async def test_a_killed_replicas_worker_gets_its_entities_back_through_another(
    replica: StartReplica,
) -> None:
    """Kill -9 of the replica holding a worker's session mid-run: the worker reconnects to B, its
    entities are leased to it there under higher epochs, every write A acknowledged is in the
    stream once, and the old epoch can no longer write."""
    a, b = replica(), replica()
    async with grpc.aio.insecure_channel(a.address) as to_a, grpc.aio.insecure_channel(b.address) as to_b:
        old = RawWorker(to_a, "w-kill", ["agent"])
        refs_leases = [await running(stub(to_a), old, f"k{i}") for i in range(3)]
        acknowledged: list[int] = []
        for ref, lease in refs_leases:
            for _ in range(5):
                result = await old.write(
                    ref, lease.epoch, pb.STATE_RUNNING, custom=rt.CustomEvent(type="step", data=None)
                )
                assert result.applied, result
                acknowledged.append(result.txid)
        a.send(signal.SIGKILL)
        new = RawWorker(to_b, "w-kill", ["agent"])
        await new.next("welcome")
        for ref, _ in refs_leases:  # each lease ended as lost (running → idle); a message wakes it
            await until_entity(stub(to_b), ref, lambda e: e.state == pb.STATE_IDLE)
            await stub(to_b).SendMessage(api.SendMessageRequest(ref=ref, text="wake"))
        regained = {}
        with anyio.fail_after(20):
            while len(regained) < len(refs_leases):
                lease = (await new.next("lease_granted")).lease
                regained[lease.ref.id] = lease.epoch
        entities = stub(to_b)
        txids: list[int] = []
        for ref, lease in refs_leases:
            assert regained[ref.id] > lease.epoch
            events = (await entities.ReadEvents(api.ReadEventsRequest(ref=ref, limit=1000))).events
            txids.extend(e.headers.txid for e in events if e.type == "step")
            stale = await new.write(ref, lease.epoch, pb.STATE_IDLE, custom=rt.CustomEvent(type="step"))
            assert stale.reason == "STALE_EPOCH"
        await closed(old)
        await closed(new)
    assert sorted(txids) == sorted(acknowledged)


async def test_racing_signals_through_three_replicas_replay_clean(
    replica: StartReplica, postgres_url: str
) -> None:
    """32 clients signal 8 entities through three replicas (short graces, so every replica's
    reaper races to fire them): every stream then replays clean against the lifecycle table."""
    replicas = [replica(), replica(), replica()]
    channels = [grpc.aio.insecure_channel(r.address) for r in replicas]
    refs = [pb.EntityRef(type="race", id=f"e{i}") for i in range(8)]
    signals = [pb.SIGNAL_SIGUSR, pb.SIGNAL_SIGINT, pb.SIGNAL_SIGTERM, pb.SIGNAL_SIGHUP, pb.SIGNAL_SIGSTOP]
    signals += [pb.SIGNAL_SIGCONT, pb.SIGNAL_SIGKILL]
    answered = 0
    try:
        for ref in refs:
            await stub(channels[0]).SpawnEntity(
                api.SpawnEntityRequest(ref=ref, profile=pb.Profile(grace_period=duration_from_ms(30)))
            )

        async def client(n: int) -> None:
            nonlocal answered
            rng = random.Random(n)
            entities = stub(channels[n % len(channels)])
            with anyio.move_on_after(RACE_S):
                while True:
                    ref = rng.choice(refs)
                    try:
                        await entities.SignalEntity(
                            api.SignalEntityRequest(ref=ref, signal=rng.choice(signals))
                        )
                    except grpc.aio.AioRpcError as exc:
                        if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:  # not INVALID_SIGNAL
                            raise
                    answered += 1

        async with anyio.create_task_group() as tg:
            for n in range(32):
                tg.start_soon(client, n)
    finally:
        for channel in channels:
            await channel.close()
    assert answered > 32
    for r in replicas:
        r.send(signal.SIGTERM)
        assert r.wait() == 0
    verified = await anyio.run_process(
        [sys.executable, "-m", "electric_sdk.cli.main", "verify", "--database", postgres_url], check=False
    )
    assert verified.returncode == 0, verified.stdout.decode() + verified.stderr.decode()


async def test_a_rolling_restart_under_load_loses_nothing(replica: StartReplica) -> None:
    """Keyed signals through all three replicas (each retried with its key until answered) while
    each replica in turn is drained and started again on its port: every acknowledged signal is
    in its stream exactly once."""
    replicas = [replica(), replica(), replica()]
    ports = [int(r.address.rsplit(":", 1)[1]) for r in replicas]
    refs = [pb.EntityRef(type="roll", id=f"e{i}") for i in range(4)]
    acknowledged: dict[str, str] = {}  # key → the signal record's key
    stop = anyio.Event()
    async with grpc.aio.insecure_channel(replicas[0].address) as first:
        for ref in refs:
            await stub(first).SpawnEntity(api.SpawnEntityRequest(ref=ref))

    async def client(n: int) -> None:
        channels = {p: grpc.aio.insecure_channel(f"127.0.0.1:{p}") for p in ports}
        try:
            i = 0
            while not stop.is_set():
                key = f"c{n}-{i}"
                ref = refs[i % len(refs)]
                request = api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGUSR, idempotency_key=key)
                for attempt in range(200):
                    try:
                        response = await stub(channels[ports[(n + attempt) % 3]]).SignalEntity(
                            request, timeout=5
                        )
                    except grpc.aio.AioRpcError as exc:
                        # A draining replica refuses new calls and cancels those past its grace:
                        # either may have committed, and the retry with the key finds out.
                        if exc.code() not in RETRYABLE:
                            raise
                        await anyio.sleep(0.01)
                        continue
                    acknowledged[key] = response.key
                    break
                i += 1
        finally:
            for channel in channels.values():
                await channel.close()

    async with anyio.create_task_group() as tg:
        for n in range(6):
            tg.start_soon(client, n)
        for i, r in enumerate(replicas):
            r.send(signal.SIGTERM)
            assert await anyio.to_thread.run_sync(r.wait) == 0
            replicas[i] = replica(port=ports[i])
        stop.set()
    assert len(acknowledged) > 10
    async with grpc.aio.insecure_channel(replicas[0].address) as channel:
        keys: list[str] = []
        for ref in refs:
            keys.extend(e.key for e in await read_all(stub(channel), ref) if e.type == "signal")
    missing = set(acknowledged.values()) - set(keys)
    repeated = sorted(k for k in set(keys) if keys.count(k) > 1)
    assert not missing, f"acknowledged, not stored: {missing}"
    assert not repeated, f"stored twice: {repeated}"
    assert sorted(keys) == sorted(acknowledged.values())


async def test_workers_are_listed_by_every_replica(replica: StartReplica) -> None:
    """ListWorkers through A lists the worker connected to B, with its lease, from the shared
    session rows; once its session ends, A lists it no more."""
    a, b = replica(), replica()
    async with grpc.aio.insecure_channel(a.address) as to_a, grpc.aio.insecure_channel(b.address) as to_b:
        worker = RawWorker(to_b, "w-listed", ["agent"])
        await worker.next("welcome")
        await stub(to_a).SpawnEntity(api.SpawnEntityRequest(ref=pb.EntityRef(type="agent", id="l1")))
        await worker.next("lease_granted")
        [seen] = (await stub(to_a).ListWorkers(api.ListWorkersRequest())).workers
        assert (seen.worker_id, list(seen.types), seen.leases_held) == ("w-listed", ["agent"], 1)
        [from_b] = (await stub(to_b).ListWorkers(api.ListWorkersRequest())).workers
        assert from_b.replica == seen.replica  # both name B, the replica its session is on
        await closed(worker)
        with anyio.fail_after(20):
            while (await stub(to_a).ListWorkers(api.ListWorkersRequest())).workers:  # noqa: ASYNC110
                await anyio.sleep(0.02)  # nothing to wait on but the database
