"""A generation gets its graceful action once: a SIGTERM (or a drain) that comes while another
shutdown of the same generation is under way (its idle timeout's) joins that shutdown. Many
programs read a second SIGINT as "quit now", skipping their own cleanup.

A real process counts the signals it catches (child.py prints ``signal NAME`` for each)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest
from runtime.rt_support import running_worker, state_is, until

from electric_sdk import AsyncClient, Event
from electric_sdk.runtime import App
from electric_sdk.runtime.exec import ShutdownPolicy
from electric_sdk.testing import ManualClock, TestServer

from .support import CHILD, child, exited, line, logged, output, ready, receipt, receipts

pytestmark = pytest.mark.anyio
WORKER = (sys.executable, "-m", "electric_sdk.cli.main", "worker")


def graceful_for(signal_key: str) -> Callable[[Event], bool]:
    def match(event: Event) -> bool:
        return receipt("graceful")(event) and event.value.get("signal_key", "") == signal_key

    return match


@pytest.mark.parametrize("first", ["idle timeout", "drain"])
async def test_a_sigterm_joins_the_shutdown_under_way(
    tmp_path: Path, first: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = App(code_version="t")
    # The first shutdown's policy sends SIGINT; the process takes it and goes on running.
    app.exec(
        "twice", child(), idle_timeout="60s", grace_period="20s", shutdown=ShutdownPolicy("SIGINT", "15s")
    )
    ref = "twice/a"
    clock = ManualClock(datetime.now(UTC))  # the idle timeout passes when the test says so
    with TestServer(
        tmp_path / "electric", clock=clock, lease_ttl_ms=600_000
    ) as server:  # outlives the advance
        async with server.async_client() as client:
            async with (
                running_worker(app, server.address, clock=clock) as worker,
                anyio.create_task_group() as tg,
            ):
                await client.spawn(ref)
                pid = await ready(client, ref)  # its handlers are in
                if first == "drain":
                    tg.start_soon(worker.shutdown, 30.0)
                else:
                    clock.advance(60)
                await until(client, ref, line("signal SIGINT"))  # the first shutdown's graceful action
                term = await client.signal(ref, "SIGTERM")
                await until(client, ref, graceful_for(term.key))  # the cleanup's word on its graceful action
                # Signals are handled in the order of their numbers: a second SIGINT would be seen first.
                os.kill(pid, signal.SIGUSR1)
                await until(client, ref, line("signal SIGUSR1"))
                os.kill(pid, signal.SIGUSR2)  # its default action ends it: the shutdown is over
                await until(client, ref, state_is("stopped", "cleanup_complete"))
            caught = [ln for ln in await output(client, ref) if ln.startswith("signal")]
            got = await receipts(client, ref)
    assert caught == ["signal SIGINT", "signal SIGUSR1"]
    assert [
        r.get("signal_key", "") for r in got if r["action"] == "graceful" and r["disposition"] == "issued"
    ] == [""]
    # The idle timeout's end found the entity stopping: no attempt at `idle`, no host failure.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(30)


def worker(tasks: Path, address: str, name: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [*WORKER, "--exec", str(tasks), "--address", address, "--worker-id", name, "--grace", "1s"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def test_a_generation_taken_over_mid_shutdown_is_not_sent_its_graceful_action_again(
    electric: TestServer, client: AsyncClient, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    """w1 sends the SIGTERM's graceful SIGINT, then freezes and loses the lease; w2 takes the
    generation over and resumes the cleanup: the deadline w1's receipt set stands, no SIGINT again."""
    tasks = tmp_path / "tasks.toml"
    log = tmp_path / "signals.log"  # its stdout is the frozen worker's pipe, read by nobody now
    command = json.dumps([sys.executable, "-u", CHILD, "--log", str(log)])
    tasks.write_text(
        f'[[exec]]\nid = "job"\ncommand = {command}\ngrace_period = "20s"\n'
        '[exec.shutdown]\ngraceful = "SIGINT"\ntimeout = "15s"\n'
    )
    workers.append(worker(tasks, electric.address, "w1", tmp_path / "w1.log"))
    ref = "job/a"
    await client.spawn(ref)
    pid = await ready(client, ref)
    await client.signal(ref, "SIGTERM")
    await until(client, ref, line("signal SIGINT"))  # w1's graceful action, taken
    workers[0].send_signal(signal.SIGSTOP)  # frozen: its lease ends, its process runs on
    workers.append(worker(tasks, electric.address, "w2", tmp_path / "w2.log"))
    recovered = await until(client, ref, receipt("recover", "issued"))
    again = await until(client, ref, receipt("graceful"), recovered.offset)  # w2's word on it
    # Signals are handled in the order of their numbers: a second SIGINT would be seen first.
    os.kill(pid, signal.SIGTERM)  # it exits on it
    await exited(pid)
    await until(client, ref, state_is("stopped"))
    assert logged(log, pid) == ["ready pid=" + str(pid), "signal SIGINT", "signal SIGTERM"]
    assert again.value["disposition"] == "refused"
    first = next(r for r in await receipts(client, ref) if r["action"] == "graceful")
    assert again.value["deadline"] == first["deadline"]  # w1's deadline stands
