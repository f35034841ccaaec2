"""A worker that finds stored evidence of a generation it does not hold re-observes it and
refuses on any doubt. Here the doubt is real: the old worker ran without `setpriv`, so its child
did not die with it, and a process with exactly the recorded evidence is still running. The new
worker is not its parent and cannot prove it, so it never signals it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtime.rt_support import state_is, until

from electric_sdk import AsyncClient
from electric_sdk.testing import TestServer

from .support import CHILD, alive, ready, receipt, receipts

pytestmark = pytest.mark.anyio
WORKER = (sys.executable, "-m", "electric_sdk.cli.main", "worker")


def _pending_signals(pid: int) -> int:
    """The process's shared pending-signal mask (ShdPnd): a frozen process keeps what it was sent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("ShdPnd:"):
            return int(line.split()[1], 16)
    raise AssertionError("no ShdPnd")


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(30)


def _worker(tasks: Path, address: str, name: str, log: Path, *, path: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child has its own copy of the descriptor
        return subprocess.Popen(
            [*WORKER, "--exec", str(tasks), "--address", address, "--worker-id", name, "--grace", "1s"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PATH": path},
        )


async def test_a_surviving_generation_is_held_never_signalled(
    electric: TestServer, client: AsyncClient, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    tasks = tmp_path / "tasks.toml"
    command = json.dumps([sys.executable, "-u", CHILD, "--on-term", "ignore", "--on-eof", "ignore"])
    tasks.write_text(f'[[exec]]\nid = "orphan"\ncommand = {command}\nkeep = true\ngrace_period = "20s"\n')
    no_setpriv = str(tmp_path / "empty-bin")  # a PATH without setpriv: no parent-death signal
    os.mkdir(no_setpriv)
    workers.append(_worker(tasks, electric.address, "w1", tmp_path / "w1.log", path=no_setpriv))
    await client.spawn("orphan/a")
    pid = await ready(client, "orphan/a")
    try:
        await client.signal("orphan/a", "SIGSTOP")
        await until(client, "orphan/a", receipt("forward", "issued", "SIGSTOP"))
        workers[0].kill()  # the worker dies; its child lives on, frozen
        workers[0].wait(30)
        assert alive(pid)
        assert "setpriv (util-linux) is not on PATH" in (tmp_path / "w1.log").read_text()
        workers.append(_worker(tasks, electric.address, "w2", tmp_path / "w2.log", path=os.environ["PATH"]))
        await client.signal("orphan/a", "SIGTERM")  # paused → stopping: w2 is leased for the cleanup
        await until(client, "orphan/a", state_is("stopped", "cleanup_complete"))
        got = await receipts(client, "orphan/a")
        assert [(r["action"], r["disposition"]) for r in got] == [
            ("start", "observed"),
            ("forward", "issued"),
            ("recover", "held"),
            ("graceful", "refused"),
        ]
        recover, refused = got[2], got[3]
        assert recover["generation"] == got[0]["generation"]
        assert "still running but was started by w1" in recover["reason"]
        assert "will never signal it" in recover["reason"]
        assert "this worker holds no generation" in refused["reason"]
        assert alive(pid)
        assert _pending_signals(pid) & (1 << (signal.SIGTERM - 1)) == 0  # nothing was sent to it
    finally:
        os.kill(pid, signal.SIGKILL)
