"""Durable state and recorded steps on one worker: snapshots, SIGINT mid-step, bad values.

A real server (TestServer) and a real Worker on the test's loop; tests wait on stream events.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import pytest
from anyio.streams.text import TextReceiveStream

from electric_sdk import AsyncClient
from electric_sdk.durable_state import (
    MAX_PENDING_BYTES,
    MAX_SNAPSHOT_BYTES,
    SNAPSHOT_EVENT,
    STATE_EVENT,
    STEP_EVENT,
    fold,
)
from electric_sdk.lifecycle import Signal
from electric_sdk.models import EventPage
from electric_sdk.runtime import MAX_RESULT_BYTES, App, Context, Message, SignalInfo, SnapshotPolicy
from electric_sdk.state_read import load_state, read_range
from electric_sdk.testing import TestServer

from .rt_support import ABORTED, COMPLETED, outcome_of, run_status, running_worker, state_is, until

# Both stores: the records are read back by offset, which each store gives in its own way.
pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]


def reader(client: AsyncClient, ref: str) -> Any:
    async def page(from_offset: int, limit: int) -> EventPage:
        return await client.events(ref, from_offset, limit)

    return page


async def everything(client: AsyncClient, ref: str) -> list[Any]:
    """The whole stream (a page ends at 1 MiB: several pages)."""
    head = (await client.events(ref, 0, 1)).head_offset
    return await read_range(reader(client, ref), 0, head)


async def test_snapshots_bound_the_rebuild_and_equal_a_full_replay(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="test")

    @app.entity("counter", snapshots=SnapshotPolicy(every_ops=4))
    async def counter(ctx: Context, message: Message) -> None:
        ctx.state["seen"].append(message.text)
        ctx.state["last"]["text"] = message.text
        ctx.output.write(",".join(ctx.state["seen"]))

    ref = "counter/c1"
    async with running_worker(app, electric.address):
        await client.spawn(ref)
        for i in range(6):
            key = (await client.send(ref, f"m{i}")).key
            await until(client, ref, run_status(COMPLETED, key))
        await client.reload(ref)  # the next message wakes it on a new lease: rebuilt from the stream
        await until(client, ref, state_is("idle", "reload"))
        key = (await client.send(ref, "m6")).key
        done = await until(client, ref, run_status(COMPLETED, key))
        assert done.raw.run.output == "m0,m1,m2,m3,m4,m5,m6"

    events = await everything(client, ref)
    snapshots = [e for e in events if e.type == SNAPSHOT_EVENT]
    assert len(snapshots) == 3  # every 4 ops, 2 ops a run: after runs 2, 4 and 6
    full = fold((e.type, e.value.get("data")) for e in events)
    loaded = await load_state(reader(client, ref), events[-1].offset + 1)
    assert loaded.snapshot == snapshots[-1].offset
    assert loaded.state == full == {"seen": [f"m{i}" for i in range(7)], "last": {"text": "m6"}}
    assert await client.state(ref) == full


async def test_sigint_mid_step_records_no_result_and_keeps_the_partial_output(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="test")
    entered = anyio.Event()

    async def hold() -> None:
        entered.set()
        await anyio.sleep(60)

    @app.entity("holder")
    async def holder(ctx: Context, message: Message) -> None:
        ctx.output.write("partial")
        ctx.state["notes"].append("before the step")
        await ctx.step("tool:hold", hold)

    ref = "holder/h1"
    async with running_worker(app, electric.address):
        await client.spawn(ref)
        key = (await client.send(ref, "go")).key
        with anyio.fail_after(10):
            await entered.wait()
        sig = await client.interrupt(ref)
        aborted = await until(client, ref, run_status(ABORTED, key))
        assert aborted.raw.run.output == "partial"
        await until(client, ref, outcome_of(sig.key, "aborted"))
    events = await everything(client, ref)
    assert not [e for e in events if e.type == STEP_EVENT]  # never recorded, so never replayed as done
    # The change made before the abort was applied at once, so it was written with the run's end.
    assert [e.value["data"]["ops"] for e in events if e.type == STATE_EVENT] == [
        [["append", "notes", "before the step"]]
    ]


async def test_bad_values_and_results_are_clear_errors_that_write_nothing_wrong(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="test")
    seen: list[str] = []

    @app.entity("picky", state=True)
    class Picky:
        async def on_message(self, ctx: Context, message: Message) -> None:
            names = ctx.state.list("names", str)
            names.append("ok")
            bad_changes = (
                lambda: names.append(1),
                lambda: ctx.state["names"].__setitem__("k", "v"),
                lambda: names.append("x" * MAX_PENDING_BYTES),
            )
            for bad in bad_changes:
                try:
                    bad()
                except ValueError as exc:
                    seen.append(str(exc))
            try:
                await ctx.step("tool:big", lambda: "x" * (MAX_RESULT_BYTES + 1))
            except ValueError as exc:
                seen.append(type(exc).__name__)

            async def nested() -> str:
                return await ctx.step("inner", str, 42)  # part of the outer step: not recorded itself

            seen.append(await ctx.step("outer", nested))
            async with anyio.create_task_group() as tg:
                tg.start_soon(ctx.step, "slow", anyio.sleep, 0.01)
                await anyio.wait_all_tasks_blocked()
                try:
                    await ctx.step("beside", str)
                except RuntimeError as exc:
                    seen.append(str(exc)[:60])

        async def on_signal(self, ctx: Context, signal: SignalInfo) -> None:
            if signal.signal is Signal.SIGUSR:
                with pytest.raises(ValueError, match="runtime's own"):
                    await ctx.emit("electric.state", {"ops": []})

    ref = "picky/p1"
    async with running_worker(app, electric.address):
        await client.spawn(ref)
        key = (await client.send(ref, "go")).key
        await until(client, ref, run_status(COMPLETED, key))
        sig = await client.usr(ref)
        await until(client, ref, outcome_of(sig.key, "delivered"))
    assert seen == [
        "state['names'] holds str values, not 1",
        "state['names'] is a list",
        f"the state changes not yet written would exceed {MAX_PENDING_BYTES} bytes: they are written "
        "with the run's next recorded step, at its end, or when a handler returns",
        "InvalidStepResult",
        "42",
        "recorded step 'beside' called while parallel steps 'slow' ru",
    ]
    assert await client.state(ref) == {"names": ["ok"]}
    steps = [e.value["data"] for e in await everything(client, ref) if e.type == STEP_EVENT]
    assert [(s["name"], s["outcome"]) for s in steps] == [
        ("tool:big", "error"),
        ("outer", "ok"),
        ("slow", "ok"),
    ]
    assert steps[1]["result"] == "42"
    assert (steps[2]["index"], steps[2]["key"]) == (2, "slow")  # started from another task: parallel


async def test_the_cli_watches_the_state_change_by_change(electric: TestServer, client: AsyncClient) -> None:
    app = App(code_version="test")

    @app.entity("log")
    async def log(ctx: Context, message: Message) -> None:
        ctx.state["lines"].append(message.text)

    ref = "log/l1"
    cli = [sys.executable, "-m", "electric_sdk.cli.main", "--address", electric.address, "--json"]
    async with running_worker(app, electric.address):
        await client.spawn(ref)
        async with await anyio.open_process([*cli, "state", ref, "--watch"]) as watcher:
            assert watcher.stdout is not None
            lines = TextReceiveStream(watcher.stdout)
            seen: list[Any] = []
            with anyio.fail_after(10):
                buffer = ""
                for text in ("", "one", "two"):
                    if text:
                        await client.send(ref, text)
                    while "\n" not in buffer:
                        buffer += await lines.receive()
                    line, buffer = buffer.split("\n", 1)
                    seen.append(json.loads(line)["state"])
            watcher.terminate()
    assert seen == [{}, {"lines": ["one"]}, {"lines": ["one", "two"]}]
    assert electric.client().state(ref) == {"lines": ["one", "two"]}  # the sync client, the same way


async def test_a_state_too_large_to_snapshot_is_rebuilt_from_the_older_snapshot(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="test")
    chunk = "y" * (MAX_PENDING_BYTES // 2)

    @app.entity("big", snapshots=SnapshotPolicy(every_ops=1))
    async def big(ctx: Context, message: Message) -> None:
        ctx.state["chunks"].append(chunk)
        ctx.output.write(str(len(ctx.state["chunks"])))

    ref = "big/b1"
    async with running_worker(app, electric.address):
        await client.spawn(ref)
        count = 1 + MAX_SNAPSHOT_BYTES // len(chunk) + 1  # the last snapshots would be too large
        for i in range(count):
            key = (await client.send(ref, f"m{i}")).key
            await until(client, ref, run_status(COMPLETED, key))
        await client.reload(ref)
        await until(client, ref, state_is("idle", "reload"))
        key = (await client.send(ref, "again")).key
        done = await until(client, ref, run_status(COMPLETED, key))
        assert done.raw.run.output == str(count + 1)  # rebuilt on the new lease, every chunk there
    snapshots = [e for e in await everything(client, ref) if e.type == SNAPSHOT_EVENT]
    assert 0 < len(snapshots) < count
    assert len((await client.state(ref))["chunks"]) == count + 1


async def test_a_wake_far_from_the_last_change_leaves_a_snapshot_near_the_head(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="test")

    @app.entity("sparse", snapshots=SnapshotPolicy(scan_events=5))
    async def sparse(ctx: Context, message: Message) -> None:
        if message.text == "note":
            ctx.state["notes"].append("once")
        ctx.output.write(str(len(ctx.state["notes"])))

    ref = "sparse/s1"
    async with running_worker(app, electric.address):
        await client.spawn(ref)
        for text in ["note"] + ["quiet"] * 5:  # one change, then runs that change nothing
            key = (await client.send(ref, text)).key
            await until(client, ref, run_status(COMPLETED, key))
        await client.reload(ref)
        reloaded = await until(client, ref, state_is("idle", "reload"))
        key = (await client.send(ref, "quiet")).key  # the wake searches back past 5 events
        done = await until(client, ref, run_status(COMPLETED, key))
        assert done.raw.run.output == "1"
    (snapshot,) = [e for e in await everything(client, ref) if e.type == SNAPSHOT_EVENT]
    # Taken at the wake: it covers the stream up to it, so the next wake's tail starts there.
    assert snapshot.offset > reloaded.offset
    assert snapshot.value["data"]["state"] == {"notes": ["once"]}
    assert snapshot.value["data"]["upto"] >= reloaded.offset
    loaded = await load_state(reader(client, ref), done.offset + 1)
    assert (loaded.snapshot, loaded.state) == (snapshot.offset, {"notes": ["once"]})
