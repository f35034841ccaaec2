"""Double texting: what a message does while a run is in progress, per type and per message.

A real server (SQLite, and PostgreSQL for ``both_stores``; two replicas on one PostgreSQL for
the races) and a real worker process hosting one type per policy. Each test holds a run open
in a step that never ends (it announces itself with a ``holding`` record, which the test waits
for), then sends the second message; waits are on the stream, never sleeps.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from electric_sdk import AsyncClient, Event
from electric_sdk.errors import EntityBusy, FailedPrecondition, InvalidArgument
from electric_sdk.testing import TestServer

from .rt_support import ABORTED, COMPLETED, STEP, app_module, run_status, until, worker_processes

pytestmark = [pytest.mark.anyio]

WAIT_S = 30.0

APP = """
import anyio
from electric_sdk.runtime import App

app = App(code_version="busy")


async def work(ctx, message):
    if not message.text.startswith("peek"):
        ctx.state["notes"].append(message.text)
    if message.text.startswith("hold"):
        await ctx.emit("holding", {"message": message.key})
        async with ctx.step("tool:hold"):
            await anyio.sleep_forever()
    ctx.output.write("done " + message.text)


app.entity("plain", idle_timeout="1h")(work)
app.entity("rejecting", idle_timeout="1h", on_busy="reject")(work)
app.entity("interrupting", idle_timeout="1h", on_busy="interrupt")(work)
app.entity("rolling", idle_timeout="1h", on_busy="rollback")(work)
app.entity("chooser", idle_timeout="1h", on_busy_choices=["interrupt"])(work)


@app.entity("steerable", idle_timeout="1h", on_busy="steer")
class Steerable:
    go = None

    async def on_message(self, ctx, message):
        if message.text == "work":  # takes the first steering message at its first recorded step
            await ctx.emit("holding", {"message": message.key})
            async with ctx.step("tool:first"):
                pass
            taken = await ctx.take_steer(wait=True)
            ctx.output.write(f"steered by {taken.text}")
        elif message.text == "crash":  # takes one, then holds on its first attempt only
            await ctx.emit("holding", {"message": message.key})
            async with ctx.step("tool:first"):
                pass
            taken = await ctx.take_steer(wait=True)
            if ctx.attempt == 1:
                await ctx.emit("took", {"text": taken.text})
                async with ctx.step("tool:hold"):
                    await anyio.sleep_forever()
            ctx.output.write(f"steered by {taken.text} on attempt {ctx.attempt}")
        elif message.text == "ignore":  # holds until SIGUSR, taking no steering
            self.go = anyio.Event()
            await ctx.emit("holding", {"message": message.key})
            async with ctx.step("tool:wait"):
                await self.go.wait()
            ctx.output.write("ignored")
        else:
            ctx.output.write("done " + message.text)

    async def on_signal(self, ctx, signal):
        if self.go is not None:
            self.go.set()
"""


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    cwd = app_module(tmp_path, "busy_app", APP)
    with worker_processes(cwd, "busy_app:app") as start:
        yield start


@pytest.fixture
async def hosted(electric: TestServer, start_worker: Callable[..., Any]) -> AsyncIterator[AsyncClient]:
    start_worker(electric.address)
    async with AsyncClient(electric.address) as client:
        yield client


def holding(event: Event) -> bool:
    return event.type == "holding"


async def hold(client: AsyncClient, ref: str, text: str = "hold") -> str:
    """Spawn ``ref``, start a run that holds, and wait until it holds in its step (the step's
    record is its last write until it ends): its message's key."""
    await client.spawn(ref)
    receipt = await client.send(ref, text)
    await until(client, ref, holding, receipt.offset)
    await until(client, ref, run_of(receipt.key, STEP), receipt.offset)
    return receipt.key


def run_of(key: str, status: int) -> Callable[[Event], bool]:
    return run_status(status, key)


@pytest.mark.both_stores
async def test_reject_refuses_a_busy_entitys_message_and_writes_nothing(hosted: AsyncClient) -> None:
    await hold(hosted, "rejecting/r1")
    head = (await hosted.get("rejecting/r1")).head_offset
    with pytest.raises(EntityBusy) as refused:
        await hosted.send("rejecting/r1", "second")
    assert refused.value.code == "ENTITY_BUSY"
    assert refused.value.status == "FAILED_PRECONDITION"
    assert refused.value.metadata["policy"] == "reject"
    assert (await hosted.get("rejecting/r1")).head_offset == head  # nothing written
    # The message's own choice: enqueue goes behind the run, whatever the type says.
    queued = await hosted.send("rejecting/r1", "third", policy="enqueue")
    assert queued.policy == "enqueue"


@pytest.mark.both_stores
async def test_interrupt_aborts_the_run_in_its_own_write_and_runs_next(hosted: AsyncClient) -> None:
    held = await hold(hosted, "interrupting/i1")
    receipt = await hosted.send("interrupting/i1", "second")
    assert receipt.policy == "interrupt"
    assert receipt.signal_key
    events = (await hosted.events("interrupting/i1", 0, limit=1000)).events
    signal = [e for e in events if e.key == receipt.signal_key]
    # Inserted and settled `aborted` in the message's own commit, just before the message.
    assert [e.operation for e in signal] == ["insert", "update"]
    assert signal[-1].value["outcome"] == "aborted"
    assert signal[-1].value["signal"] == "SIGINT"
    assert signal[-1].value["sender"] == "anonymous"
    assert "on_busy=interrupt" in signal[-1].value["reason"]
    assert signal[-1].offset + 1 == receipt.offset
    await until(hosted, "interrupting/i1", run_of(held, ABORTED))
    done = await until(hosted, "interrupting/i1", run_of(receipt.key, COMPLETED))
    assert done.value["output"] == "done second"


async def electric_state(address: str, ref: str) -> bytes:
    """`electric state REF --json`'s output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTRIC_")}
    args = [sys.executable, "-m", "electric_sdk.cli.main", "--address", address, "--json", "state", ref]
    done = await anyio.run_process(args, env=env)
    return done.stdout


@pytest.mark.both_stores
async def test_rollback_restores_the_state_from_before_the_aborted_run(
    electric: TestServer, hosted: AsyncClient
) -> None:
    await hosted.spawn("rolling/b1")
    first = await hosted.send("rolling/b1", "kept", wait="run", timeout=WAIT_S)
    assert first.status == "completed"
    before = await hosted.state("rolling/b1")
    assert before == {"notes": ["kept"]}
    printed_before = await electric_state(electric.address, "rolling/b1")
    start = (await hosted.get("rolling/b1")).head_offset
    receipt = await hosted.send("rolling/b1", "hold")
    await until(hosted, "rolling/b1", holding, start)
    peek = await hosted.send("rolling/b1", "peek", policy="rollback")
    assert peek.policy == "rollback"
    await until(hosted, "rolling/b1", run_of(peek.key, COMPLETED))
    assert await hosted.state("rolling/b1") == before
    assert await electric_state(electric.address, "rolling/b1") == printed_before
    events = (await hosted.events("rolling/b1", start, limit=1000)).events
    states = [(e.offset, e.value["data"]) for e in events if e.type == "electric.state"]
    restore = [(offset, data) for offset, data in states if "restore" in data]
    assert len(restore) == 1
    restored_at, record = restore[0]
    assert record["restore"] == {"policy": "rollback", "signal": peek.signal_key}
    assert record["run"] == receipt.key
    # Append-only: the aborted run's own change is still in the stream, before its restore.
    assert any(
        op == ["append", "notes", "hold"]
        for offset, data in states
        if offset < restored_at
        for op in data["ops"]
    )


@pytest.mark.both_stores
async def test_a_message_chooses_only_what_its_type_allows(hosted: AsyncClient) -> None:
    held = await hold(hosted, "plain/p1")
    with pytest.raises(FailedPrecondition) as refused:
        await hosted.send("plain/p1", "x", policy="interrupt")
    assert refused.value.code == "BUSY_POLICY_NOT_ALLOWED"
    with pytest.raises(EntityBusy):
        await hosted.send("plain/p1", "x", policy="reject")  # always a message's own choice
    with pytest.raises(InvalidArgument) as unknown:
        await hosted.send("plain/p1", "x", policy="shout")
    assert unknown.value.code == "INVALID_BUSY_POLICY"
    queued = await hosted.send("plain/p1", "queued")  # the type's: enqueue
    assert queued.policy == "enqueue"
    assert not queued.signal_key
    # A type that lists interrupt among its choices lets a message interrupt.
    chooser = await hold(hosted, "chooser/c1")
    jump = await hosted.send("chooser/c1", "now", policy="interrupt")
    assert jump.policy == "interrupt"
    await until(hosted, "chooser/c1", run_of(chooser, ABORTED))
    await until(hosted, "chooser/c1", run_of(jump.key, COMPLETED))
    events = (await hosted.events("plain/p1", 0, limit=1000)).events
    assert not [
        e for e in events if e.type == "run" and e.key == f"run_{held}" and e.value["status"] == "aborted"
    ]


async def test_an_idle_entity_takes_any_policy_as_enqueue(hosted: AsyncClient) -> None:
    await hosted.spawn("rejecting/idle")
    first = await hosted.send("rejecting/idle", "one", wait="run", timeout=WAIT_S)
    assert first.status == "completed"
    second = await hosted.send("rejecting/idle", "two", wait="run", timeout=WAIT_S)
    assert second.receipt.policy == "enqueue"
    assert second.status == "completed"


@pytest.fixture
def second_replica(electric: TestServer, database_url: str | None, tmp_path: Path) -> Iterator[TestServer]:
    """Another replica on the first one's PostgreSQL database."""
    assert database_url is not None
    with TestServer(tmp_path / "replica-b", database_url=database_url) as server:
        yield server


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("kind", ["rejecting", "interrupting"])
async def test_two_messages_racing_through_two_replicas(
    hosted: AsyncClient, second_replica: TestServer, kind: str
) -> None:
    """Two messages sent at once, one through each replica, while a run holds: the store
    linearizes them, each judged against the record the other left. Reject: both refused.
    Interrupt: one aborts the held run, the other aborts the first one's (if it had started)
    or queues behind it; exactly one SIGINT aborts the held run."""
    ref = f"{kind}/race"
    held = await hold(hosted, ref)
    head = (await hosted.get(ref)).head_offset
    results: dict[str, Any] = {}
    async with AsyncClient(second_replica.address) as other:

        async def send(name: str, client: AsyncClient) -> None:
            try:
                results[name] = await client.send(ref, name)
            except EntityBusy as exc:
                results[name] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(send, "via-a", hosted)
            tg.start_soon(send, "via-b", other)
    if kind == "rejecting":
        assert all(isinstance(r, EntityBusy) for r in results.values()), results
        assert (await hosted.get(ref)).head_offset == head
        return
    receipts = sorted(results.values(), key=lambda r: r.offset)
    assert receipts[0].policy == "interrupt"
    await until(hosted, ref, run_of(held, ABORTED))
    events = (await hosted.events(ref, 0, limit=1000)).events
    aborted_held = [
        e
        for e in events
        if e.type == "signal" and e.operation == "update" and held in e.value.get("detail", "")
    ]
    assert len(aborted_held) == 1
    assert aborted_held[0].key == receipts[0].signal_key
    # The last message runs to its end: nothing holds it (its text is not "hold").
    await until(hosted, ref, run_of(receipts[1].key, COMPLETED))


async def test_reject_over_http_and_the_cli(tmp_path: Path, start_worker: Callable[..., Any]) -> None:
    """The HTTP door answers a rejected message 409 with the RFC's error body; `electric send`
    exits 4 saying ENTITY_BUSY; `--policy` is the message's own choice."""
    with TestServer(tmp_path / "door", http="127.0.0.1:0") as server:
        start_worker(server.address)
        async with AsyncClient(server.address) as client:
            await hold(client, "rejecting/h1")
            head = (await client.get("rejecting/h1")).head_offset
            async with httpx.AsyncClient(base_url=server.http_address) as http:
                busy = await http.post("/rejecting/h1/messages", json={"text": "x"})
                unknown = await http.post("/rejecting/h1/messages", json={"text": "x", "policy": "shout"})
            assert busy.status_code == 409
            assert busy.json()["error"]["code"] == "ENTITY_BUSY"
            assert busy.json()["error"]["details"]["policy"] == "reject"
            assert unknown.status_code == 400
            assert unknown.json()["error"]["code"] == "INVALID_BUSY_POLICY"
            env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTRIC_")}
            electric = [sys.executable, "-m", "electric_sdk.cli.main", "--address", server.address, "send"]
            refused = await anyio.run_process([*electric, "rejecting/h1", "x"], check=False, env=env)
            assert refused.returncode == 4
            assert b"ENTITY_BUSY" in refused.stderr
            assert (await client.get("rejecting/h1")).head_offset == head  # nothing written, any door
            queued = await anyio.run_process(
                [*electric, "rejecting/h1", "y", "--policy", "enqueue", "--json"], check=False, env=env
            )
            assert queued.returncode == 0, queued.stderr
            assert json.loads(queued.stdout)["policy"] == "enqueue"


@pytest.mark.both_stores
async def test_steer_is_taken_by_the_run_at_its_step(hosted: AsyncClient) -> None:
    held = await hold(hosted, "steerable/s1", "work")
    steer = await hosted.send("steerable/s1", "go left")
    assert steer.policy == "steer"
    done = await until(hosted, "steerable/s1", run_of(held, COMPLETED))
    assert done.value["output"] == "steered by go left"
    taken = await hosted.wait_run(steer, WAIT_S)
    assert taken.status == "steered"
    events = (await hosted.events("steerable/s1", 0, limit=1000)).events
    runs = [e.value for e in events if e.type == "run" and e.value["message_key"] == steer.key]
    assert runs == [
        {
            "message_key": steer.key,
            "message_offset": steer.offset,
            "status": "steered",
            "attempt": 1,
            "steered_into": held,
            "steered_step": 0,
        }
    ]  # consumed at step 0 (the first recorded one), never run on its own
    message = next(e for e in events if e.key == steer.key)
    assert message.value["steer"] is True
    after = await hosted.send("steerable/s1", "after", wait="run", timeout=WAIT_S)
    assert (after.status, after.output) == ("completed", "done after")
    assert not (await hosted.get("steerable/s1")).raw.message_waiting


@pytest.mark.both_stores
async def test_steer_not_taken_runs_as_a_message_after_the_run(hosted: AsyncClient) -> None:
    held = await hold(hosted, "steerable/s2", "ignore")
    late = await hosted.send("steerable/s2", "late")
    assert late.policy == "steer"
    await hosted.usr("steerable/s2")
    await until(hosted, "steerable/s2", run_of(held, COMPLETED))
    result = await hosted.wait_run(late, WAIT_S)
    assert (result.status, result.output) == ("completed", "done late")


@pytest.mark.both_stores
async def test_a_steer_taken_is_taken_again_by_the_runs_next_attempt(
    electric: TestServer, start_worker: Callable[..., Any]
) -> None:
    """The worker dies after its run took a steering message: the run's next attempt, on another
    worker, replays the take from its record (the same message), and the message never runs."""
    first = start_worker(electric.address)
    async with AsyncClient(electric.address) as client:
        held = await hold(client, "steerable/s3", "crash")
        steer = await client.send("steerable/s3", "go right")
        await until(client, "steerable/s3", lambda e: e.type == "took", steer.offset)
        first.kill()
        first.wait(WAIT_S)
        start_worker(electric.address)
        done = await until(client, "steerable/s3", run_of(held, COMPLETED))
        assert done.value["output"] == "steered by go right on attempt 2"
        events = (await client.events("steerable/s3", 0, limit=1000)).events
        statuses = [
            e.value["status"] for e in events if e.type == "run" and e.value["message_key"] == steer.key
        ]
        assert statuses == ["steered"]
