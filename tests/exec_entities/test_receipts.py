"""Receipts name everything: the task, the generation evidence (checked against the real process),
the action class and name, when it was issued, the deadline, escalation, and why a hold happened.
`electric events` and `electric get` show them readably."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime

import anyio
import pytest
from runtime.rt_support import running_worker, state_is, until

from electric_sdk import AsyncClient
from electric_sdk.runtime import App
from electric_sdk.runtime.exec import ShutdownPolicy
from electric_sdk.runtime.exec.evidence import boot_id, start_time
from electric_sdk.testing import TestServer

from .support import child, line, ready, receipt, receipts

pytestmark = pytest.mark.anyio


def electric_cli(server: TestServer, *args: str) -> str:
    env = {**os.environ, "ELECTRIC_ADDRESS": server.address, "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "electric_sdk.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def shown_off_loop(server: TestServer, *args: str) -> str:
    """``electric_cli`` on a thread: the worker in this process keeps its heartbeats meanwhile."""
    return await anyio.to_thread.run_sync(lambda: electric_cli(server, *args))


async def test_receipts_name_the_task_the_evidence_the_action_and_the_deadline(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="t")
    app.exec(
        "rcpt", child("--on-term", "ignore"), grace_period="1s", keep=True, tags=["nightly"],
        shutdown=ShutdownPolicy("SIGTERM", "250ms"),
    )  # fmt: skip
    async with running_worker(app, electric.address) as worker:
        await client.spawn("rcpt/a")
        pid = await ready(client, "rcpt/a")
        live_start = start_time(pid)  # read while it runs: the evidence must match the kernel's
        before = datetime.now(UTC)
        term = await client.signal("rcpt/a", "SIGTERM", reason="maintenance")
        await until(client, "rcpt/a", state_is("stopped"))
        await until(client, "rcpt/a", receipt("exit"))
        shown = electric_cli(electric, "get", "rcpt/a")
        shown_json = json.loads(electric_cli(electric, "--json", "get", "rcpt/a"))
        lines = electric_cli(electric, "events", "rcpt/a")
    start, graceful, force, exit_ = await receipts(client, "rcpt/a")
    evidence = {
        "task_id": "rcpt/a",
        "generation": 1,
        "pid": pid,
        "start_time": live_start,
        "boot_id": boot_id(),
        "worker_id": worker.worker_id,
    }
    for r in (start, graceful, force, exit_):
        assert r["task_id"] == "rcpt/a"
        assert r["generation"] == evidence
        assert r["backend"] == "posix"
    assert start["tags"] == ["nightly"]
    assert (graceful["action"], graceful["action_name"], graceful["disposition"]) == (
        "graceful",
        "SIGTERM",
        "issued",
    )
    assert graceful["signal_key"] == force["signal_key"] == term.key
    assert graceful["group"] is True
    assert graceful["timeout_ms"] == 250
    issued = datetime.fromisoformat(graceful["issued_at"])
    assert before <= issued
    assert (datetime.fromisoformat(graceful["deadline"]) - issued).total_seconds() == pytest.approx(
        0.25, abs=0.002
    )
    assert graceful["escalated"] is False
    assert (force["action"], force["action_name"], force["escalated"]) == ("force", "SIGKILL", True)
    assert force["deadline"] == graceful["deadline"]
    assert "still running at the deadline" in force["reason"]
    assert exit_["exit_status"] == -9
    assert exit_["escalated"] is True
    # The CLI, for people and for scripts.
    assert "process" in shown
    assert f"generation  1: pid {pid}, ended (killed by SIGKILL" in shown
    assert "last act    force SIGKILL issued" in shown
    assert shown_json["process"]["generation"] == evidence
    assert shown_json["process"]["running"] is False
    assert (
        f"graceful SIGTERM issued → gen 1 pid {pid} (start {live_start}) group timeout 250ms deadline"
        in lines
    )
    assert "exit observed → gen 1" in lines
    assert "stdout gen 1: ready pid=" in lines


async def test_get_shows_the_last_act_on_the_current_generation(
    electric: TestServer, client: AsyncClient
) -> None:
    """An act on generation 1 says nothing of generation 2: `get` shows none until one is made on
    it. And `get` names the worker whose runtime holds the entity (and so runs its process)."""
    app = App(code_version="t")
    app.exec("acts", child(), grace_period="2s", keep=True)
    async with running_worker(app, electric.address) as worker:
        await client.spawn("acts/a")
        await ready(client, "acts/a")
        await client.signal("acts/a", "SIGUSR")
        await until(client, "acts/a", receipt("forward", "issued", "SIGUSR1"))
        await client.send("acts/a", "exit 0")  # generation 1 exits on its own
        await until(client, "acts/a", state_is("idle", "process_exited"))
        await client.send("acts/a", "hello")  # wakes it: generation 2 reads it
        await until(client, "acts/a", line("got hello"))
        fresh = json.loads(await shown_off_loop(electric, "--json", "get", "acts/a"))
        shown = await shown_off_loop(electric, "get", "acts/a")
        await client.signal("acts/a", "SIGHUP")
        await until(client, "acts/a", receipt("forward", "issued", "SIGHUP"))
        acted = json.loads(await shown_off_loop(electric, "--json", "get", "acts/a"))
    assert fresh["process"]["generation"]["generation"] == 2
    assert fresh["process"]["running"] is True
    assert fresh["process"]["last_action"] is None
    assert "    last act    none on generation 2" in shown.splitlines()
    assert f"  worker        {worker.worker_id} (session " in shown
    assert fresh["holder"]["worker_id"] == worker.worker_id
    last = acted["process"]["last_action"]
    assert (last["action"], last["action_name"], last["generation"]["generation"]) == ("forward", "SIGHUP", 2)
