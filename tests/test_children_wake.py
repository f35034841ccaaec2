"""A parent woken when the run it delegated ends: ``ctx.send(child, text, wake=True)``.

A real server (SQLite, and PostgreSQL for `both_stores`) and a real worker; waits
follow the streams (``watch``), never sleeps.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import ServerProcess
from electric_server.core import child_wakes, entity_writes
from electric_server.store.base import Mutation, NewEvent, Write
from electric_server.store.sqlite.store import SQLiteStore
from electric_server.tools.datadir import database_path

from electric_sdk import AsyncClient, errors
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.events import event_body
from electric_sdk.runtime import App, Context, Message
from electric_sdk.runtime.worker import Worker
from electric_sdk.testing import TestServer

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]

WAIT_S = 30.0


def waking_app() -> App:
    """``boss`` hands its message to a child and ends its run; the child's run's end wakes it."""
    app = App("children-wake")

    @app.entity("boss", idle_timeout="1h")
    async def boss(ctx: Context, message: Message) -> str:
        if message.sender == "electric:child" and message.reply is None:
            end = message.data
            return f"woken by {end['child']}: {end['status']} {end['output']}"
        if message.text == "ask":  # delegates, then asks: the child's end is the reply
            slow = await ctx.spawn(f"slow/{ctx.ref.id}")
            await ctx.send(slow, "hold", wake=True)
            answer = await ctx.ask("what did the child do?")
            assert message.reply is not None
            return f"replied: {answer} ({message.reply.data['status']})"
        child = await ctx.spawn(f"worker/{ctx.ref.id}")
        if message.text == "both":
            with pytest.raises(errors.InvalidArgument, match="wake"):
                await ctx.send(child, "x", wait="run", wake=True)
        await ctx.send(child, message.text, wake=True)
        return "delegated"

    @app.entity("worker", idle_timeout="1h")
    async def worker(ctx: Context, message: Message) -> str:
        if message.text == "fail":
            raise RuntimeError("no sources")
        return f"did {message.text}"

    @app.entity("strict", idle_timeout="1h", on_busy="reject")
    class Strict:  # refuses a message while busy; a wake is owed all the same
        go: anyio.Event | None = None

        async def on_message(self, ctx: Context, message: Message) -> str:
            if message.sender == "electric:child":
                return f"woken: {message.data['status']}"
            if message.text == "hold":
                self.go = anyio.Event()
                await ctx.emit("holding", None)
                await self.go.wait()
                return "held"
            slow = await ctx.spawn(f"slow/{ctx.ref.id}")
            await ctx.send(slow, "hold", wake=True)
            return "delegated"

        async def on_signal(self, ctx: Context, signal: Any) -> None:
            if self.go is not None:
                self.go.set()

    @app.entity("slow", idle_timeout="1h")
    class Slow:
        go: anyio.Event | None = None

        async def on_message(self, ctx: Context, message: Message) -> str:
            self.go = anyio.Event()
            await ctx.emit("holding", None)
            await self.go.wait()
            return "did it slowly"

        async def on_signal(self, ctx: Context, signal: Any) -> None:
            if self.go is not None:
                self.go.set()

    return app


async def runs(client: AsyncClient, ref: str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` completed runs of ``ref``, waited for on its stream."""
    found: list[dict[str, Any]] = []
    with anyio.fail_after(WAIT_S):
        async for event in client.watch(ref, 0):
            if event.type == "run" and event.value.get("status") in ("completed", "failed"):
                found.append(event.value)
                if len(found) == count:
                    return found
    raise AssertionError(f"{ref}'s stream ended with {found}")


async def test_a_childs_run_end_wakes_its_parent_once(electric: TestServer, client: AsyncClient) -> None:
    hosted = Worker(waking_app(), [electric.address], worker_id="w-wake")
    async with anyio.create_task_group() as tg:
        await tg.start(hosted.run)
        await client.spawn("boss/b1")
        first = await client.send("boss/b1", "sources", wait="run", timeout=WAIT_S)
        assert first.output == "delegated"
        # The child's run ends on its own; its end comes back to the boss as its next message.
        [_, woken] = await runs(client, "boss/b1", 2)
        assert woken["output"] == "woken by /worker/b1: completed did sources"
        messages = [e for e in (await client.events("boss/b1", 0, limit=200)).events if e.type == "message"]
        assert [m.value["sender"] for m in messages][1:] == ["electric:child"]
        assert messages[1].value["data"]["message"]  # the child's message's key
        await hosted.shutdown(0)


async def test_a_failed_run_wakes_its_parent_and_wake_refuses_a_wait(
    electric: TestServer, client: AsyncClient
) -> None:
    hosted = Worker(waking_app(), [electric.address], worker_id="w-wake-fail")
    async with anyio.create_task_group() as tg:
        await tg.start(hosted.run)
        await client.spawn("boss/b2")
        await client.send("boss/b2", "fail")
        [_, woken] = await runs(client, "boss/b2", 2)
        assert woken["output"] == "woken by /worker/b2: failed "
        await client.spawn("boss/b3")
        both = await client.send("boss/b3", "both", wait="run", timeout=WAIT_S)
        assert both.output == "delegated"  # the refused call sent nothing: one send, one wake
        [_, woken] = await runs(client, "boss/b3", 2)
        assert woken["output"] == "woken by /worker/b3: completed did both"
        await hosted.shutdown(0)


async def test_a_wake_to_a_parent_awaiting_input_is_its_reply(
    electric: TestServer, client: AsyncClient
) -> None:
    """The parent asked (ctx.ask) after delegating; the child's end comes while it awaits input:
    as any next message, the wake is the reply, and the asking run resumes with it (it was
    once dropped unread, since its write needs the asking message first)."""
    hosted = Worker(waking_app(), [electric.address], worker_id="w-wake-ask")
    async with anyio.create_task_group() as tg:
        await tg.start(hosted.run)
        await client.spawn("boss/q1")
        asked = await client.send("boss/q1", "ask", wait="run", timeout=WAIT_S)
        assert asked.status == "input_required"
        await holding(client, "slow/q1")
        await client.signal("slow/q1", "SIGUSR")
        [done] = await runs(client, "boss/q1", 1)
        sent = [e for e in (await client.events("slow/q1", 0, limit=100)).events if e.type == "message"]
        assert done["output"] == f"replied: /slow/q1 ended its run of {sent[0].key}: completed (completed)"
        assert (await client.get("boss/q1")).awaiting_input is None
        await hosted.shutdown(0)


async def holding(client: AsyncClient, ref: str) -> None:
    with anyio.fail_after(WAIT_S):
        async for event in client.watch(ref, 0):
            if event.type == "holding":
                return


async def test_a_wake_to_a_busy_parent_that_rejects_messages_queues(
    electric: TestServer, client: AsyncClient
) -> None:
    """A type whose policy rejects a message while busy still gets its wake: it queues behind
    the run in progress (it was once refused ENTITY_BUSY and dropped)."""
    hosted = Worker(waking_app(), [electric.address], worker_id="w-wake-busy")
    async with anyio.create_task_group() as tg:
        await tg.start(hosted.run)
        await client.spawn("strict/s1")
        first = await client.send("strict/s1", "go", wait="run", timeout=WAIT_S)
        assert first.output == "delegated"
        await client.send("strict/s1", "hold")
        await holding(client, "strict/s1")
        await holding(client, "slow/s1")
        await client.signal("slow/s1", "SIGUSR")  # the child's end comes while the parent holds
        with anyio.fail_after(WAIT_S):
            async for event in client.watch("strict/s1", 0):
                if event.type == "message" and event.value["sender"] == "electric:child":
                    break
        await client.signal("strict/s1", "SIGUSR")
        [_, _, woken] = await runs(client, "strict/s1", 3)
        assert woken["output"] == "woken: completed"
        await hosted.shutdown(0)


def _run_end(key: str) -> Any:
    def decide(current: Any, ctx: Any) -> Mutation:
        run = pb.RunValue(message_key=key, status=pb.RUN_STATUS_COMPLETED, output="done")
        body = event_body(pb.Event(run=run))
        return Mutation([NewEvent("run", f"run_{key}", entity_writes.UPDATE, body)], current)

    return decide


def _await(entry: str) -> Any:
    def decide(current: Any, ctx: Any) -> Mutation:
        # As the commit of the sender's `sent` record with wake leaves it.
        return Mutation([], current.replace(awaited_runs=entry))

    return decide


async def test_a_wake_is_found_in_the_store_after_a_restart_and_delivered_once(
    tmp_path: Path, server_process: Callable[..., ServerProcess]
) -> None:
    data = tmp_path / "data"
    first_server = server_process(data)
    async with AsyncClient(first_server.address) as client:
        await client.spawn("boss/r1")
        await client.spawn("worker/r1", parent="boss/r1")
        receipt = await client.send("worker/r1", "sources")
    first_server.send(signal.SIGKILL)
    first_server.wait()
    # The run's end and the sender's wait, committed with no server to act on them.
    store = SQLiteStore(database_path(data))
    await store.open()
    try:
        await store.write(Write(("worker", "r1"), _run_end(receipt.key)))
        await store.write(Write(("boss", "r1"), _await(f"worker/r1@{receipt.key}@{receipt.offset}")))
    finally:
        await store.close()
    second = server_process(data)
    async with AsyncClient(second.address) as client:
        with anyio.fail_after(WAIT_S):
            async for event in client.watch("boss/r1", 0):
                if event.type == "message":
                    break
        assert event.value["sender"] == "electric:child"
        assert event.value["data"]["status"] == "completed"
        assert event.value["data"]["output"] == "done"
    second.send(signal.SIGKILL)
    second.wait()
    # Once: the same wait found again (a retry after a crash) delivers nothing more.
    store = SQLiteStore(database_path(data))
    await store.open()
    try:
        assert await store.awaiting(10) == []
        await store.write(Write(("boss", "r1"), _await(f"worker/r1@{receipt.key}@{receipt.offset}")))
        await child_wakes.wake_senders(store, await store.awaiting(10))
        events = await store.read_events(("boss", "r1"), 0, 100)
        assert len([e for e in events if e.kind == "message"]) == 1
        assert await store.awaiting(10) == []
    finally:
        await store.close()
