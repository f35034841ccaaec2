"""`electric get` after an exec entity's worker was killed (kill -9): no receipt says how its
process ended, and no worker holds the entity any more, so the process is shown `lost`, saying
why, not `running` until the entity is leased again."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtime.rt_support import state_is, until

from electric_sdk.testing import TestServer

from .support import CHILD, alive, exited, ready
from .test_receipts import shown_off_loop

pytestmark = pytest.mark.anyio
WORKER = (sys.executable, "-m", "electric_sdk.cli.main", "worker")


@pytest.fixture
def worker_proc() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(30)


async def test_get_shows_the_process_of_a_killed_worker_as_lost(
    tmp_path: Path, worker_proc: list[subprocess.Popen[bytes]]
) -> None:
    tasks = tmp_path / "tasks.toml"
    command = json.dumps([sys.executable, "-u", CHILD, "--on-eof", "ignore"])
    tasks.write_text(f'[[exec]]\nid = "job"\ncommand = {command}\ngrace_period = "2s"\n')
    with TestServer(tmp_path / "electric", lease_ttl_ms=300, heartbeat_interval_ms=50, poll_ms=50) as server:
        with (tmp_path / "worker.log").open("wb") as out:
            worker_proc.append(
                subprocess.Popen(  # noqa: ASYNC220 - started once, not waited for here
                    [*WORKER, "--exec", str(tasks), "--address", server.address, "--worker-id", "w1"],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        async with server.async_client() as client:
            await client.spawn("job/a")
            pid = await ready(client, "job/a")
            before = json.loads(await shown_off_loop(server, "--json", "get", "job/a"))
            worker_proc[0].kill()  # kill -9
            try:
                await exited(pid)  # the parent-death signal
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)  # if it outlived its worker after all
            await until(client, "job/a", state_is("idle", "runtime_lost"))
            after = json.loads(await shown_off_loop(server, "--json", "get", "job/a"))
            shown = await shown_off_loop(server, "get", "job/a")
    assert (before["process"]["state"], before["process"]["running"]) == ("running", True), before
    assert not alive(pid)
    assert after["holder"] is None
    process = after["process"]
    assert (process["state"], process["running"], process["exiting"]) == ("lost", False, False)
    assert "no worker holds the entity and no exit was recorded" in process["lost"]
    assert process["ended"] is None
    assert f"generation  1: pid {pid}, lost (no worker holds the entity" in shown
