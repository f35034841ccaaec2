"""Calls to other A2A agents (issue 49, point 1, its last part; issue 48's ``downstream``):
``ctx.call_agent`` against a real agent written with the official ``a2a-sdk`` server (JSON-RPC
over HTTP, uvicorn on loopback). The agent reports over loopback when a task started and when it
was asked to cancel; every wait is on those reports and on the stream."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from conftest import Leases

from electric_sdk import AsyncClient
from electric_sdk.errors import StepFailed
from electric_sdk.lifecycle import Stage
from electric_sdk.models import SignalResult
from electric_sdk.runtime import App, Context, Message
from electric_sdk.runtime.a2a_calls import A2AAgent
from electric_sdk.testing import TestServer

from .mcp_support import Sightings, free_port, sightings
from .rt_support import running_worker, until

pytestmark = [pytest.mark.anyio]

AGENT = Path(__file__).with_name("a2a_agent_app.py")


@pytest.fixture
def leases() -> Leases:
    """5 s leases: an agent process starting on a loaded machine must not see a lease lapse."""
    return Leases(ttl_ms=5_000, heartbeat_ms=100)


@asynccontextmanager
async def a2a_agent(found: Sightings) -> AsyncIterator[str]:
    port = free_port()
    async with await anyio.open_process([sys.executable, str(AGENT), str(port), str(found.port)]) as proc:
        try:
            await found.wait("-", "listening")
            yield f"http://127.0.0.1:{port}/"
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()


def _app(url: str) -> App:
    app = App("a2a-calls", code_version="t")
    helper = app.a2a_agent("helper", url=url, cancel_bound="300ms")

    class Agent:
        async def on_message(self, ctx: Context, message: Message) -> None:
            try:
                answer = await ctx.call_agent(helper, message.text, timeout="1h")
            except StepFailed as exc:  # the task ended failed: the step failed, and says why
                await ctx.emit("refused", str(exc))
                return
            await ctx.emit("answer", answer)

    app.entity("agent", grace_period="20s", idle_timeout="1h")(Agent)
    app.entity("cutter", grace_period="20s", idle_timeout="1h", sigterm_interrupts=True)(
        type("Cutter", (Agent,), {})
    )
    return app


def _downstream(result: SignalResult) -> str:
    (report,) = [r for r in result.stages if r.stage is Stage.DOWNSTREAM]
    assert report.reached, report
    return report.detail


async def test_a_call_answers_with_the_tasks_end(electric: TestServer, client: AsyncClient) -> None:
    async with sightings() as found, a2a_agent(found) as url, running_worker(_app(url), electric.address):
        await client.spawn("agent/e1")
        await client.send("agent/e1", "echo hi")
        answer = (await until(client, "agent/e1", lambda e: e.type == "answer")).value["data"]
        assert answer["state"] == "completed"
        assert answer["text"] == "echo hi"
        assert answer["task"]
        events = (await client.events("agent/e1", 0, 100)).events
        records = [e.value["data"] for e in events if e.type == "electric.a2a"]
        assert [r["phase"] for r in records] == ["started", "ended"]
        assert records[1]["task"] == answer["task"]
        # The call is a recorded step: its result is in the stream, for a replay to answer from.
        assert any("a2a:helper" in str(e.value) for e in events if e.type != "electric.a2a")
        # A finished call is not cancelled by a later SIGINT.
        result = await client.signal("agent/e1", "SIGINT", wait="downstream", timeout="30s")
        assert _downstream(result) == "no MCP call, A2A call or child entity in flight"


async def test_a_failed_task_fails_the_step(electric: TestServer, client: AsyncClient) -> None:
    async with sightings() as found, a2a_agent(found) as url, running_worker(_app(url), electric.address):
        await client.spawn("agent/f1")
        await client.send("agent/f1", "fail f1")
        refused = await until(client, "agent/f1", lambda e: e.type == "refused")
        assert "A2A agent helper: task" in refused.value["data"]
        assert "failed" in refused.value["data"]


@pytest.mark.parametrize("signal", ["SIGINT", "SIGTERM", "SIGKILL"])
async def test_a_signal_sends_the_agent_cancel_task(
    signal: str, electric: TestServer, client: AsyncClient
) -> None:
    ref = "cutter/c1" if signal == "SIGTERM" else "agent/c1"
    tag = f"hold-{signal}"
    async with sightings() as found, a2a_agent(found) as url, running_worker(_app(url), electric.address):
        await client.spawn(ref)
        await client.send(ref, f"hold {tag}")
        await found.wait(tag, "started")
        kw = {"interrupt": True} if signal == "SIGTERM" else {}
        result = await client.signal(ref, signal, wait="downstream", timeout="30s", **kw)
        await found.wait(tag, "cancel")  # the agent was asked to cancel its task
    detail = _downstream(result)
    if signal == "SIGKILL":  # a killed entity refuses writes: the cancel is sent, unrecorded
        assert "cancelled unrecorded" in detail
    else:
        assert "A2A helper task" in detail
        assert "cancelled" in detail
        assert signal in detail
        assert "the agent answered canceled" in str(
            [e.value for e in (await client.events(ref, 0, 200)).events if e.type == "electric.a2a"]
        )


async def test_an_agent_that_never_answers_the_cancel_passes_its_bound(
    electric: TestServer, client: AsyncClient
) -> None:
    async with sightings() as found, a2a_agent(found) as url, running_worker(_app(url), electric.address):
        await client.spawn("agent/s1")
        await client.send("agent/s1", "stubborn stubborn-s1")
        await found.wait("stubborn-s1", "started")
        result = await client.signal("agent/s1", "SIGINT", wait="downstream", timeout="30s")
        await found.wait("stubborn-s1", "cancel")
    detail = _downstream(result)
    assert "bound_passed" in detail, detail
    records = [
        e.value["data"] for e in (await client.events("agent/s1", 0, 200)).events if e.type == "electric.a2a"
    ]
    assert records[-1]["phase"] == "bound_passed"
    assert "no answer to CancelTask within 0.3s" in records[-1]["reason"]


def test_an_agent_is_declared_with_a_url() -> None:
    with pytest.raises(ValueError, match="http"):
        A2AAgent("x", "ftp://nowhere")
    with pytest.raises(ValueError, match="no '/'"):
        A2AAgent("a/b", "http://127.0.0.1:1/")
    app = App("twice")
    app.a2a_agent("x", url="http://127.0.0.1:1/")
    with pytest.raises(ValueError, match="declared twice"):
        app.a2a_agent("x", url="http://127.0.0.1:1/")
