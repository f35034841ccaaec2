"""MCP tool calls (issue 48, point 2): ``ctx.call_tool`` against real MCP servers written with
the official SDK, on stdio (a subprocess) and streamable HTTP (uvicorn on loopback). The server
reports over loopback when a slow call started and when it saw its cancel; every wait is on
those reports and on the stream."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
import pytest
from conftest import Leases

from electric_sdk import AsyncClient
from electric_sdk.lifecycle import Stage
from electric_sdk.models import SignalResult
from electric_sdk.runtime import App, Context, Message
from electric_sdk.runtime.mcp import McpServer
from electric_sdk.testing import TestServer

from .mcp_support import Sightings, http_server, sightings, stdio_command
from .rt_support import running_worker, until

pytestmark = [pytest.mark.anyio]


@pytest.fixture
def leases() -> Leases:
    """5 s leases: nothing here is about a lease lapsing, and an MCP server starting on a loaded
    machine (a Python subprocess) could otherwise see a 0.6 s lease lapse mid-call."""
    return Leases(ttl_ms=5_000, heartbeat_ms=100)


def _app(found: Sightings, url: str = "") -> App:
    app = App("mcp-calls", code_version="t")
    tools = app.mcp_server("tools", url=url) if url else app.mcp_server("tools", command=stdio_command(found))

    class Agent:
        async def on_message(self, ctx: Context, message: Message) -> None:
            if message.text == "fast":
                found = await ctx.call_tool(tools, "fast", {"text": "hi"}, timeout="30s")
                await ctx.emit("answer", found)
                return
            await ctx.call_tool(tools, "slow", {"tag": message.text}, timeout="1h")

    app.entity("agent", grace_period="20s", idle_timeout="1h")(Agent)
    cutter = type("Cutter", (Agent,), {})
    app.entity("brief", grace_period="1s", idle_timeout="1h")(type("Brief", (Agent,), {}))
    app.entity("cutter", grace_period="20s", idle_timeout="1h", sigterm_interrupts=True)(cutter)
    return app


def _downstream(result: SignalResult) -> str:
    (report,) = [r for r in result.stages if r.stage is Stage.DOWNSTREAM]
    assert report.reached, report
    return report.detail


async def _cut(client: AsyncClient, found: Sightings, ref: str, signal: str) -> SignalResult:
    tag = ref.replace("/", "-")
    await client.spawn(ref)
    await client.send(ref, tag)
    await found.wait(tag, "started")
    await until(client, ref, lambda e: e.type == "progress")  # progress reaches the stream
    kw = {"interrupt": True} if signal == "SIGTERM" else {}
    result = await client.signal(ref, signal, wait="downstream", timeout="30s", **kw)
    await found.wait(tag, "cancelled")  # the server saw the cancel
    # The runtime names the signal in the cancel it sends.
    await found.wait("reason", "SIGTERM_(interrupted_mid-step)" if signal == "SIGTERM" else signal)
    return result


@pytest.mark.parametrize("signal", ["SIGINT", "SIGTERM", "SIGKILL"])
async def test_a_signal_cancels_the_stdio_call_in_flight(
    signal: str, electric: TestServer, client: AsyncClient
) -> None:
    ref = "cutter/c1" if signal == "SIGTERM" else "agent/c1"
    async with sightings() as found, running_worker(_app(found), electric.address):
        result = await _cut(client, found, ref, signal)
    detail = _downstream(result)
    if signal == "SIGKILL":  # a killed entity refuses writes: the call is cancelled unrecorded
        assert "cancelled unrecorded" in detail
    else:
        assert "tools/slow cancelled" in detail
        assert signal in detail


async def test_the_grace_deadline_cancels_the_call_sigterm_waited_for(
    electric: TestServer, client: AsyncClient
) -> None:
    """A plain SIGTERM waits for the step; its grace deadline (1 s) cuts it, and the server
    sees the cancel."""
    async with sightings() as found, running_worker(_app(found), electric.address):
        await client.spawn("brief/g1")
        await client.send("brief/g1", "brief-g1")
        await found.wait("brief-g1", "started")
        result = await client.terminate("brief/g1", wait="downstream", timeout="30s")
        await found.wait("brief-g1", "cancelled")
        await found.wait("reason", "SIGTERM_(the_grace_period_ran_out_mid-step;_no_cleanup_ran)")
    # The record races the server's own end of the entity: written, or refused and said so.
    detail = _downstream(result)
    assert "tools/slow cancelled (SIGTERM (the grace period" in detail or "cancelled unrecorded" in detail


async def test_sigint_cancels_the_http_call_in_flight(electric: TestServer, client: AsyncClient) -> None:
    async with (
        sightings() as found,
        http_server(found) as url,
        running_worker(_app(found, url), electric.address),
    ):
        result = await _cut(client, found, "agent/h1", "SIGINT")
    assert "tools/slow cancelled (SIGINT)" in _downstream(result)


async def test_a_finished_call_gets_no_cancel(electric: TestServer, client: AsyncClient) -> None:
    async with sightings() as found, running_worker(_app(found), electric.address):
        await client.spawn("agent/f1")
        await client.send("agent/f1", "fast")
        answer = await until(client, "agent/f1", lambda e: e.type == "answer")
        assert answer.value == {"data": [{"type": "text", "text": "echo hi"}]}
        result = await client.signal("agent/f1", "SIGINT", wait="downstream", timeout="30s")
        assert _downstream(result) == "no MCP call, A2A call or child entity in flight"
        events = (await client.events("agent/f1", 0, 100)).events
        phases = [e.value["data"]["phase"] for e in events if e.type == "electric.mcp"]
        assert phases == ["started", "ended"]
        # The same session's next slow call is cut: a cancel for the finished one would come first.
        await _cut(client, found, "agent/f2", "SIGINT")
    assert [what for (tag, what) in found.seen if what == "cancelled"] == ["cancelled"]


# Two of these fill a server's input pipe (64 KiB) behind a tool that stopped its reading.
BIG = "x" * 512 * 1024


def _stalling_app(found: Sightings, stalled: anyio.Event, release: Path) -> App:
    app = App("mcp-stall", code_version="t")
    tools = app.mcp_server("tools", command=stdio_command(found), cancel_bound="300ms")

    @app.entity("staller", grace_period="20s", idle_timeout="1h")
    class Staller:
        async def on_message(self, ctx: Context, message: Message) -> None:
            async def fill() -> None:
                await stalled.wait()  # the server's loop is blocked: these two are never read
                await asyncio.gather(
                    ctx.call_tool(tools, "fast", {"text": BIG}), ctx.call_tool(tools, "sink", {"data": BIG})
                )

            stall = ctx.call_tool(tools, "stall", {"tag": message.text, "release": str(release)})
            await asyncio.gather(stall, fill())

    return app


async def test_a_call_whose_server_does_not_take_the_cancel_passes_its_bound(
    electric: TestServer, client: AsyncClient, tmp_path: Path
) -> None:
    """A tool ignores its cancel by blocking its server, whose input fills up: the cancels cannot
    be written. Each cut call is given up on at its server's cancel bound (300 ms, not the SDK's
    own 5 s), recorded ``bound_passed``, and ``downstream`` reports each one."""
    stalled, release = anyio.Event(), tmp_path / "release"
    async with sightings() as found, running_worker(_stalling_app(found, stalled, release), electric.address):
        try:
            await client.spawn("staller/s1")
            await client.send("staller/s1", "s1")
            await found.wait("s1", "started")
            stalled.set()
            await found.wait("s1", "full")  # the SDK's writer is now blocked behind the full pipe
            result = await client.signal("staller/s1", "SIGINT", wait="downstream", timeout="30s")
            records = [
                e
                for e in (await client.events("staller/s1", 0, 500)).events
                if e.type == "electric.mcp" and e.value["data"]["phase"] != "started"
            ]
        finally:
            release.touch()  # the server reads again, and its session closes as usual
    assert result.reached("unwound")
    # Each record's reason is in the message: a call ended early says why it did.
    assert sorted((e.value["data"]["tool"], e.value["data"]["phase"]) for e in records) == [
        ("fast", "bound_passed"),
        ("sink", "bound_passed"),
        ("stall", "bound_passed"),
    ], [(e.value["data"], e.timestamp) for e in records] + [result.stages]
    for record in records:
        assert record.value["data"]["reason"] == "SIGINT; the server did not take the cancel within 0.3s"
        waited_ms = (record.timestamp - result.created_at).total_seconds() * 1000
        # The bound was waited for, and no longer than the SDK's own bound on its cancel write.
        assert 300 <= waited_ms < 5000, waited_ms
    detail = _downstream(result)
    for tool in ("stall", "fast", "sink"):
        assert f"tools/{tool} bound_passed (SIGINT; the server did not take the cancel" in detail
    assert ("s1", "cancelled") not in found.seen  # the server never saw it


def test_a_cancel_bound_is_positive_and_short() -> None:
    app = App("t")
    assert app.mcp_server("a", command=["a"]).cancel_bound_s == 1.0
    assert app.mcp_server("b", command=["b"], cancel_bound="250ms").cancel_bound_s == 0.25
    for bad in ("0s", "2m"):
        with pytest.raises(ValueError, match="cancel_bound"):
            app.mcp_server(f"c{bad}", command=["c"], cancel_bound=bad)


def test_a_server_is_stdio_or_http() -> None:
    with pytest.raises(ValueError, match="one of them"):
        McpServer("x")
    with pytest.raises(ValueError, match="one of them"):
        McpServer("x", command=("a",), url="http://x")
    app = App("t")
    app.mcp_server("x", url="http://127.0.0.1:1/mcp")
    with pytest.raises(ValueError, match="declared twice"):
        app.mcp_server("x", command=["a"])
