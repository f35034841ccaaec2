"""Messages become runs: STARTED (attempt, message key and offset), a STEP per step, COMPLETED or
FAILED; custom events and history; a handler that raises gets the outcome `failed`."""

from __future__ import annotations

import pytest
from helpers import emitter_app

from electric_sdk import AsyncClient
from electric_sdk.runtime import App, Context, Message, SignalInfo
from electric_sdk.testing import TestServer

from .rt_support import (
    COMPLETED,
    FAILED,
    STARTED,
    STEP,
    Probe,
    outcome_of,
    probe_app,
    run_status,
    running_worker,
    state_is,
    until,
)

pytestmark = pytest.mark.anyio


async def test_message_runs_to_completion(electric: TestServer, client: AsyncClient) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address):
        await client.spawn("probe/a")
        receipt = await client.send("probe/a", "hi")
        done = await until(client, "probe/a", run_status(COMPLETED, receipt.key))
        assert done.raw.run.output == "done hi"
        events = (await client.events("probe/a", 0, 100)).events
        started = next(e for e in events if e.type == "run" and e.raw.run.status == STARTED)
        assert (started.raw.run.attempt, started.raw.run.message_key) == (1, receipt.key)
        assert started.raw.run.message_offset == receipt.offset
        steps = [e.raw.run.step for e in events if e.type == "run" and e.raw.run.status == STEP]
        assert steps == ["tool:quick"]
        assert any(state_is("running", "started")(e) for e in events)
        assert (await client.get("probe/a")).state.value == "running"
    assert probe.log == ["start hi attempt=1", "end hi"]


async def test_emit_history_failure_and_a_failing_handler(electric: TestServer, client: AsyncClient) -> None:
    app = App(code_version="test")

    @app.entity("tool")
    async def tool(ctx: Context, message: Message) -> str:
        if message.text == "boom":
            raise RuntimeError("the tool broke")
        await ctx.emit("note", {"text": message.text})
        history = await ctx.history()
        return ",".join(e.type for e in history)

    @tool.on_signal(handles=["SIGUSR"])
    async def on_signal(ctx: Context, signal: SignalInfo) -> None:
        raise ValueError(f"cannot handle {signal.payload}")

    async with running_worker(app, electric.address):
        await client.spawn("tool/t")
        ok = await client.send("tool/t", "hello")
        done = await until(client, "tool/t", run_status(COMPLETED, ok.key))
        seen = done.raw.run.output.split(",")  # the message may land before or after `started`
        assert sorted(seen[:3]) == ["message", "state", "state"]
        assert seen[3:] == ["run", "note"]
        note = await until(client, "tool/t", lambda e: e.type == "note")
        assert note.value == {"data": {"text": "hello"}}
        bad = await client.send("tool/t", "boom")
        failed = await until(client, "tool/t", run_status(FAILED, bad.key))
        assert failed.raw.run.error == "RuntimeError: the tool broke"
        usr = await client.usr("tool/t", 7)
        outcome = await until(client, "tool/t", outcome_of(usr.key, "failed"))
        assert outcome.value["detail"] == "ValueError: cannot handle 7"
        # Still running, still taking messages.
        again = await client.send("tool/t", "again")
        await until(client, "tool/t", run_status(COMPLETED, again.key))


async def test_an_emit_the_server_refuses_raises_in_the_handler(
    electric: TestServer, client: AsyncClient
) -> None:
    """A custom event type the server takes no record of (a built-in type, a control character)
    raises InvalidArgument where ``ctx.emit`` was called, not a log line the handler never sees."""
    async with running_worker(emitter_app(), electric.address):
        await client.spawn("emitter/e")
        for kind, said in [
            ("state", "INVALID_EVENT_TYPE"),
            ("two\nlines", "INVALID_EVENT_TYPE"),
            ("fine", "kept"),
        ]:
            sent = await client.send("emitter/e", kind)
            done = await until(client, "emitter/e", run_status(COMPLETED, sent.key))
            assert done.raw.run.output.startswith(said), done.raw.run.output
        types = [e.type for e in (await client.events("emitter/e", 0, 100)).events]
        assert types.count("fine") == 1
        assert "two\nlines" not in types
