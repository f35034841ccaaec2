"""The exec lifecycle: start on wake, messages as stdin lines, a natural exit goes idle with its
status, the next message starts a new generation, ``keep`` and the idle timeout, bounded output."""

from __future__ import annotations

import sys

import pytest
from runtime.rt_support import COMPLETED, run_status, running_worker, state_is, until

from electric_sdk import AsyncClient
from electric_sdk.runtime import App
from electric_sdk.testing import TestServer

from .support import child, line, output, ready, receipt, receipts

pytestmark = pytest.mark.anyio


async def test_messages_are_stdin_lines_and_a_natural_exit_goes_idle(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="t")
    app.exec("echo", child(), keep=True)
    async with running_worker(app, electric.address):
        await client.spawn("echo/a")
        await ready(client, "echo/a")
        first = await client.send("echo/a", "hello world")
        await until(client, "echo/a", line("got hello world"))
        await until(client, "echo/a", run_status(COMPLETED, first.key))
        await client.send("echo/a", "two\nlines")
        await until(client, "echo/a", line("got two\\nlines"))  # one line: the newline is escaped
        await client.send("echo/a", "exit 3")
        idle = await until(client, "echo/a", state_is("idle", "process_exited"))
        got = await receipts(client, "echo/a")
        assert got[-1]["action"] == "exit"
        assert got[-1]["exit_status"] == 3
        # No automatic restart: the next message starts generation 2.
        await client.send("echo/a", "again")
        await until(client, "echo/a", line("got again"), idle.offset)
    starts = [r for r in await receipts(client, "echo/a") if r["action"] == "start"]
    assert [r["generation"]["generation"] for r in starts] == [1, 2]
    assert starts[0]["generation"]["pid"] != starts[1]["generation"]["pid"]


async def test_idle_timeout_shuts_the_process_down_unless_keep(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="t")
    app.exec("brief", child(), idle_timeout="300ms", grace_period="2s")
    app.exec("kept", child("--exit-after", "1"), idle_timeout="100ms", keep=True)
    async with running_worker(app, electric.address):
        await client.spawn("brief/a")
        await client.spawn("kept/a")
        await until(client, "brief/a", state_is("idle", "idle_timeout"))
        # kept/a outlived many idle timeouts and ended only when its process did.
        await until(client, "kept/a", state_is("idle", "process_exited"))
    brief = await receipts(client, "brief/a")
    assert [r["action"] for r in brief] == ["start", "graceful", "exit"]
    assert brief[1]["reason"].startswith("idle timeout")
    assert brief[2]["exit_status"] == 0
    assert [r["action"] for r in await receipts(client, "kept/a")] == ["start", "exit"]


async def test_output_is_bounded_per_generation(electric: TestServer, client: AsyncClient) -> None:
    app = App(code_version="t")
    script = "import sys\nfor i in range(2000): print('x' * 99)\nsys.stderr.write('err line\\n')\n"
    app.exec("chatty", [sys.executable, "-c", script], keep=True, output_limit=10_000)
    async with running_worker(app, electric.address):
        await client.spawn("chatty/a")
        await until(client, "chatty/a", state_is("idle", "process_exited"))
    events = [e.value for e in (await client.events("chatty/a", 0, limit=1000)).events if e.type == "output"]
    stdout = [e for e in events if e["stream"] == "stdout"]
    kept = sum(len(e["text"]) for e in stdout)
    assert kept == 10_000
    assert stdout[-1]["truncated"] is True
    assert stdout[-1]["dropped_bytes"] == 200_000 - 10_000
    assert "err line" in await output(client, "chatty/a")
    assert len(stdout) < 20  # chunks, not a write per line


async def test_process_that_cannot_start_is_a_refused_start_receipt(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="t")
    app.exec("missing", ["/nonexistent/program"], keep=True)
    async with running_worker(app, electric.address):
        await client.spawn("missing/a")
        start = await until(client, "missing/a", receipt("start", "refused"))
        await until(client, "missing/a", state_is("idle", "process_exited"))
    assert "cannot start" in start.value["reason"]


async def test_a_draining_worker_shuts_its_processes_down_and_the_next_worker_starts_a_new_generation(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="t")
    app.exec("svc", child(), keep=True, grace_period="2s")
    async with running_worker(app, electric.address) as first:
        await client.spawn("svc/a")
        await ready(client, "svc/a")
        await first.shutdown(1.0)
    got = await receipts(client, "svc/a")
    assert [(r["action"], r["disposition"]) for r in got] == [
        ("start", "observed"),
        ("graceful", "issued"),
        ("exit", "observed"),
    ]
    assert got[1]["reason"].startswith("the worker is draining")
    assert (await client.get("svc/a")).state.value == "running"  # unleased: the next worker takes it
    async with running_worker(app, electric.address):
        head = (await client.get("svc/a")).head_offset
        await until(client, "svc/a", receipt("start", "observed"), head)
    starts = [r for r in await receipts(client, "svc/a") if r["action"] == "start"]
    assert [r["generation"]["generation"] for r in starts] == [1, 2]
