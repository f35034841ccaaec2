"""Send and wait across a replica's kill -9 (issue 46): three `electric server` replicas on one
PostgreSQL database (real processes) and a real worker on replica B. A client whose addresses
are A and C sends and waits while only A is up, so its send and its watch are A's; C comes up,
A is killed with kill -9 mid-run, the run is released and completes on B's worker, and the
wait answers `completed` with its output: its watch resumed on C from its last offset.
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path

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


async def test_a_wait_survives_its_replicas_kill_9(replica: StartReplica, tmp_path: Path) -> None:  # noqa: F811
    a, b = replica(), replica()
    c_port = free_port()
    c_address = f"127.0.0.1:{c_port}"
    worker = worker_process(b.address, "tests.runtime.headless_app:app", ROOT, tmp_path / "worker.log")
    gate = tmp_path / "gate"
    text = f"hold {gate}"
    try:
        async with AsyncClient(b.address) as via_b, AsyncClient([a.address, c_address]) as waiting:
            await via_b.spawn("headless/r1")
            await via_b.wait_for_state("headless/r1", "running", TIMEOUT_S)
            answers: list[RunResult] = []
            async with anyio.create_task_group() as tg:

                async def wait() -> None:
                    answers.append(await waiting.send("headless/r1", text, wait="run", timeout=TIMEOUT_S))

                tg.start_soon(wait)
                await until(via_b, "headless/r1", "started", text)
                c = replica(port=c_port)
                async with AsyncClient(c.address) as via_c:
                    await via_c.wait_ready(TIMEOUT_S)
                a.send(signal.SIGKILL)
                a.wait()
                gate.touch()  # only now may the run end: after the wait's replica is gone
                await until(via_b, "headless/r1", "completed", text)
        (result,) = answers
        assert result.status == "completed"
        assert result.output is not None
        assert result.output.startswith("partial pid=")
        assert result.output.endswith(" done")
    finally:
        worker.kill()
        worker.wait(10)
