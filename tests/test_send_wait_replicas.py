"""Send and wait (issue 46), and a signal answered at a stage (issue 48), across a replica's
kill -9: three `electric server` replicas on one PostgreSQL database (real processes) and a real
worker on replica B. A client whose addresses are A and C waits while only A is up, so its call
and its watch are A's; C comes up, A is killed with kill -9 mid-run, and the wait still answers:
a send's watch resumed on C from its last offset, a signal's call retried on C with its key.
"""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from runtime.rt_support import worker_process
from test_replicas import StartReplica, anyio_backend, one_loop, replica  # noqa: F401 - fixtures

from electric_sdk import AsyncClient, Event, RunResult

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def until(client: AsyncClient, ref: str, wanted: str, text: str) -> Event:
    """The run record with status ``wanted`` of the message with ``text``."""
    key = None
    with anyio.fail_after(TIMEOUT_S):
        async for event in client.watch(ref, 0):
            if event.type == "message" and event.value["text"] == text:
                key = event.key
            elif (
                event.type == "run" and event.value["message_key"] == key and event.value["status"] == wanted
            ):
                return event
    raise AssertionError(f"{ref}: the stream ended first")


@contextlib.contextmanager
def three_replicas(replica: StartReplica, tmp_path: Path) -> Iterator[tuple[Any, Any, int, Path]]:  # noqa: F811
    """Replicas A and B, C's port (C is not up yet), a worker on B, and the gate file that lets a
    `hold` run end."""
    a, b = replica(), replica()
    worker = worker_process(b.address, "tests.runtime.headless_app:app", ROOT, tmp_path / "worker.log")
    try:
        yield a, b, free_port(), tmp_path / "gate"
    finally:
        worker.kill()
        worker.wait(10)


async def move_to_c(replica: StartReplica, a: Any, c_port: int) -> None:  # noqa: F811
    """C comes up, then A dies with kill -9."""
    c = replica(port=c_port)
    async with AsyncClient(c.address) as via_c:
        await via_c.wait_ready(TIMEOUT_S)
    a.send(signal.SIGKILL)
    a.wait()


async def test_a_wait_survives_its_replicas_kill_9(replica: StartReplica, tmp_path: Path) -> None:  # noqa: F811
    with three_replicas(replica, tmp_path) as (a, b, c_port, gate):
        text = f"hold {gate}"
        async with (
            AsyncClient(b.address) as via_b,
            AsyncClient([a.address, f"127.0.0.1:{c_port}"]) as waiting,
        ):
            await via_b.spawn("headless/r1")
            await via_b.wait_for_state("headless/r1", "running", TIMEOUT_S)
            answers: list[RunResult] = []
            async with anyio.create_task_group() as tg:

                async def wait() -> None:
                    answers.append(await waiting.send("headless/r1", text, wait="run", timeout=TIMEOUT_S))

                tg.start_soon(wait)
                await until(via_b, "headless/r1", "started", text)
                await move_to_c(replica, a, c_port)
                gate.touch()  # only now may the run end: after the wait's replica is gone
                await until(via_b, "headless/r1", "completed", text)
        (result,) = answers
        assert result.status == "completed"
        assert result.output is not None
        assert result.output.startswith("partial pid=")
        assert result.output.endswith(" done")


async def test_a_staged_signal_survives_its_replicas_kill_9(replica: StartReplica, tmp_path: Path) -> None:  # noqa: F811
    """The same for a signal's answer at a stage, which the server holds: SIGTERM(wait=terminal)
    is out on A while the run holds; A dies with kill -9; the SDK's retry (same idempotency key)
    reaches C, which replays the signal's answer and folds the stream from its record: `terminal`
    reached once the run ends and the entity stops."""
    with three_replicas(replica, tmp_path) as (a, b, c_port, gate):
        text = f"hold {gate}"
        async with (
            AsyncClient(b.address) as via_b,
            AsyncClient([a.address, f"127.0.0.1:{c_port}"]) as waiting,
        ):
            await via_b.spawn("headless/t1")
            await via_b.wait_for_state("headless/t1", "running", TIMEOUT_S)
            await via_b.send("headless/t1", text)
            await until(via_b, "headless/t1", "step", text)
            answers = []
            async with anyio.create_task_group() as tg:

                async def terminate() -> None:
                    answers.append(await waiting.terminate("headless/t1", wait="terminal", timeout=TIMEOUT_S))

                tg.start_soon(terminate)
                await via_b.wait_for_state("headless/t1", "stopping", TIMEOUT_S)
                await move_to_c(replica, a, c_port)
                gate.touch()  # only now may the run end: after the waiting call's replica is gone
            (result,) = answers
            assert result.reached("terminal"), result.stages
            events = (await via_b.events("headless/t1", 0, 1000)).events
        signals = [e for e in events if e.type == "signal" and e.operation == "insert"]
        assert [e.value["signal"] for e in signals] == ["SIGTERM"]  # the retry wrote no second one
        stopped = next(e for e in events if e.type == "state" and e.value["state"] == "stopped")
        assert [r.offset for r in result.stages if r.stage.value == "terminal"] == [stopped.offset]
