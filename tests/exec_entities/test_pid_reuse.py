"""PID reuse, for real: in a PID namespace of its own (``unshare``), the old generation exits and is
reaped, ``ns_last_pid`` is set so that a new, unrelated process takes its PID, and then the entity
is signalled. The new process is never touched, and the receipts say why.

Both ways a generation ends without the runtime still holding it: it exited on its own (killed by
someone else; its worker reaped it), or its worker died (the parent-death signal killed it; the
namespace's init reaped it) and a new worker finds its stored evidence. The entity is paused
first, so that it keeps its state (a lost `running` entity would go idle, where SIGTERM stops it
without any runtime) and its SIGTERM goes to a runtime that must decide what the stored PID means.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest
from runtime.rt_support import state_is, until

from electric_sdk import AsyncClient
from electric_sdk.testing import TestServer

from .pidns import Namespace, needs_pid_namespace
from .support import CHILD, ready, receipt, receipts

pytestmark = [pytest.mark.anyio, needs_pid_namespace]


def _exec_file(tmp: Path) -> Path:
    path = tmp / "tasks.toml"
    command = json.dumps([sys.executable, "-u", CHILD, "--on-term", "ignore"])
    path.write_text(
        f'[[exec]]\nid = "reuse"\ncommand = {command}\nkeep = true\ngrace_period = "20s"\n'
        '[exec.shutdown]\ngraceful = "SIGTERM"\ntimeout = "500ms"\n'
    )
    return path


async def _sentinel_untouched(ns: Namespace, sentinel: int, log: Path) -> None:
    assert ns.ask(op="alive", pid=sentinel)["alive"]
    assert [x for x in logged_any(log) if "signal" in x] == []


def logged_any(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


# A worker is a new Python process: on a loaded machine its start alone took most of the 10 s that
# `until` gives one awaited event. Waiting for its session first gives the start a bound of its
# own, so each `until` after it bounds only what the server and the worker do.
WORKER_START_S = 60.0


async def connected(client: AsyncClient, worker_id: str) -> None:
    """Until the worker ``worker_id`` has a session: a session's start has no event to wait on."""
    with anyio.fail_after(WORKER_START_S):
        while worker_id not in {w.worker_id for w in await client.workers()}:  # noqa: ASYNC110
            await anyio.sleep(0.02)  # a short pause between checks of a bounded wait


async def test_pid_reused_after_the_worker_died(
    ns: Namespace, electric: TestServer, client: AsyncClient, tmp_path: Path
) -> None:
    tasks = _exec_file(tmp_path)
    first = ns.worker(tasks, electric.address, "w1")
    await connected(client, "w1")
    await client.spawn("reuse/a")
    pid = await ready(client, "reuse/a")
    start = (await receipts(client, "reuse/a"))[0]
    assert start["generation"]["pid"] == pid
    await client.signal("reuse/a", "SIGSTOP")
    await until(client, "reuse/a", receipt("forward", "issued", "SIGSTOP"))
    ns.ask(op="kill", pid=first, sig=9)  # the worker dies; the parent-death signal takes its child
    assert ns.ask(op="gone", pid=pid)["gone"]
    log = tmp_path / "sentinel.log"
    sentinel = ns.take_pid(pid, log)
    assert sentinel == pid  # the old generation's PID now names an unrelated process
    ns.worker(tasks, electric.address, "w2")
    await connected(client, "w2")
    await client.signal("reuse/a", "SIGTERM")  # paused → stopping: w2 is leased for the cleanup
    await until(client, "reuse/a", state_is("stopped", "cleanup_complete"))
    got = await receipts(client, "reuse/a")
    assert [(r["action"], r["disposition"]) for r in got] == [
        ("start", "observed"),
        ("forward", "issued"),
        ("recover", "observed"),
        ("graceful", "refused"),
    ]
    recover, refused = got[2], got[3]
    assert recover["generation"] == start["generation"]
    assert f"pid {pid} now belongs to another process" in recover["reason"]
    assert "no live generation" in refused["reason"]
    assert f"pid {pid} is not signalled" in refused["reason"]
    await _sentinel_untouched(ns, sentinel, log)


async def test_pid_reused_after_the_generation_exited_on_its_own(
    ns: Namespace, electric: TestServer, client: AsyncClient, tmp_path: Path
) -> None:
    tasks = _exec_file(tmp_path)
    ns.worker(tasks, electric.address, "w1")
    await connected(client, "w1")
    await client.spawn("reuse/b")
    pid = await ready(client, "reuse/b")
    await client.signal("reuse/b", "SIGSTOP")
    await until(client, "reuse/b", receipt("forward", "issued", "SIGSTOP"))
    ns.ask(op="kill", pid=pid, sig=9)  # not electric's doing: to the runtime it exits on its own
    await until(client, "reuse/b", receipt("exit"))
    assert ns.ask(op="gone", pid=pid)["gone"]  # reaped by its worker
    log = tmp_path / "sentinel.log"
    sentinel = ns.take_pid(pid, log)
    assert sentinel == pid
    await client.signal("reuse/b", "SIGTERM")
    await until(client, "reuse/b", state_is("stopped", "cleanup_complete"))
    got = await receipts(client, "reuse/b")
    assert [(r["action"], r["disposition"]) for r in got] == [
        ("start", "observed"),
        ("forward", "issued"),
        ("exit", "observed"),
        ("graceful", "refused"),
    ]
    assert got[2]["exit_status"] == -9
    assert f"pid {pid} is not signalled" in got[3]["reason"]
    await _sentinel_untouched(ns, sentinel, log)
