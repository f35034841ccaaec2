"""A parent's SIGTERM and SIGKILL cascade down its tree of children, durably.

Real servers (SQLite, and PostgreSQL for `both_stores`), real signals through the
client; waits are on the entities' states (``wait_for_state``), never sleeps.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import ServerProcess
from electric_server.core import entity_writes
from electric_server.store.base import Write
from electric_server.store.sqlite.store import SQLiteStore
from electric_server.tools.datadir import database_path

from electric_sdk import AsyncClient, State
from electric_sdk._wire.times import timestamp_to_datetime
from electric_sdk.lifecycle import Signal
from electric_sdk.runtime import App, Context, Message
from electric_sdk.runtime.worker import Worker
from electric_sdk.testing import TestServer

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]

WAIT_S = 30.0
ENDED = (State.STOPPED, State.KILLED)


def hosting_app() -> App:
    """Types ``boss`` and ``team`` whose entities stay `running` (an idle timeout of an hour)."""
    app = App("children")

    async def never(ctx: Context, message: Message) -> None:
        await anyio.sleep_forever()

    app.entity("boss", idle_timeout="1h")(never)
    app.entity("team", idle_timeout="1h")(never)
    return app


@pytest.fixture
async def worker(electric: TestServer) -> AsyncIterator[Worker]:
    hosted = Worker(hosting_app(), [electric.address], worker_id="w-children")
    async with anyio.create_task_group() as tg:
        await tg.start(hosted.run)
        yield hosted
        await hosted.shutdown(0)


async def tree(client: AsyncClient, root_grace_s: float = 2.0, *, running: bool = True) -> list[str]:
    """/boss/root → /team/a, /team/b → /team/a1: three levels, each `running` (``running``: a
    worker hosts them); the children's grace is long."""
    await client.spawn("boss/root", grace_period=timedelta(seconds=root_grace_s))
    long = timedelta(seconds=600)
    await client.spawn("team/a", grace_period=long, parent="boss/root")
    await client.spawn("team/b", grace_period=long, parent="boss/root")
    await client.spawn("team/a1", grace_period=long, parent="team/a")
    for ref in ("boss/root", "team/a", "team/b", "team/a1") if running else ():
        await client.wait_for_state(ref, State.RUNNING, timeout=WAIT_S)
    return ["team/a", "team/b", "team/a1"]


async def ended_by_cascade(client: AsyncClient, ref: str) -> State:
    ended = await client.wait_for_state(ref, ENDED, timeout=WAIT_S)
    signals = [e for e in (await client.events(ref, 0, limit=100)).events if e.type == "signal"]
    # One signal (a runtime settles it: its record, then an update of it, under one key).
    assert {(s.key, s.to_json()["value"]["sender"]) for s in signals} == {
        (signals[0].key, "electric:cascade")
    }
    return ended.state


async def test_sigterm_to_a_root_stops_every_descendant_within_the_roots_grace(
    client: AsyncClient, worker: Worker
) -> None:
    descendants = await tree(client)
    await client.spawn("team/other", grace_period=timedelta(seconds=600))  # not in the tree
    await client.wait_for_state("team/other", State.RUNNING, timeout=WAIT_S)
    sent = await client.signal("boss/root", "SIGTERM")
    assert sent.new_state is State.STOPPING
    # The root's grace deadline: its SIGTERM's commit time plus its grace (2 s).
    root_deadline = sent.created_at + timedelta(seconds=2)
    for ref in descendants:
        assert await ended_by_cascade(client, ref) is State.STOPPED
        # Its `stopping` record's deadline: its own grace (600 s) cut to what remained of the root's.
        events = (await client.events(ref, 0, limit=100)).events
        [stopping] = [e for e in events if e.state is State.STOPPING]
        assert stopping.raw.state.HasField("deadline")
        assert timestamp_to_datetime(stopping.raw.state.deadline) <= root_deadline
    assert (await client.get("team/other")).state is State.RUNNING


async def test_sigkill_to_a_root_kills_every_descendant(client: AsyncClient, worker: Worker) -> None:
    descendants = await tree(client, root_grace_s=600)
    await client.kill("boss/root")
    for ref in descendants:
        assert await ended_by_cascade(client, ref) is State.KILLED


async def test_a_cascade_cut_short_by_a_kill_9_finishes_after_a_restart(
    tmp_path: Path, server_process: Callable[..., ServerProcess]
) -> None:
    """The root's SIGKILL is committed by a server whose cascade never ran (kill -9 first): the
    next server finds the children from the store alone, and signals each once."""
    data = tmp_path / "data"
    first = server_process(data)
    async with AsyncClient(first.address) as client:
        # No worker: a SIGKILL reaches children in any state, `spawning` too.
        descendants = await tree(client, root_grace_s=600, running=False)
        await client.spawn("team/c", parent="boss/root")
    first.send(signal.SIGKILL)
    first.wait()
    # The root's kill, written through the store's own write as the server writes it, with no
    # server running: as if one committed it and died before its cascade ran.
    store = SQLiteStore(database_path(data))
    await store.open()
    try:
        spec = entity_writes.SignalSpec(Signal.SIGKILL)
        await store.write(Write(("boss", "root"), entity_writes.signal(("boss", "root"), spec)))
        assert [f.child for f in await store.cascades_due(10)] == [
            ("team", "a"),
            ("team", "b"),
            ("team", "c"),
        ]
    finally:
        await store.close()
    second = server_process(data)
    async with AsyncClient(second.address) as client:
        for ref in [*descendants, "team/c"]:
            assert await ended_by_cascade(client, ref) is State.KILLED


def delegating_app() -> App:
    """``lead`` spawns a child ``helper`` and sends it its message, waiting for the run;
    ``helper`` answers; ``lead`` answers with the helper's output."""
    app = App("children-delegate")

    @app.entity("lead", idle_timeout="1h")
    async def lead(ctx: Context, message: Message) -> str:
        child = await ctx.spawn(f"helper/{ctx.ref.id}")
        answer = await ctx.send(child, message.text, wait="run", timeout="30s")
        return f"lead got: {answer['output']}"

    @app.entity("helper", idle_timeout="1h")
    async def helper(ctx: Context, message: Message) -> str:
        return f"helped with {message.text}"

    return app


async def test_entity_code_spawns_a_child_and_waits_for_its_run(
    electric: TestServer, client: AsyncClient
) -> None:
    hosted = Worker(delegating_app(), [electric.address], worker_id="w-delegate")
    async with anyio.create_task_group() as tg:
        await tg.start(hosted.run)
        await client.spawn("lead/l1")
        result = await client.send("lead/l1", "sources", wait="run", timeout=WAIT_S)
        assert result.output == "lead got: helped with sources"
        child = await client.get("helper/l1")
        assert child.parent is not None
        assert child.parent.url == "/lead/l1"
        steps = [
            e.value["data"]["name"]
            for e in (await client.events("lead/l1", 0, limit=100)).events
            if e.type == "electric.step"
        ]
        assert "electric:spawn /helper/l1" in steps
        assert "electric:send /helper/l1" in steps
        # Its SIGKILL reaches the child its code spawned.
        await client.kill("lead/l1")
        assert (await client.wait_for_state("helper/l1", ENDED, timeout=WAIT_S)).state is State.KILLED
        await hosted.shutdown(0)


async def test_a_detach_type_leaves_its_children_running(electric: TestServer, client: AsyncClient) -> None:
    app = hosting_app()

    @app.entity("lone", idle_timeout="1h", children="detach")
    async def lone(ctx: Context, message: Message) -> None:
        await anyio.sleep_forever()

    hosted = Worker(app, [electric.address], worker_id="w-detach")
    async with anyio.create_task_group() as tg:
        await tg.start(hosted.run)
        await client.spawn("lone/d")
        await client.spawn("team/dc", parent="lone/d")
        await client.spawn("boss/c")
        await client.spawn("team/cc", parent="boss/c")
        for ref in ("lone/d", "team/dc", "boss/c", "team/cc"):
            await client.wait_for_state(ref, State.RUNNING, timeout=WAIT_S)
        await client.kill("lone/d")
        await client.kill("boss/c")
        # The pass that killed boss/c's child read the store after lone/d was killed too.
        await client.wait_for_state("team/cc", State.KILLED, timeout=WAIT_S)
        assert (await client.get("team/dc")).state is State.RUNNING
        await hosted.shutdown(0)


async def child_records(client: AsyncClient, parent: str, count: int) -> list[dict[str, Any]]:
    """The parent's first ``count`` ``electric.child`` records, waited for on its stream."""
    found: list[dict[str, Any]] = []
    with anyio.fail_after(WAIT_S):
        async for event in client.watch(parent, 0):
            if event.type == "electric.child":
                found.append(event.value["data"])
                if len(found) == count:
                    return found
    raise AssertionError(f"{parent}'s stream ended with {found}")


async def test_a_childs_end_is_recorded_once_in_its_parents_stream(
    client: AsyncClient, worker: Worker
) -> None:
    await tree(client, root_grace_s=600)
    await client.kill("team/a1")
    await client.signal("team/b", "SIGTERM")
    records = await child_records(client, "team/a", 1)
    assert records == [{"phase": "ended", "child": "/team/a1", "state": "killed", "cause": "signal"}]
    [ended_b] = await child_records(client, "boss/root", 1)
    assert ended_b["child"] == "/team/b"
    assert ended_b["state"] == "stopped"
    # Told once: a later child's end is the next record, with none repeated between.
    await client.kill("team/a")
    later = await child_records(client, "boss/root", 2)
    assert [r["child"] for r in later] == ["/team/b", "/team/a"]
