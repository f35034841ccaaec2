"""A generation is its whole process group (systemd's ``KillMode=control-group``): what the main
process leaves in its group gets the shutdown policy too (graceful, timeout, one force, with
receipts), its `exit` receipt comes only once the group is empty, and no process of a stopped
entity outlives it. The worker is a child subreaper, so what the main process leaves behind is
re-parented to the worker, not to PID 1."""

from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path

import pytest
from runtime.rt_support import running_worker, state_is, until

from electric_sdk import AsyncClient
from electric_sdk.runtime import App
from electric_sdk.runtime.exec import ShutdownPolicy
from electric_sdk.testing import TestServer

from .pidns import Namespace, needs_pid_namespace
from .support import CHILD, alive, child, line, logged, ready, receipts

pytestmark = pytest.mark.anyio
# The receipts of a generation whose group outlived the graceful action's timeout.
FORCED = [("start", "observed"), ("graceful", "issued"), ("force", "issued"), ("exit", "observed")]


async def test_what_the_process_left_in_its_group_is_forced_with_it(
    electric: TestServer, client: AsyncClient
) -> None:
    """On SIGTERM the main process forks a process that ignores SIGTERM into its group, then exits:
    the generation is not over; at the deadline the group gets the one force, then `exit`."""
    app = App(code_version="t")
    app.exec(
        "swap",
        child("--on-term", "replace"),
        grace_period="2s",
        shutdown=ShutdownPolicy("SIGTERM", "300ms"),
    )
    async with running_worker(app, electric.address):
        await client.spawn("swap/a")
        pid = await ready(client, "swap/a")
        await client.signal("swap/a", "SIGTERM")
        await until(client, "swap/a", state_is("stopped", "cleanup_complete"))
        got = await receipts(client, "swap/a")
        assert [(r["action"], r["disposition"]) for r in got] == FORCED
        force, exit_ = got[2], got[3]
        left = re.search(r"1 process left in its group \(pid (\d+)\) at the deadline", force["reason"])
        assert left is not None, force["reason"]
        replacement = int(left.group(1))
        assert not alive(replacement)  # before the worker stops: the entity's end is the group's
    assert force["group"] is True
    assert exit_["exit_status"] == 0  # the main process's own exit
    assert exit_["escalated"] is True
    assert exit_["generation"]["pid"] == pid


async def test_a_natural_exit_gives_what_is_left_in_the_group_the_policy(
    electric: TestServer, client: AsyncClient, tmp_path: Path
) -> None:
    """The main process exits on its own, leaving a process in its group: that process gets the
    graceful action (it exits on it: no force), then the entity goes idle (`process_exited`)."""
    log = tmp_path / "signals.log"
    app = App(code_version="t")
    app.exec("daemon", child("--log", str(log)), grace_period="2s", shutdown=ShutdownPolicy("SIGINT", "1s"))
    async with running_worker(app, electric.address):
        await client.spawn("daemon/a")
        await ready(client, "daemon/a")
        await client.send("daemon/a", "stray")
        said = await until(client, "daemon/a", line("stray pid="))
        stray = int(said.value["text"].split("stray pid=", 1)[1].split()[0])
        await client.send("daemon/a", "exit 3")
        await until(client, "daemon/a", state_is("idle", "process_exited"))
        assert not alive(stray)
    got = await receipts(client, "daemon/a")
    assert [(r["action"], r["disposition"], r["action_name"]) for r in got] == [
        ("start", "observed", ""),
        ("graceful", "issued", "SIGINT"),
        ("exit", "observed", ""),
    ]
    graceful, exit_ = got[1], got[2]
    assert graceful["group"] is True
    assert (
        f"its main process exited (exit status 3); 1 process left in its group (pid {stray})"
        in (graceful["reason"])
    )
    assert exit_["exit_status"] == 3
    assert exit_["escalated"] is False
    assert logged(log, stray) == []  # SIGINT ended it, as it does by default


@needs_pid_namespace
async def test_no_process_of_the_entity_outlives_its_worker(
    ns: Namespace, electric: TestServer, client: AsyncClient, tmp_path: Path
) -> None:
    """In a PID namespace of its own, every process there is can be seen. The process the main
    process leaves in its group is re-parented to the worker (a subreaper), not to the namespace's
    init, and the main process stays unreaped while its group lives. The worker stops while the
    policy runs on what is left (its grace cuts the policy short: the group is forced): nothing of
    the entity is left."""
    tasks = tmp_path / "tasks.toml"
    command = json.dumps([sys.executable, "-u", CHILD, "--on-term", "replace"])
    tasks.write_text(
        f'[[exec]]\nid = "swap"\ncommand = {command}\nkeep = true\ngrace_period = "20s"\n'
        '[exec.shutdown]\ngraceful = "SIGTERM"\ntimeout = "10s"\n'
    )
    worker = ns.worker(tasks, electric.address, "w1", grace="200ms")
    await client.spawn("swap/a")
    pid = await ready(client, "swap/a")
    ns.ask(op="kill", pid=pid, sig=signal.SIGTERM)  # not the entity's: its process forks and exits
    assert ns.ask(op="exited", pid=pid)["state"] == "Z"  # kept unreaped: its group is not empty
    [left] = [p for p in ns.procs() if p["pgrp"] == pid and p["pid"] != pid]
    replacement = left["pid"]
    assert left["ppid"] == worker  # not 1: the worker is a subreaper
    ns.ask(op="kill", pid=worker, sig=signal.SIGTERM)
    assert ns.ask(op="gone", pid=worker)["gone"]
    assert [p["pid"] for p in ns.procs()] == [1]
    got = await receipts(client, "swap/a")
    assert [(r["action"], r["disposition"]) for r in got] == FORCED
    assert (
        f"its main process exited (exit status 0); 1 process left in its group (pid {replacement})"
        in (got[1]["reason"])
    )
    assert "hosting ended (worker shutdown)" in got[2]["reason"]
