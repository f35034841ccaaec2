"""Crash recovery with real processes, kill -9 on either side.

(a) The worker process dies mid-run (SIGKILL): its lease expires, the entity goes running → idle
    (runtime_lost), and a second worker process runs the message again as attempt 2.
(b) The server process dies (SIGKILL) while an entity is `stopping` with a cleanup that never
    ends: restarted on the same data dir and port, the server still fires the grace deadline
    (stopped, grace_expired, at the stored deadline), the worker reconnects, and
    `electric verify` replays every stream clean.

Tests synchronize on the entities' event streams, never on sleeps.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from electric_sdk import AsyncClient, Event
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import State
from electric_sdk.testing import TestServer

pytestmark = pytest.mark.anyio

TIMEOUT_S = 20.0

# The app the worker processes host. CRASH_MODE=hang: a message's step never ends (until the
# process is killed); anything else: each message completes in one quick step. The `slowterm`
# entity's SIGTERM cleanup never ends either: only the server's grace deadline stops it.
APP = textwrap.dedent(
    """
    import os

    import anyio

    from electric_sdk.runtime import App, Context, Message, SignalInfo

    app = App("crash-recovery")
    HANG = os.environ.get("CRASH_MODE") == "hang"


    @app.entity("job", grace_period="5s", idle_timeout="60s")
    async def job(ctx: Context, message: Message) -> None:
        async with ctx.step("tool:work"):
            ctx.output.write(f"working on {message.text} attempt={ctx.attempt}")
            if HANG:
                await anyio.sleep(30)


    @app.entity("slowterm", grace_period="1500ms", idle_timeout="60s")
    class SlowTerm:
        async def on_message(self, ctx: Context, message: Message) -> None:
            async with ctx.step("tool:quick"):
                await anyio.sleep(0.005)
                ctx.output.write(f"done {message.text}")

        async def on_signal(self, ctx: Context, signal: SignalInfo) -> None:
            if signal.signal.value == "SIGTERM":
                async with ctx.step("cleanup:forever"):
                    await anyio.sleep(60)
    """
)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    d = tmp_path / "app"
    d.mkdir()
    (d / "crash_app.py").write_text(APP)
    return d


@pytest.fixture
def workers(app_dir: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """``start(address, mode)``: an `electric worker` process hosting crash_app:app."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(address: str, mode: str = "") -> subprocess.Popen[bytes]:
        log = open(app_dir / f"worker-{len(procs)}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "electric_sdk.cli.main", "--address", address, "worker", "crash_app:app"],
            cwd=app_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "CRASH_MODE": mode},
        )
        log.close()
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def until(client: AsyncClient, ref: str, predicate: Callable[[Event], bool], start: int = 0) -> Event:
    with anyio.fail_after(TIMEOUT_S):
        async for event in client.watch(ref, start):
            if predicate(event):
                return event
    raise AssertionError(f"{ref}: the stream ended before the awaited event")


def run_is(status: int, key: str) -> Callable[[Event], bool]:
    return lambda e: e.type == "run" and e.raw.run.status == status and e.raw.run.message_key == key


# -- (a) kill -9 the worker ---------------------------------------------------------------------


async def test_worker_killed_mid_run_the_message_is_redelivered(
    tmp_path: Path, workers: Callable[..., subprocess.Popen[bytes]]
) -> None:
    with TestServer(tmp_path / "electric", lease_ttl_ms=500, heartbeat_interval_ms=100) as server:
        async with server.async_client() as client:
            first = workers(server.address, "hang")
            await client.spawn("job/j1")
            receipt = await client.send("job/j1", "the task")
            started = await until(client, "job/j1", run_is(pb.RUN_STATUS_STARTED, receipt.key))
            assert started.raw.run.attempt == 1

            os.kill(first.pid, signal.SIGKILL)
            first.wait(10)
            lost = await until(
                client,
                "job/j1",
                lambda e: e.type == "state" and e.value["cause"] == "runtime_lost",
                started.offset,
            )
            assert (lost.value["previous_state"], lost.value["state"]) == ("running", "idle")

            workers(server.address, "quick")
            done = await until(client, "job/j1", run_is(pb.RUN_STATUS_COMPLETED, receipt.key), lost.offset)
            assert done.raw.run.attempt == 2
            assert done.raw.run.output == "working on the task attempt=2"
            events = (await client.events("job/j1", 0, 1000)).events
            runs = [(e.raw.run.status, e.raw.run.attempt) for e in events if e.type == "run"]
            assert (pb.RUN_STATUS_COMPLETED, 1) not in runs  # the first attempt never completed
            assert [a for s, a in runs if s == pb.RUN_STATUS_STARTED] == [1, 2]


# -- (b) kill -9 the server ---------------------------------------------------------------------


async def verify(data_dir: Path) -> tuple[int, str]:
    result = await anyio.run_process(
        [sys.executable, "-m", "electric_sdk.cli.main", "verify", "--data", str(data_dir)], check=False
    )
    return result.returncode, (result.stdout + result.stderr).decode()


async def test_server_killed_while_stopping_the_deadline_still_fires(
    tmp_path: Path,
    server_process: Callable[..., Any],
    workers: Callable[..., subprocess.Popen[bytes]],
) -> None:
    port = free_port()
    data = tmp_path / "data"
    srv = server_process(data, port=port)
    worker = workers(srv.address, "quick")
    refs = [f"slowterm/s{i}" for i in range(5)]
    victim = refs[0]

    async with AsyncClient(srv.address) as client:
        with anyio.fail_after(TIMEOUT_S):
            for ref in refs:
                # Explicit profile: the type's own applies only if the worker is already connected.
                await client.spawn(ref, grace_period="1500ms")
            # Load: every entity runs messages to completion.
            receipts = [(ref, await client.send(ref, f"m{i}")) for i in range(3) for ref in refs]
        for ref, receipt in receipts:
            await until(client, ref, run_is(pb.RUN_STATUS_COMPLETED, receipt.key))

        # More messages in flight, then SIGTERM the victim: its cleanup blocks forever.
        with anyio.fail_after(TIMEOUT_S):
            for ref in refs[1:]:
                await client.send(ref, "during")
            term = await client.terminate(victim, reason="crash test")
        assert term.new_state is State.STOPPING
        asked = await until(
            client,
            victim,
            lambda e: e.type == "signal" and e.key == term.key and e.value["outcome"] == "shutdown_requested",
        )
        entity = await client.get(victim)
        assert entity.state is State.STOPPING
        assert entity.stopping_deadline is not None
        deadline = entity.stopping_deadline
        assert deadline > asked.timestamp, "the cleanup was asked for after the deadline: test too slow"

    # kill -9 the server before the deadline, restart it on the same data and port.
    assert datetime.now(UTC) < deadline, "too slow: the deadline passed before the crash"
    srv.send(signal.SIGKILL)
    srv.wait(10)
    srv = server_process(data, port=port)
    assert srv.address.endswith(f":{port}")

    async with AsyncClient(srv.address) as client:
        stopped = await until(client, victim, lambda e: e.type == "state" and e.value["state"] == "stopped")
        assert stopped.value["previous_state"] == "stopping"
        assert stopped.value["cause"] == "grace_expired"
        assert stopped.timestamp >= deadline, (
            f"stopped at {stopped.timestamp}, before the deadline {deadline}"
        )
        assert stopped.timestamp <= deadline + timedelta(seconds=3), (
            f"stopped at {stopped.timestamp}, long after the deadline {deadline}"
        )
        assert (await client.get(victim)).state is State.STOPPED

        # The worker reconnected to the restarted server: new work runs to completion.
        assert worker.poll() is None
        with anyio.fail_after(TIMEOUT_S):
            after = [(ref, await client.send(ref, "after restart")) for ref in refs[1:]]
        for ref, receipt in after:
            await until(client, ref, run_is(pb.RUN_STATUS_COMPLETED, receipt.key))

    worker.send_signal(signal.SIGKILL)
    worker.wait(10)
    srv.send(signal.SIGTERM)
    srv.wait(30)
    with anyio.fail_after(60):
        code, output = await verify(data)
    assert code == 0, output
