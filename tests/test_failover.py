"""Failover (issue 47): the replica holding a worker's session dies, the run goes on through another.

Real `electric server` replicas on one PostgreSQL database (test_replicas.py's fixture: polls of
20 ms, sessions living 1 s past their last renewal, unless a test says otherwise) and a worker
given every replica's address. The worker notices the dead replica by its stream's own error
(kill -9 resets its connections) or by keepalive (a replica frozen with SIGSTOP answers nothing);
its hello on another replica ends the old session there, and that session's leases, before the
welcome; the run is delivered again and replays what it recorded.
"""

from __future__ import annotations

import re
import signal
from collections.abc import AsyncIterator
from typing import Any

import anyio
import grpc
import pytest
from test_replicas import (  # noqa: F401 - fixtures
    StartReplica,
    anyio_backend,
    closed,
    one_loop,
    replica,
    stub,
)
from test_runtime_protocol import RawWorker, running

from electric_sdk import AsyncClient, Event, errors
from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.runtime import App, Context, Message
from electric_sdk.runtime.worker import Worker

pytestmark = pytest.mark.anyio

TIMEOUT_S = 30.0


class Gated:
    """The run of a ``gated`` entity: step ``one``, then step ``two``, which waits for ``gate``.
    Counts how often each step's body ran: a recorded step replays, it does not run again."""

    def __init__(self) -> None:
        self.gate = anyio.Event()
        self.ran = {"one": 0, "two": 0}

    def app(self) -> App:
        app = App("failover")

        async def one() -> str:
            self.ran["one"] += 1
            return "one"

        async def two() -> str:
            self.ran["two"] += 1
            await self.gate.wait()
            return "two"

        @app.entity("gated", grace_period="1s", idle_timeout="1h")
        async def gated(ctx: Context, message: Message) -> None:
            await ctx.step("one", one)
            await ctx.step("two", two)

        return app


@pytest.fixture
async def gated() -> Gated:
    return Gated()


async def step_record(client: AsyncClient, ref: str, name: str, after_attempt: int = 0) -> Event:
    """The first record of step ``name`` in a run's attempt later than ``after_attempt``."""
    with anyio.fail_after(TIMEOUT_S):
        async for event in client.watch(ref, 0):
            data = event.value.get("data") or {}
            if event.type == "electric.step" and data["name"] == name and data["attempt"] > after_attempt:
                return event
    raise AssertionError(f"{ref}: the stream ended before step {name}")


def replica_id(server: Any) -> str:
    for line in server.lines:
        if found := re.search(r"; replica (\w+)\)", line):
            return found.group(1)
    raise AssertionError(f"no replica id in {server.lines}")


@pytest.fixture
async def hosting(gated: Gated, replica: StartReplica) -> AsyncIterator[Any]:  # noqa: F811
    """Two replicas, and a worker in this process given both addresses, hosting ``gated``."""
    a, b = replica(), replica()
    worker = Worker(
        gated.app(),
        [a.address, b.address],
        worker_id="w-failover",
        keepalive_ms=100,
        keepalive_timeout_ms=200,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        yield a, b, worker
        gated.gate.set()
        await worker.shutdown(0)


async def run_until_step_two(client: AsyncClient, ref: str) -> int:
    """Spawn ``ref`` and start its run: step one is recorded, step two waits; its attempt."""
    await client.spawn(ref)
    await client.send(ref, "go")
    return int((await step_record(client, ref, "one")).value["data"]["attempt"])


async def the_holder(client: AsyncClient, replicas: tuple[Any, Any], worker_id: str) -> tuple[Any, Any]:
    """(holding the worker's session, the other one)."""
    (session,) = [w for w in await client.workers() if w.worker_id == worker_id]
    a, b = replicas
    return (a, b) if replica_id(a) == session.replica else (b, a)


async def test_kill_9_of_the_sessions_replica_the_run_records_on_another(gated: Gated, hosting: Any) -> None:
    """kill -9 of the replica holding the session mid-run: the run's next record is written through
    the other, by a later attempt; the step recorded before the kill is replayed, not run again."""
    a, b, worker = hosting
    async with AsyncClient([a.address, b.address]) as anywhere:
        attempt = await run_until_step_two(anywhere, "gated/k")
        holder, other = await the_holder(anywhere, (a, b), worker.worker_id)
    holder.send(signal.SIGKILL)
    gated.gate.set()
    async with AsyncClient(other.address) as client:
        record = await step_record(client, "gated/k", "two", attempt)
        (session,) = [w for w in await client.workers() if w.worker_id == worker.worker_id]
        page = await client.events("gated/k", 0, limit=1000)
    steps = [e.value["data"] for e in page.events if e.type == "electric.step"]
    assert record.value["data"]["outcome"] == "ok"
    assert session.replica == replica_id(other)
    assert [s["name"] for s in steps] == ["one", "two"]  # one record each: nothing acknowledged lost
    assert gated.ran["one"] == 1


async def test_a_replica_that_answers_nothing_is_left_by_keepalive(gated: Gated, hosting: Any) -> None:
    """A replica frozen with SIGSTOP resets no connection (as when its host dies or the network is
    cut): the worker's keepalive gives up on it, and the run goes on through the other."""
    a, b, worker = hosting
    async with AsyncClient([a.address, b.address]) as anywhere:
        attempt = await run_until_step_two(anywhere, "gated/f")
        holder, other = await the_holder(anywhere, (a, b), worker.worker_id)
    holder.send(signal.SIGSTOP)
    try:
        gated.gate.set()
        async with AsyncClient(other.address) as client:
            record = await step_record(client, "gated/f", "two", attempt)
    finally:
        holder.send(signal.SIGKILL)
    assert record.value["data"]["outcome"] == "ok"
    assert gated.ran["one"] == 1


async def test_the_hello_ends_the_old_sessions_leases_before_its_welcome(replica: StartReplica) -> None:  # noqa: F811
    """Worker w holds a running entity through A; its hello on B ends that lease before B welcomes
    it (the polls are 500 ms and sessions live 60 s: neither could have), and A, alive, can no
    longer write under the old epoch."""
    slow = ("--poll", "500ms", "--lease-ttl", "60s")
    a, b = replica(*slow), replica(*slow)
    async with grpc.aio.insecure_channel(a.address) as to_a, grpc.aio.insecure_channel(b.address) as to_b:
        old = RawWorker(to_a, "w-hello", ["agent"])
        ref, lease = await running(stub(to_a), old, "hello")
        new = RawWorker(to_b, "w-hello", ["agent"])
        await new.next("welcome")
        entity = (await stub(to_b).GetEntity(api.GetEntityRequest(ref=ref))).entity
        assert entity.state == pb.STATE_IDLE  # its lease ended as lost: running → idle
        # A, alive, can no longer write under the old epoch: refused, or (A having seen its session
        # end first, as a loaded machine may) the old session's stream ends instead of an answer.
        # Either way nothing is written.
        head = (
            await stub(to_b).ReadEvents(api.ReadEventsRequest(ref=ref, from_offset=0, limit=1))
        ).head_offset
        outcome: list[str] = []
        try:
            stale = await old.write(ref, lease.epoch, pb.STATE_IDLE, custom=rt.CustomEvent(type="step"))
            outcome.append("applied" if stale.applied else "refused")
        except AssertionError as ended:
            outcome.append("session ended" if "the session ended" in str(ended) else repr(ended))
        assert outcome in (["refused"], ["session ended"])
        after = await stub(to_b).ReadEvents(api.ReadEventsRequest(ref=ref, from_offset=head, limit=100))
        assert [e.type for e in after.events if e.type == "step"] == []
        await stub(to_b).SendMessage(api.SendMessageRequest(ref=ref, text="wake"))
        granted = (await new.next("lease_granted")).lease
        assert granted.epoch > lease.epoch
        await closed(old)
        await closed(new)


@pytest.mark.parametrize(
    "given", [{"keepalive_ms": 0}, {"keepalive_timeout_ms": True}, {"keepalive_ms": 1.5}]
)
async def test_a_keepalive_that_is_no_whole_positive_ms_is_refused(given: dict[str, Any]) -> None:
    with pytest.raises(errors.InvalidArgument) as refused:
        Worker(App("failover"), "127.0.0.1:1", **given)
    assert refused.value.code == "VALUE_OUT_OF_RANGE"
    assert next(iter(given)) in str(refused.value)
