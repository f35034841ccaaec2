"""Never two live generations of one entity on one host.

An exec process dies with its worker (the launcher sets the parent-death signal; no external
binary needed). A worker that finds a generation another worker started proves it (a pidfd first,
then the start time and the boot id): gone, it says so (a zombie is gone, never "running");
running, it takes it over and shuts it down before it starts a new one; unprovable, it starts no
new one. A worker that is frozen (SIGSTOP) loses its lease while its process runs on: that is how
a generation outlives its worker's hold here."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from runtime.rt_support import state_is, until

from electric_sdk import AsyncClient
from electric_sdk.runtime import exec as exec_package
from electric_sdk.testing import TestServer

from .support import CHILD, alive, line, logged, proc_state, ready, receipt, receipts

pytestmark = pytest.mark.anyio
WORKER = (sys.executable, "-m", "electric_sdk.cli.main", "worker")
LAUNCHER = str(Path(exec_package.__file__).with_name("launcher.py"))


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
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


def _tasks(tmp: Path, *flags: str, backend: str = "posix") -> Path:
    tasks = tmp / "tasks.toml"
    command = json.dumps([sys.executable, "-u", CHILD, "--log", str(tmp / "signals.log"), *flags])
    tasks.write_text(
        f'[[exec]]\nid = "job"\ncommand = {command}\ngrace_period = "2s"\nbackend = "{backend}"\n'
        + ('[exec.shutdown]\ngraceful = "SIGTERM"\ntimeout = "200ms"\n' if backend == "posix" else "")
    )
    return tasks


def _acts(got: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    """Each receipt's action, disposition and generation number."""
    return [(r["action"], r["disposition"], r["generation"]["generation"]) for r in got]


async def _exited(pid: int) -> None:
    """Until ``pid`` has exited (its pidfd turns readable, whoever its parent is)."""
    pidfd = os.pidfd_open(pid)
    try:
        with anyio.fail_after(5):
            await anyio.wait_readable(pidfd)
    finally:
        os.close(pidfd)


def _reap_if_ours(pid: int) -> None:
    """A process re-parented to this test process (a subreaper once it hosted a worker): reaped."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


async def _freeze_and_lose(client: AsyncClient, worker: subprocess.Popen[bytes], ref: str) -> None:
    """The worker stops (SIGSTOP) with its process still running; its lease expires."""
    worker.send_signal(signal.SIGSTOP)
    await until(client, ref, state_is("idle", "runtime_lost"))


async def test_the_process_dies_with_a_killed_worker_without_setpriv(
    electric: TestServer, client: AsyncClient, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    tasks = _tasks(tmp_path, "--on-eof", "ignore")  # its stdin's end goes with the worker: no matter
    no_setpriv = tmp_path / "empty-bin"  # a PATH without setpriv (or anything else)
    no_setpriv.mkdir()
    workers.append(_worker(tasks, electric.address, "w1", tmp_path / "w1.log", path=str(no_setpriv)))
    await client.spawn("job/a")
    pid = await ready(client, "job/a")
    workers[0].kill()
    try:
        await _exited(pid)  # the parent-death signal
        assert not alive(pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # if it outlived its worker after all
        _reap_if_ours(pid)
    assert "setpriv" not in (tmp_path / "w1.log").read_text()


def test_the_launcher_kills_itself_when_its_worker_died_before_the_prctl(tmp_path: Path) -> None:
    """The race the parent-death signal alone leaves open: the launcher finds another parent than
    the worker it was started for, and dies as the signal would have made it; the command never runs."""
    marker = tmp_path / "ran"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    not_my_parent = "1"
    done = subprocess.run(
        [sys.executable, "-I", "-S", LAUNCHER, not_my_parent, "--", *command], check=False, timeout=30
    )
    assert done.returncode == -signal.SIGKILL
    assert not marker.exists()
    ran = subprocess.run(
        [sys.executable, "-I", "-S", LAUNCHER, str(os.getpid()), "--", *command], check=False, timeout=30
    )
    assert ran.returncode == 0
    assert marker.exists()


async def test_a_generation_left_running_is_shut_down_before_a_new_one_starts(
    electric: TestServer, client: AsyncClient, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    """Its worker is frozen and loses the lease; the process runs on. The next worker proves it,
    takes it over (recover issued), and runs the policy on it (it ignores SIGTERM: the one force
    follows the timeout); only once it has exited does the next generation start."""
    tasks = _tasks(tmp_path, "--on-term", "ignore")
    path = os.environ["PATH"]
    workers.append(_worker(tasks, electric.address, "w1", tmp_path / "w1.log", path=path))
    await client.spawn("job/a")
    first = await ready(client, "job/a")
    await _freeze_and_lose(client, workers[0], "job/a")
    assert alive(first)
    workers.append(_worker(tasks, electric.address, "w2", tmp_path / "w2.log", path=path))
    await client.send("job/a", "hello")  # wakes the entity on w2
    await until(client, "job/a", line("got hello"))
    got = await receipts(client, "job/a")
    assert _acts(got) == [
        ("start", "observed", 1),
        ("recover", "issued", 1),
        ("graceful", "issued", 1),
        ("force", "issued", 1),
        ("exit", "observed", 1),
        ("start", "observed", 2),
    ]
    recover, exit_, second = got[1], got[4], got[5]
    assert recover["generation"] == got[0]["generation"]
    assert (
        "still running (proved: a pidfd opened, then its start time and boot id matched)"
        in (recover["reason"])
    )
    assert "started by w1" in recover["reason"]
    assert got[2]["group"] is True
    assert "exit_status" not in exit_  # not w2's child: its status went to its (frozen) parent
    assert exit_["escalated"] is True
    assert second["generation"]["worker_id"] == "w2"
    assert proc_state(first) == "Z"  # dead, waiting for its frozen parent to reap it


async def test_a_dead_generation_not_yet_reaped_is_observed_gone(
    electric: TestServer, client: AsyncClient, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    """Its process died while its worker was frozen: a zombie, with its start time still readable.
    The next worker calls it gone (`recover observed`), not running, and starts the next one."""
    tasks = _tasks(tmp_path)
    path = os.environ["PATH"]
    workers.append(_worker(tasks, electric.address, "w1", tmp_path / "w1.log", path=path))
    await client.spawn("job/a")
    first = await ready(client, "job/a")
    workers[0].send_signal(signal.SIGSTOP)
    os.kill(first, signal.SIGKILL)
    await _exited(first)
    assert proc_state(first) == "Z"
    await until(client, "job/a", state_is("idle", "runtime_lost"))
    workers.append(_worker(tasks, electric.address, "w2", tmp_path / "w2.log", path=path))
    await client.send("job/a", "hello")
    await until(client, "job/a", line("got hello"))
    got = await receipts(client, "job/a")
    assert _acts(got) == [
        ("start", "observed", 1),
        ("recover", "observed", 1),
        ("start", "observed", 2),
    ]
    assert (
        f"pid {first} has exited (a zombie its parent, pid {workers[0].pid}, has not reaped yet)"
        in (got[1]["reason"])
    )


async def test_a_generation_that_cannot_be_taken_over_blocks_new_ones_until_it_is_gone(
    electric: TestServer, client: AsyncClient, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    """The portable backend has no way to act on a process it did not start: the running generation
    is held (never signalled), the new one is refused, saying why, and starts once the old is gone."""
    tasks = _tasks(tmp_path, "--on-eof", "ignore", backend="portable")
    path = os.environ["PATH"]
    workers.append(_worker(tasks, electric.address, "w1", tmp_path / "w1.log", path=path))
    await client.spawn("job/a")
    first = await ready(client, "job/a")
    await _freeze_and_lose(client, workers[0], "job/a")
    workers.append(_worker(tasks, electric.address, "w2", tmp_path / "w2.log", path=path))
    await client.send("job/a", "hello")
    refused = await until(client, "job/a", receipt("start", "refused"))
    assert alive(first)
    assert "no new generation while generation 1" in refused.value["reason"]
    assert "the portable backend cannot take it over" in refused.value["reason"]
    os.kill(first, signal.SIGKILL)  # someone else ends it
    await until(client, "job/a", line("got hello"))
    got = await receipts(client, "job/a")
    assert _acts(got) == [
        ("start", "observed", 1),
        ("recover", "held", 1),
        ("start", "refused", 1),
        ("recover", "observed", 1),
        ("start", "observed", 2),
    ]
    assert logged(tmp_path / "signals.log", first) == [f"ready pid={first}"]  # nothing reached it
