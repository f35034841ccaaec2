"""The portable backend (no POSIX signals: stdin for graceful, the handle's terminate for force),
selected on Linux so its rules run here: the same timing and generation rules as posix."""

from __future__ import annotations

import signal
from datetime import datetime

import pytest
from runtime.rt_support import outcome_of, running_worker, state_is, until

from electric_sdk import AsyncClient
from electric_sdk.runtime import App
from electric_sdk.runtime.exec import ShutdownPolicy, action_hook
from electric_sdk.testing import TestServer

from .support import child, exit_before, line, output, ready, receipts, spawn_and_stop

pytestmark = pytest.mark.anyio


async def test_default_graceful_is_closing_stdin_and_an_exit_needs_no_force(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="t")
    app.exec("p", child("--on-eof", "exit"), backend="portable", grace_period="2s", keep=True)
    got = await spawn_and_stop(client, electric.address, app, "p/a")
    assert [(r["action"], r["action_name"], r["disposition"]) for r in got] == [
        ("start", "", "observed"),
        ("graceful", "stdin:close", "issued"),
        ("exit", "", "observed"),
    ]
    assert all(r["backend"] == "portable" for r in got)
    assert got[1]["group"] is False
    assert "compatibility default" in got[1]["reason"]
    assert got[2]["exit_status"] == 0
    assert "eof" in await output(client, "p/a")


async def test_shutdown_line_then_terminate_exactly_once_after_the_deadline(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="t")
    # Reads the shutdown line but, like a wedged program, keeps running: ignores EOF too.
    app.exec(
        "p",
        child("--on-eof", "ignore", "--on-term", "ignore"),
        backend="portable",
        grace_period="2s",
        keep=True,
        shutdown=ShutdownPolicy("stdin:close", "300ms"),
    )
    app.exec(
        "q",
        child(),
        backend="portable",
        grace_period="2s",
        keep=True,
        shutdown=ShutdownPolicy("stdin:shutdown", "1s"),
    )
    async with running_worker(app, electric.address):
        await client.spawn("p/a")
        await client.spawn("q/a")
        await ready(client, "p/a")
        await ready(client, "q/a")
        await client.signal("p/a", "SIGTERM")
        await client.signal("q/a", "SIGTERM")
        await until(client, "p/a", state_is("stopped", "cleanup_complete"))
        await until(client, "q/a", state_is("stopped", "cleanup_complete"))
    p = await receipts(client, "p/a")
    assert [(r["action"], r["action_name"]) for r in p] == [
        ("start", ""),
        ("graceful", "stdin:close"),
        ("force", "terminate"),
        ("exit", ""),
    ]
    assert datetime.fromisoformat(p[2]["issued_at"]) >= datetime.fromisoformat(p[1]["deadline"])
    assert p[3]["exit_status"] == -signal.SIGKILL
    assert p[3]["escalated"] is True
    q = await receipts(client, "q/a")
    assert [(r["action"], r["action_name"]) for r in q] == [
        ("start", ""),
        ("graceful", "stdin:shutdown"),
        ("exit", ""),
    ]
    assert 'got {"control": "shutdown"}' in await output(client, "q/a")


async def test_signals_without_an_equivalent_are_refused_and_said(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="t")
    app.exec("p", child(), backend="portable", keep=True)
    async with running_worker(app, electric.address):
        await client.spawn("p/a")
        await ready(client, "p/a")
        result = await client.signal("p/a", "SIGUSR")
        update = await until(client, "p/a", outcome_of(result.key))
        await client.send("p/a", "after")
        await until(client, "p/a", line("got after"))
    assert update.value["outcome"] == "ignored"
    assert "portable backend has no SIGUSR1" in update.value["detail"]
    forward = [r for r in await receipts(client, "p/a") if r["action"] == "forward"]
    assert [(r["action_name"], r["disposition"]) for r in forward] == [("SIGUSR1", "refused")]
    assert not any(ln.startswith("signal") for ln in await output(client, "p/a"))


async def test_portable_pre_action_race_holds(electric: TestServer, client: AsyncClient) -> None:
    app = App(code_version="t")
    app.exec(
        "p",
        child(),
        backend="portable",
        grace_period="2s",
        keep=True,
        shutdown=ShutdownPolicy("stdin:close", "1s"),
    )

    with action_hook(exit_before("graceful")):
        got = await spawn_and_stop(client, electric.address, app, "p/a")
    assert [(r["action"], r["disposition"]) for r in got] == [
        ("start", "observed"),
        ("graceful", "held"),
        ("exit", "observed"),
    ]
    assert "eof" not in await output(client, "p/a")  # stdin was never closed on it
