"""Messages sent ahead of the queue: an ``interrupt`` (or ``rollback``) that aborted the run in
progress, and the reply to a run that asked for input, run next, before the messages queued
before them; those then run in their order (server/electric_server/core/message_cursor.py).

A real server (SQLite, and PostgreSQL for ``both_stores``) and real worker processes; waits are
on the stream, never sleeps. The order a test asserts is the order of the runs' `started`
records, which the server writes and refuses out of order (``MESSAGE_BEHIND``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from electric_sdk import AsyncClient, Event
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk.runtime import App, Worker
from electric_sdk.testing import TestServer

from .rt_support import (
    COMPLETED,
    STARTED,
    STEP,
    TIMEOUT_S,
    app_module,
    run_status,
    running_worker,
    until,
    worker_processes,
)

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]

WAIT_S = 30.0

APP = """
import anyio
from electric_sdk.runtime import App

app = App(code_version="ahead")


class Held:
    # Runs whose text starts with "hold" wait in a step for a SIGUSR ("once": on their first
    # attempt only); "ask" waits the same way, then asks.
    go = None

    async def on_message(self, ctx, message):
        once = message.text.endswith("once") and ctx.attempt > 1
        if message.text.startswith(("hold", "ask")) and message.reply is None and not once:
            self.go = anyio.Event()
            await ctx.emit("holding", {"message": message.key})
            async with ctx.step("tool:hold"):
                await self.go.wait()
        if message.text.startswith("ask"):
            answer = await ctx.ask("which one?")
            ctx.output.write("answered " + answer)
            return
        ctx.output.write("done " + message.text)

    async def on_signal(self, ctx, signal):
        if self.go is not None:
            self.go.set()


app.entity("interrupting", idle_timeout="1h", on_busy="interrupt")(Held)
app.entity("rolling", idle_timeout="1h", on_busy="rollback")(Held)
app.entity("asking", idle_timeout="1h")(Held)
"""


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    cwd = app_module(tmp_path, "ahead_app", APP)
    with worker_processes(cwd, "ahead_app:app") as start:
        yield start


@pytest.fixture
async def client(electric: TestServer) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(electric.address) as client:
        yield client


async def holds(client: AsyncClient, ref: str, key: str, after: int) -> None:
    """Wait until the run of message ``key`` holds in its step."""
    await until(client, ref, lambda e: e.type == "holding" and e.value["data"]["message"] == key, after)
    await until(client, ref, run_status(STEP, key), after)


async def started_order(client: AsyncClient, ref: str) -> list[tuple[str, int]]:
    """(message key, attempt) of each run's `started` record, in stream order."""
    events = (await client.events(ref, 0, limit=1000)).events
    return [
        (e.value["message_key"], e.value.get("attempt", 1))
        for e in events
        if e.type == "run" and e.value["status"] == "started"
    ]


def messages(events: list[Event]) -> dict[str, dict[str, Any]]:
    return {e.key: e.value for e in events if e.type == "message"}


@pytest.mark.parametrize("kind", ["interrupting", "rolling"])
async def test_an_aborting_message_runs_ahead_of_those_queued_before_it(
    electric: TestServer, start_worker: Callable[..., Any], client: AsyncClient, kind: str
) -> None:
    start_worker(electric.address)
    ref = f"{kind}/a1"
    await client.spawn(ref)
    held = await client.send(ref, "hold")
    await holds(client, ref, held.key, held.offset)
    queued = [await client.send(ref, text, policy="enqueue") for text in ("first", "second")]
    assert [q.policy for q in queued] == ["enqueue", "enqueue"]
    jump = await client.send(ref, "jump")
    assert jump.policy == ("interrupt" if kind == "interrupting" else "rollback")
    await until(client, ref, run_status(COMPLETED, queued[-1].key), jump.offset)
    assert await started_order(client, ref) == [
        (held.key, 1),
        (jump.key, 1),
        (queued[0].key, 1),
        (queued[1].key, 1),
    ]
    events = (await client.events(ref, 0, limit=1000)).events
    sent = messages(events)
    assert sent[jump.key].get("ahead") is True  # the stream says why it ran first
    assert not any(sent[q.key].get("ahead") for q in queued)
    ended = {e.value["message_key"]: e.value for e in events if e.type == "run" and e.operation == "update"}
    assert [ended[q.key]["output"] for q in queued] == ["done first", "done second"]
    assert (await client.get(ref)).state.value == "running"


async def test_a_message_sent_ahead_with_nothing_queued_is_not_marked(
    electric: TestServer, start_worker: Callable[..., Any], client: AsyncClient
) -> None:
    start_worker(electric.address)
    await client.spawn("interrupting/a2")
    held = await client.send("interrupting/a2", "hold")
    await holds(client, "interrupting/a2", held.key, held.offset)
    jump = await client.send("interrupting/a2", "jump")
    await until(client, "interrupting/a2", run_status(COMPLETED, jump.key), jump.offset)
    sent = messages((await client.events("interrupting/a2", 0, limit=1000)).events)
    assert "ahead" not in sent[jump.key]  # it was next anyway


async def test_the_queue_it_passed_survives_a_worker_lost_mid_run(
    electric: TestServer, start_worker: Callable[..., Any], client: AsyncClient
) -> None:
    """The worker dies while the message sent ahead runs: the next worker is given the queue it
    passed and it again, runs it first (its second attempt), then the queue in order."""
    first = start_worker(electric.address)
    ref = "interrupting/a3"
    await client.spawn(ref)
    held = await client.send(ref, "hold")
    await holds(client, ref, held.key, held.offset)
    queued = await client.send(ref, "first", policy="enqueue")
    jump = await client.send(ref, "hold once")
    await holds(client, ref, jump.key, jump.offset)
    first.kill()
    first.wait(WAIT_S)
    start_worker(electric.address)
    await until(client, ref, run_status(COMPLETED, queued.key), jump.offset)
    assert await started_order(client, ref) == [
        (held.key, 1),
        (jump.key, 1),
        (jump.key, 2),
        (queued.key, 1),
    ]
    again = await client.send(ref, "last", wait="run", timeout=WAIT_S)  # and on it goes, in order
    assert again.status == "completed"


async def test_a_reply_runs_ahead_of_the_messages_queued_before_it(
    electric: TestServer, start_worker: Callable[..., Any], client: AsyncClient
) -> None:
    start_worker(electric.address)
    ref = "asking/q1"
    await client.spawn(ref)
    asking = await client.send(ref, "ask")
    await holds(client, ref, asking.key, asking.offset)
    later = await client.send(ref, "hold")  # queued: runs once the asking run has asked
    last = await client.send(ref, "last")
    await client.signal(ref, "SIGUSR")  # the asking run asks, and its run ends
    await holds(client, ref, later.key, later.offset)
    reply = await client.send(ref, "blue")
    await client.signal(ref, "SIGUSR")  # `later` ends; the reply runs before `last`
    await until(client, ref, run_status(COMPLETED, last.key), reply.offset)
    order = [key for key, _ in await started_order(client, ref)]
    assert order == [asking.key, later.key, reply.key, last.key]
    events = (await client.events(ref, 0, limit=1000)).events
    sent = messages(events)
    assert sent[reply.key]["reply"] == {"ask_key": asking.key, "text": "blue"}
    assert sent[reply.key]["ahead"] is True
    outputs = {e.value["message_key"]: e.value.get("output") for e in events if e.type == "run"}
    assert outputs[reply.key] == "answered blue"


class AheadInFlight(Worker):
    """A real worker whose delivery of a message sent ahead is held, and whose STARTED for
    ``first`` waits until that delivery is here, then lets it in just as the write goes out: the
    ahead message lands while that write is out, and the server refuses it (MESSAGE_BEHIND) for
    the message this host has by then."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.first = ""
        self.held: list[rt.ConnectResponse] = []
        self.ahead_held = anyio.Event()
        self.raced = anyio.Event()

    async def _handle(self, response: rt.ConnectResponse) -> None:
        event = response.delivery.event if response.WhichOneof("msg") == "delivery" else None
        if event is not None and event.message.ahead and not self.raced.is_set():
            self.held.append(response)
            self.ahead_held.set()
            return
        await super()._handle(response)

    async def write(self, request: rt.RuntimeWrite) -> rt.WriteResult:
        op = request.run if request.WhichOneof("op") == "run" else None
        if (
            op is not None
            and op.status == STARTED
            and op.message_key == self.first
            and not self.raced.is_set()
        ):
            with anyio.fail_after(TIMEOUT_S):
                await self.ahead_held.wait()
            self.raced.set()
            for response in self.held:
                await super()._handle(response)
        return await super().write(request)


async def test_an_ahead_message_delivered_while_a_refused_start_is_out_runs_then_the_queue(
    electric: TestServer, client: AsyncClient, tmp_path: Path
) -> None:
    """The worker starts `first` as the message sent ahead of it arrives; the server refuses that
    start (MESSAGE_BEHIND) for the message the worker now has: it runs that one, then the queue,
    rather than waiting for yet another delivery that never comes."""
    namespace: dict[str, Any] = {}
    exec(compile(APP, "ahead_app.py", "exec"), namespace)
    app = namespace["app"]
    assert isinstance(app, App)
    worker = AheadInFlight(app, electric.address)
    async with running_worker(app, electric.address, worker=worker):
        ref = "interrupting/race"
        await client.spawn(ref)
        held = await client.send(ref, "hold")
        await holds(client, ref, held.key, held.offset)
        queued = [await client.send(ref, text, policy="enqueue") for text in ("first", "second")]
        worker.first = queued[0].key
        jump = await client.send(ref, "jump")
        await until(client, ref, run_status(COMPLETED, queued[-1].key), jump.offset)
        assert worker.raced.is_set()
        assert [key for key, _ in await started_order(client, ref)] == [
            held.key,
            jump.key,
            *(q.key for q in queued),
        ]
