"""The MCP face (issue 49, point 2; docs/mcp.md) with the official MCP client, on stdio
(``electric mcp`` as a process) and on the door's streamable HTTP (``/mcp``): the tools listed,
a send that waits for its run, a send cancelled mid-run (a SIGINT scoped to its message,
recorded, the run aborted) and a connection dropped mid-run (the run goes on and completes).
Every wait is on the probe's gates and on the entity's stream."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import psutil
import pytest
from conftest import Leases

from electric_sdk import AsyncClient, Event
from electric_sdk.runtime import App, Context, Message
from electric_sdk.testing import TestServer

from .rt_support import Probe, probe_app, running_worker

pytestmark = [pytest.mark.anyio]
ROOT = Path(__file__).resolve().parents[2]
CLIENT = Path(__file__).with_name("mcp_face_client.py")
TOOLS = ["list", "get", "spawn", "send", "signal", "events"]
# A bound on each wait, generous: on a loaded 2-core machine a face process's start and a run's
# first step have taken over rt_support's 10 s. Every wait still ends on its event.
WAIT_S = 60.0


async def _until(client: AsyncClient, ref: str, predicate: Any, start: int = 0) -> Event:
    """The first event of the entity's stream (from ``start``) that matches."""
    with anyio.fail_after(WAIT_S):
        async for event in client.watch(ref, start):
            if predicate(event):
                return event
    raise AssertionError(f"{ref}: the stream ended before the awaited event")


@pytest.fixture
def leases() -> Leases:
    """5 s leases: nothing here is about a lease lapsing, and a face started as a process on a
    loaded machine could otherwise see a short lease lapse mid-run."""
    return Leases(ttl_ms=5_000, heartbeat_ms=100)


@asynccontextmanager
async def stdio_session(address: str, *more: str) -> AsyncIterator[Any]:
    """The official client's session with ``electric mcp --address ADDRESS MORE`` on stdio."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    args = ["-m", "electric_sdk.cli.main", "mcp", "--address", address, *more]
    async with AsyncExitStack() as stack:
        read, write = await stack.enter_async_context(
            stdio_client(StdioServerParameters(command=sys.executable, args=args))
        )
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        yield session


@asynccontextmanager
async def http_session(url: str, token: str | None = None) -> AsyncIterator[Any]:
    """The official client's session with the door's /mcp (streamable HTTP)."""
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=30))
        read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        yield session


@pytest.fixture
def door(tmp_path: Path, database_url: str | None) -> Iterator[TestServer]:
    """A server whose HTTP door serves the MCP face (``--http``, ``--mcp``)."""
    with TestServer(
        tmp_path / "door",
        http="127.0.0.1:0",
        mcp=True,
        lease_ttl_ms=5_000,
        heartbeat_interval_ms=100,
        database_url=database_url,
    ) as server:
        yield server


def _answer(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    answer: dict[str, Any] = json.loads(result.content[0].text)
    assert answer == result.structured_content
    return answer


async def test_stdio_lists_the_tools_and_refuses_bad_input(electric: TestServer, client: AsyncClient) -> None:
    async with stdio_session(electric.address) as session:
        listed = await session.list_tools()
        assert [t.name for t in listed.tools] == TOOLS
        send = next(t for t in listed.tools if t.name == "send")
        assert send.input_schema["required"] == ["ref"]
        # An unknown argument is refused before anything is sent, with the door's reason.
        refused = await session.call_tool("spawn", {"ref": "probe/x", "colour": "red"})
        assert refused.is_error
        assert refused.structured_content["error"]["code"] == "UNKNOWN_FIELD"
        shaped = await session.call_tool("spawn", {"ref": "probe/x", "profile": "long"})
        assert shaped.is_error
        assert shaped.structured_content["error"]["code"] == "INVALID_FIELD"
        with pytest.raises(Exception, match="no tool 'launch'"):
            await session.call_tool("launch", {})
        missing = await session.call_tool("get", {"ref": "probe/nope"})
        assert missing.is_error
        assert missing.structured_content["error"]["code"] == "ENTITY_NOT_FOUND"
    assert await client.list() == []


async def test_stdio_send_waits_for_the_run(electric: TestServer, client: AsyncClient) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address), stdio_session(electric.address) as session:
        spawned = _answer(await session.call_tool("spawn", {"ref": "probe/s1"}))
        assert spawned["state"] == "spawning"
        some = anyio.Event()

        async def progress(value: float, total: float | None, message: str | None) -> None:
            some.set()

        answer = _answer(
            await session.call_tool("send", {"ref": "probe/s1", "text": "hi"}, progress_callback=progress)
        )
        assert answer["run"]["status"] == "completed"
        assert answer["run"]["output"] == "done hi"
        with anyio.fail_after(WAIT_S):  # the run's records came as progress (called back in a task)
            await some.wait()
        got = _answer(await session.call_tool("get", {"ref": "probe/s1"}))
        assert got["state"] in {"running", "idle"}
        page = _answer(await session.call_tool("events", {"ref": "probe/s1", "limit": 3}))
        assert len(page["events"]) == 3
        listed = _answer(await session.call_tool("list", {"type": "probe"}))
        assert [e["url"] for e in listed["entities"]] == ["/probe/s1"]


async def _cancel_mid_run(session: Any, client: AsyncClient, probe: Probe, ref: str) -> None:
    """Send ``hold``, cancel the call once its step is open; SIGINT recorded, run aborted."""
    await client.spawn(ref)
    async with anyio.create_task_group() as tg:

        async def call() -> None:
            await session.call_tool("send", {"ref": ref, "text": "hold"})

        tg.start_soon(call)
        with anyio.fail_after(WAIT_S):
            await probe.entered.wait()
        tg.cancel_scope.cancel()  # the SDK sends notifications/cancelled (and aborts an HTTP POST)
    sigint = await _until(client, ref, lambda e: e.type == "signal" and e.value.get("signal") == "SIGINT")
    assert sigint.value["message_key"]
    assert "MCP client" in sigint.value["reason"]
    assert "cancelled its send" in sigint.value["reason"]
    aborted = await _until(
        client, ref, lambda e: e.type == "run" and e.value.get("status") == "aborted", sigint.offset
    )
    assert aborted.value["message_key"] == sigint.value["message_key"]


async def test_stdio_cancel_is_a_sigint_of_the_message(electric: TestServer, client: AsyncClient) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address), stdio_session(electric.address) as session:
        await _cancel_mid_run(session, client, probe, "probe/c1")


async def _drop_mid_run(client: AsyncClient, probe: Probe, ref: str, *argv: str) -> None:
    """The client process killed mid-call: no cancel is sent, so the run goes on and completes."""
    await client.spawn(ref)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = await anyio.open_process(
        [sys.executable, str(CLIENT), *argv, ref, "hold"], env=env, cwd=ROOT, stdout=None, stderr=None
    )
    try:
        with anyio.fail_after(WAIT_S):
            await probe.entered.wait()
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGKILL)
        with anyio.fail_after(WAIT_S):
            await proc.wait()
        # A stdio face notices the drop: it ends once its stdin closes.
        _gone, alive = await anyio.to_thread.run_sync(lambda: psutil.wait_procs(children, timeout=WAIT_S))
        assert not alive, alive
        probe.release.set()
        done = await _until(client, ref, lambda e: e.type == "run" and e.value.get("status") == "completed")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    events = (await client.events(ref, 0, 1000)).events
    assert not [e for e in events if e.type == "signal" and e.value.get("signal") == "SIGINT"]
    assert done.value["output"] == "partial more"


async def test_stdio_drop_detaches_the_run(electric: TestServer, client: AsyncClient) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address):
        await _drop_mid_run(client, probe, "probe/d1", "stdio", electric.address)


async def test_http_lists_the_tools_and_sends_and_waits(door: TestServer) -> None:
    probe = Probe()
    async with (
        door.async_client() as client,
        running_worker(probe_app(probe), door.address),
        http_session(f"{door.http_address}/mcp") as session,
    ):
        listed = await session.list_tools()
        assert [t.name for t in listed.tools] == TOOLS
        _answer(await session.call_tool("spawn", {"ref": "probe/h1"}))
        answer = _answer(await session.call_tool("send", {"ref": "probe/h1", "text": "hi"}))
        assert answer["run"]["status"] == "completed"
        assert answer["run"]["output"] == "done hi"
        # A refusal is the door's own: its reason, nothing written.
        refused = await session.call_tool("signal", {"ref": "probe/h1", "signal": "SIGFOO"})
        assert refused.is_error
        assert refused.structured_content["error"]["code"] == "UNKNOWN_SIGNAL"
        # Past its timeout a send answers that the run has not ended; the message stays delivered.
        waited = _answer(
            await session.call_tool("send", {"ref": "probe/h1", "text": "hold", "timeout": "200ms"})
        )
        assert waited["run"]["ended"] is False
        probe.release.set()
        key = waited["key"]
        done = await _until(client, "probe/h1", lambda e: e.type == "run" and e.value.get("message_key") == key
                           and e.value.get("status") == "completed")  # fmt: skip
        assert done.value["output"] == "partial more"


def _talker() -> App:
    """``talker``: a run of two steps, each reporting ``progress`` as it goes."""
    app = App("mcp-face-talker", code_version="t")

    @app.entity("talker")
    class Talker:
        async def on_message(self, ctx: Context, message: Message) -> None:
            for n in (1, 2):
                async with ctx.step(f"tool:part{n}"):
                    await ctx.emit("progress", {"message": f"part {n} of 2"})
            ctx.output.write("spoke")

    return app


async def test_http_send_reports_the_run_as_progress(door: TestServer) -> None:
    seen: list[tuple[float, str]] = []
    last = anyio.Event()

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, message or ""))
        if message == "part 2 of 2":
            last.set()

    async with (
        running_worker(_talker(), door.address),
        http_session(f"{door.http_address}/mcp") as session,
    ):
        _answer(await session.call_tool("spawn", {"ref": "talker/p1"}))
        answer = _answer(
            await session.call_tool("send", {"ref": "talker/p1", "text": "go"}, progress_callback=progress)
        )
        assert answer["run"]["output"] == "spoke"
        with anyio.fail_after(WAIT_S):  # the client calls back in tasks of its own
            await last.wait()
    messages = [m for _, m in seen]
    assert "part 1 of 2" in messages
    assert "run started" in messages
    assert sorted(v for v, _ in seen) == list(range(1, len(seen) + 1))  # each counted once


@pytest.mark.both_stores
async def test_http_cancel_is_a_sigint_of_the_message(door: TestServer) -> None:
    probe = Probe()
    async with (
        door.async_client() as client,
        running_worker(probe_app(probe), door.address),
        http_session(f"{door.http_address}/mcp") as session,
    ):
        await _cancel_mid_run(session, client, probe, "probe/hc1")


async def test_http_2026_closing_the_stream_is_the_cancel(door: TestServer) -> None:
    """On 2026-07-28 HTTP (no session, one POST per request) the client cancels by closing the
    request's response stream: the same SIGINT of the message."""
    from mcp import Client

    probe = Probe()
    async with (
        door.async_client() as client,
        running_worker(probe_app(probe), door.address),
        Client(f"{door.http_address}/mcp", mode="2026-07-28") as modern,
    ):
        assert [t.name for t in (await modern.list_tools()).tools] == TOOLS
        await _cancel_mid_run(modern, client, probe, "probe/m1")


async def test_a_draining_door_detaches_a_2026_send(tmp_path: Path) -> None:
    """The server stopping ends a 2026-07-28 send whose stream closing would be the client's
    cancel: the run is left alone, no SIGINT is written (read back after a restart on the same
    data)."""
    from mcp import Client

    probe = Probe()
    data = tmp_path / "drained"
    server = TestServer(data, http="127.0.0.1:0", mcp=True, lease_ttl_ms=5_000).start()
    try:
        async with running_worker(probe_app(probe), server.address), server.async_client() as client:
            await client.spawn("probe/dr1")
            async with Client(f"{server.http_address}/mcp", mode="2026-07-28") as modern:
                async with anyio.create_task_group() as tg:

                    async def call() -> None:
                        with contextlib.suppress(Exception):  # the server goes away under it
                            await modern.call_tool("send", {"ref": "probe/dr1", "text": "hold"})

                    tg.start_soon(call)
                    with anyio.fail_after(WAIT_S):
                        await probe.entered.wait()
                    await anyio.to_thread.run_sync(server.stop)
                    tg.cancel_scope.cancel()
                probe.release.set()
    finally:
        server.stop()
    with TestServer(data) as again:
        async with again.async_client() as client:
            events = (await client.events("probe/dr1", 0, 1000)).events
    assert [e for e in events if e.type == "message"]
    assert not [e for e in events if e.type == "signal" and e.value.get("signal") == "SIGINT"]


async def test_http_drop_detaches_the_run(door: TestServer) -> None:
    probe = Probe()
    async with door.async_client() as client, running_worker(probe_app(probe), door.address):
        await _drop_mid_run(client, probe, "probe/hd1", "http", f"{door.http_address}/mcp")


TOKENS = """
[[tokens]]
token = "admin-token"
principal = "admin"
scopes = ["admin"]

[[tokens]]
token = "alice-token"
principal = "alice"
scopes = ["read", "send", "signal"]

[[tokens]]
token = "sender-token"
principal = "sender"
scopes = ["send"]

[[tokens]]
token = "reader-token"
principal = "reader"
scopes = ["read"]
"""


async def test_bearer_tokens_and_scopes_apply(tmp_path: Path) -> None:
    import httpx

    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    probe = Probe()
    with TestServer(
        tmp_path / "secured", http="127.0.0.1:0", mcp=True, tokens_file=tokens, lease_ttl_ms=5_000
    ) as server:
        url = f"{server.http_address}/mcp"
        async with httpx.AsyncClient() as http:
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                refused = await http.post(
                    url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=headers
                )
                assert refused.status_code == 401
                assert refused.headers["www-authenticate"] == "Bearer"
                assert refused.json()["error"]["code"] == "UNAUTHENTICATED"
        async with (
            server.async_client(token="admin-token") as client,
            running_worker(probe_app(probe), server.address, token="admin-token"),
        ):
            async with http_session(url, "reader-token") as session:
                assert [t.name for t in (await session.list_tools()).tools] == TOOLS
                denied = await session.call_tool("spawn", {"ref": "probe/t1"})
                assert denied.is_error
                assert denied.structured_content["error"]["code"] == "MISSING_SCOPE"
            async with http_session(url, "sender-token") as session:
                _answer(await session.call_tool("spawn", {"ref": "probe/t0"}))
                # The send waits by reading the stream: without `read` it is refused, nothing sent.
                blind = await session.call_tool("send", {"ref": "probe/t0", "text": "hi"})
                assert blind.is_error
                assert blind.structured_content["error"]["code"] == "MISSING_SCOPE"
            async with stdio_session(server.address, "--token", "sender-token") as session:
                blind = await session.call_tool("send", {"ref": "probe/t0", "text": "hi"})
                assert blind.is_error
                assert blind.structured_content["error"]["code"] == "MISSING_SCOPE"
            assert not [e for e in (await client.events("probe/t0")).events if e.type == "message"]
            assert [e.ref.url for e in await client.list()] == ["/probe/t0"]  # nothing else written
            async with http_session(url, "alice-token") as session:
                await _cancel_mid_run(session, client, probe, "probe/t2")
            sigint = await _until(
                client, "probe/t2", lambda e: e.type == "signal" and e.value["signal"] == "SIGINT"
            )
            assert sigint.value["sender"] == "alice"


# The MCP inspector's CLI, installed from npm by name into its own prefix (npm prunes what a
# prefix's install did not ask for, so not beside the Makefile's buf in .tools).
INSPECTOR_VERSION = "2.12.0"
INSPECTOR_PREFIX = ROOT / ".tools" / "mcp-inspector"
INSPECTOR = INSPECTOR_PREFIX / "node_modules" / ".bin" / "mcp-inspector"


@pytest.fixture(scope="module")
def inspector() -> Path:
    if not INSPECTOR.exists():
        if shutil.which("npm") is None:
            if os.environ.get("CI") == "true":
                pytest.fail(
                    "the MCP inspector is installed from npm, and Node.js/npm is missing: CI must run it"
                )
            pytest.skip("Node.js/npm is not installed: the MCP inspector (installed from npm) cannot be")
        INSPECTOR_PREFIX.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--silent", "--prefix", str(INSPECTOR_PREFIX), "--no-save", "--no-audit", "--no-fund",
             f"@modelcontextprotocol/inspector@{INSPECTOR_VERSION}"],
            check=True,
            timeout=600,
        )  # fmt: skip
    return INSPECTOR


def _inspector_tools(inspector: Path, *target: str) -> list[str]:
    """``mcp-inspector --cli TARGET --method tools/list --strict``: the tools' names (strict: a
    schema its portability check warns of fails the call)."""
    done = subprocess.run(
        [str(inspector), "--cli", *target, "--method", "tools/list", "--strict"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "Warning: tool" not in done.stderr, done.stderr  # its schema portability check
    return [tool["name"] for tool in json.loads(done.stdout)["tools"]]


def test_the_inspector_lists_the_tools(inspector: Path, tmp_path: Path) -> None:
    with TestServer(tmp_path / "inspected", http="127.0.0.1:0", mcp=True) as server:
        assert _inspector_tools(inspector, f"{server.http_address}/mcp", "--transport", "http") == TOOLS
        stdio = [sys.executable, "-m", "electric_sdk.cli.main", "mcp", "--address", server.address]
        assert _inspector_tools(inspector, *stdio) == TOOLS


def test_mcp_needs_http(tmp_path: Path) -> None:
    from electric_server import ElectricServer, ServerConfig
    from electric_server.config_error import ConfigError

    with pytest.raises(ConfigError, match="--mcp needs --http"):
        ElectricServer(ServerConfig(data_dir=tmp_path, mcp=True))


def test_the_tools_are_generated_from_the_route_table() -> None:
    from electric_server.http.mcp_tools import render

    text = (ROOT / "electric_sdk" / "mcp_face" / "tools.json").read_text(encoding="utf-8")
    assert text == render(), "stale: run `python scripts/genmcptools.py`"
