"""A SIGINT that aborts a run reaches the children working for that run, durably, once.

Real servers (SQLite, and PostgreSQL for `both_stores`), a real worker hosting the
entity code; waits follow the streams (``watch``), never sleeps.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import ServerProcess
from electric_server.core import child_interrupts, entity_writes
from electric_server.store.base import Mutation, NewEvent, Write
from electric_server.store.sqlite.store import SQLiteStore
from electric_server.tools.datadir import database_path

from electric_sdk import AsyncClient, State
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.events import event_body
from electric_sdk._wire.json_values import json_to_value
from electric_sdk.runtime import App, Context, Message
from electric_sdk.runtime.worker import Worker
from electric_sdk.testing import TestServer

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]

WAIT_S = 30.0


def delegating_app(children: str = "cascade") -> App:
    """``lead`` spawns ``helper/<its id>`` and ``helper/<its id>-idle`` (spawned only), sends the
    first its message and waits for the run; ``helper``'s run waits until it is interrupted."""
    app = App("children-interrupt")

    @app.entity("lead", idle_timeout="1h", children=children)  # type: ignore[arg-type]
    async def lead(ctx: Context, message: Message) -> str:
        await ctx.spawn(f"helper/{ctx.ref.id}-idle")
        child = await ctx.spawn(f"helper/{ctx.ref.id}")
        answer = await ctx.send(child, message.text, wait="run", timeout="60s")
        return str(answer["output"])

    @app.entity("helper", idle_timeout="1h")
    async def helper(ctx: Context, message: Message) -> None:
        await anyio.sleep_forever()

    return app


async def first(client: AsyncClient, ref: str, match: Callable[[Any], bool]) -> Any:
    """The first event of ``ref``'s stream ``match`` accepts, waited for."""
    with anyio.fail_after(WAIT_S):
        async for event in client.watch(ref, 0):
            if match(event):
                return event
    raise AssertionError(f"{ref}'s stream ended")


def child_phase(phase: str) -> Callable[[Any], bool]:
    def match(event: Any) -> bool:
        data = event.value.get("data") if event.type == "electric.child" else None
        return isinstance(data, dict) and data.get("phase") == phase

    return match


async def told(client: AsyncClient, lead: str) -> dict[str, dict[str, Any]]:
    """The children the ``told`` record of ``lead``'s run names, by URL."""
    record = await first(client, lead, child_phase("told"))
    return {c["child"]: c for c in record.value["data"]["children"]}


def run_status(status: str) -> Callable[[Any], bool]:
    return lambda e: e.type == "run" and e.value.get("status") == status


async def delegate(client: AsyncClient, lead: str) -> str:
    """Send ``lead`` its message; once its child's run is under way, the message's key there."""
    await client.spawn(lead)
    await client.send(lead, "sources")
    sent = await first(client, lead, child_phase("sent"))
    helper = sent.value["data"]["child"].strip("/")
    await first(client, helper, run_status("started"))
    return str(sent.value["data"]["message"])


async def test_sigint_aborting_a_run_interrupts_the_children_working_for_it(
    electric: TestServer, client: AsyncClient
) -> None:
    hosted = Worker(delegating_app(), [electric.address], worker_id="w-interrupt")
    async with anyio.create_task_group() as tg:
        await tg.start(hosted.run)
        message = await delegate(client, "lead/l1")
        await client.signal("lead/l1", "SIGINT")
        # The child's run of the lead's message is aborted by a SIGINT scoped to that message.
        await first(client, "helper/l1", run_status("aborted"))
        # One signal (its record, then its outcome's update, under one key): the latest value.
        [sigint] = {
            e.key: e for e in (await client.events("helper/l1", 0, limit=100)).events if e.type == "signal"
        }.values()
        value = sigint.to_json()["value"]
        assert value["sender"] == "electric:cascade"
        assert value["message_key"] == message
        assert "/lead/l1" in value["reason"]
        assert "SIGINT" in value["reason"]
        # Each child of the run is recorded told in the lead's stream, after the run's end.
        children = await told(client, "lead/l1")
        assert children["/helper/l1"]["message"] == message
        assert children["/helper/l1"]["signal"] == "SIGINT"
        assert children["/helper/l1"]["outcome"] == "aborted"
        assert children["/helper/l1-idle"]["message"] == ""  # only spawned: unscoped
        # The entities go on: a SIGINT ends a run, not an entity.
        assert (await client.get("helper/l1")).state is not State.STOPPED
        assert (await client.get("lead/l1")).state is State.RUNNING
        await hosted.shutdown(0)


async def test_a_detach_type_leaves_its_childrens_runs_alone(
    electric: TestServer, client: AsyncClient
) -> None:
    hosted = Worker(delegating_app("detach"), [electric.address], worker_id="w-interrupt-detach")
    async with anyio.create_task_group() as tg:
        await tg.start(hosted.run)
        await delegate(client, "lead/d1")
        await client.signal("lead/d1", "SIGINT")
        assert (await told(client, "lead/d1"))["/helper/d1"]["outcome"] == "detached"
        events = (await client.events("helper/d1", 0, limit=100)).events
        assert not [e for e in events if e.type == "signal"]
        assert not [e for e in events if run_status("aborted")(e)]
        await hosted.shutdown(0)


def _delegation(data: dict[str, Any]) -> Any:
    def decide(current: Any, ctx: Any) -> Mutation:
        custom = pb.CustomValue(data=json_to_value(data))
        body = event_body(pb.Event(custom=custom))
        return Mutation([NewEvent("electric.child", f"d_{ctx.txid}", entity_writes.INSERT, body)], current)

    return decide


def _mark(run: str) -> Any:
    def decide(current: Any, ctx: Any) -> Mutation:
        # As the commit of a delegating run's aborted end leaves it: due.
        return Mutation([], current.replace(interrupted_runs=f"{run}@0"))

    return decide


async def test_a_sigint_cascade_is_found_in_the_store_after_a_restart_and_sent_once(
    tmp_path: Path, server_process: Callable[..., ServerProcess]
) -> None:
    """A run's aborted end committed with no server to act on it: the next server finds it in
    the store alone, signals the child once, and a second pass signals nothing more."""
    data = tmp_path / "data"
    first_server = server_process(data)
    async with AsyncClient(first_server.address) as client:
        await client.spawn("lead/r1")
        await client.spawn("helper/r1", parent="lead/r1")
        await client.spawn("helper/other")  # not its child: left alone
    first_server.send(signal.SIGKILL)
    first_server.wait()
    store = SQLiteStore(database_path(data))
    await store.open()
    try:
        for child in ("/helper/r1", "/helper/other"):
            delegation = {"phase": "spawned", "run": "msg_9", "child": child, "message": ""}
            await store.write(Write(("lead", "r1"), _delegation(delegation)))
        await store.write(Write(("lead", "r1"), _mark("msg_9")))
        [due] = await store.interrupts_due(10)
        assert due.ref == ("lead", "r1")
        assert due.interrupted_runs == "msg_9@0"
    finally:
        await store.close()
    second = server_process(data)
    async with AsyncClient(second.address) as client:
        children = await told(client, "lead/r1")
        assert children["/helper/other"]["outcome"] == "not signalled"
        assert children["/helper/r1"]["signal"] == "SIGINT"
        signals = [e for e in (await client.events("helper/r1", 0, limit=100)).events if e.type == "signal"]
        assert {(s.key, s.to_json()["value"]["sender"]) for s in signals} == {
            (signals[0].key, "electric:cascade")
        }
        assert not [
            e for e in (await client.events("helper/other", 0, limit=100)).events if e.type == "signal"
        ]
    second.send(signal.SIGKILL)
    second.wait()
    # Once: the same run told again (a retry after a crash) signals nothing more.
    store = SQLiteStore(database_path(data))
    await store.open()
    try:
        assert await store.interrupts_due(10) == []
        await store.write(Write(("lead", "r1"), _mark("msg_9")))
        [again] = await store.interrupts_due(10)
        await child_interrupts.tell_children(store, again, detached=False)
        events = await store.read_events(("helper", "r1"), 0, 100)
        assert len({e.key for e in events if e.kind == "signal"}) == 1
        assert await store.interrupts_due(10) == []
    finally:
        await store.close()


def stage(result: Any, name: str) -> dict[str, Any]:
    return next(s for s in result.to_json()["stages"] if s["stage"] == name)


async def test_sigints_downstream_names_each_child_told(electric: TestServer, client: AsyncClient) -> None:
    hosted = Worker(delegating_app(), [electric.address], worker_id="w-interrupt-downstream")
    async with anyio.create_task_group() as tg:
        await tg.start(hosted.run)
        await delegate(client, "lead/s1")
        result = await client.interrupt("lead/s1", wait="downstream", timeout="30s")
        downstream = stage(result, "downstream")
        assert downstream["reached"], result.to_json()
        assert "/helper/s1 SIGINT aborted" in downstream["detail"]
        assert "/helper/s1-idle SIGINT" in downstream["detail"]
        # Reached at the server's told record, after the run's end.
        assert downstream["offset"] > stage(result, "unwound")["offset"]
        await hosted.shutdown(0)


async def test_sigterms_downstream_waits_for_the_runs_children_within_the_parents_grace(
    electric: TestServer, client: AsyncClient
) -> None:
    hosted = Worker(delegating_app(), [electric.address], worker_id="w-term-downstream")
    async with anyio.create_task_group() as tg:
        await tg.start(hosted.run)
        await client.spawn("lead/t1", grace_period=timedelta(seconds=1))
        await client.send("lead/t1", "sources")
        sent = await first(client, "lead/t1", child_phase("sent"))
        await first(client, sent.value["data"]["child"].strip("/"), run_status("started"))
        # The lead's run goes on (it waits for its child's run) until its grace runs out.
        result = await client.terminate("lead/t1", wait="downstream", timeout="30s")
        downstream = stage(result, "downstream")
        assert downstream["reached"], result.to_json()
        assert "/helper/t1 SIGTERM" in downstream["detail"]
        assert (await client.get("helper/t1")).state in (State.STOPPING, State.STOPPED)
        await hosted.shutdown(0)


async def test_a_sigint_to_a_run_waiting_for_its_worker_reaches_its_children(
    electric: TestServer, client: AsyncClient
) -> None:
    """The worker hosting the lead and its child is gone, its runs in flight: the server records
    the lead's run aborted with no runtime, and its child's run is aborted too."""
    hosted = Worker(delegating_app(), [electric.address], worker_id="w-interrupt-gone")
    async with anyio.create_task_group() as tg:
        await tg.start(hosted.run)
        message = await delegate(client, "lead/g1")
        tg.cancel_scope.cancel()  # the worker goes, its runs in flight
    await client.interrupt("lead/g1")
    ended = await first(client, "lead/g1", run_status("aborted"))
    # The server recorded its end, no runtime: as a run waiting for a worker of its version, or
    # (its worker's session not yet seen gone) once that lease ended.
    error = ended.value["error"]
    assert "waited for a worker" in error or "no partial output: its lease ended" in error, error
    children = await told(client, "lead/g1")
    assert children["/helper/g1"]["message"] == message
    assert children["/helper/g1"]["outcome"] == "aborted"
    await first(client, "helper/g1", run_status("aborted"))


def test_a_stopping_parents_run_signals_only_the_children_its_cascade_would() -> None:
    """Under the cascade's own key, a SIGTERM a child ignores now would be the one it never gets:
    a `spawning` child waits for the cascade, as ``Store.cascades_due`` has it."""
    reaches = child_interrupts.stop_reaches
    assert reaches(State.STOPPING, State.RUNNING)
    assert reaches(State.STOPPED, State.IDLE)
    assert not reaches(State.STOPPING, State.SPAWNING)
    assert not reaches(State.STOPPING, State.STOPPED)
    assert reaches(State.KILLED, State.SPAWNING)
    assert reaches(State.KILLED, State.STOPPING)
    assert not reaches(State.KILLED, State.KILLED)
