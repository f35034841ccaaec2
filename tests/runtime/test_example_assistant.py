"""examples/assistant.py, run as users run it: `electric worker examples.assistant:app` in its own
process beside a real server. Its conversation survives a kill -9 of the worker mid-answer (the
search is replayed, not run again), SIGUSR steers the next answer, SIGTERM writes a summary."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from electric_sdk.testing import TestServer

from .rt_support import COMPLETED, run_status, state_is, until, worker_process

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[TestServer]:
    with TestServer(tmp_path / "electric", lease_ttl_ms=500, heartbeat_interval_ms=100) as srv:
        yield srv


def worker(address: str, log: Path) -> subprocess.Popen[bytes]:
    return worker_process(address, "examples.assistant:app", ROOT, log, ASSISTANT_STEP_S="0.3")


async def test_the_assistant_keeps_its_conversation_across_a_crash(
    server: TestServer, tmp_path: Path
) -> None:
    ref = "assistant/a1"
    first = worker(server.address, tmp_path / "w1.log")
    try:
        async with server.async_client() as client:
            await client.spawn(ref)
            key = (await client.send(ref, "tides")).key
            searched = await until(
                client, ref, lambda e: e.type == "electric.step" and e.value["data"]["name"] == "tool:search"
            )
            os.kill(first.pid, signal.SIGKILL)  # mid-answer: the search is recorded, the answer is not
            first.wait(10)
            second = worker(server.address, tmp_path / "w2.log")
            try:
                done = await until(client, ref, run_status(COMPLETED, key), searched.offset)
                assert done.raw.run.attempt == 2
                assert done.raw.run.output.startswith("On 'tides', 3 sources agree")

                await client.usr(ref, {"tone": "short"})
                key = (await client.send(ref, "moons")).key
                done = await until(client, ref, run_status(COMPLETED, key), done.offset)
                assert done.raw.run.output == "moons: see 3 sources."

                await client.terminate(ref)
                summary = await until(client, ref, lambda e: e.type == "summary", done.offset)
                assert summary.value["data"] == {"turns": 4, "questions": ["tides", "moons"]}
                await until(client, ref, state_is("stopped", "cleanup_complete"), summary.offset)
            finally:
                second.kill()
                second.wait(10)
            events = (await client.events(ref, 0, 1000)).events
            searches = [
                e for e in events if e.type == "electric.step" and e.value["data"]["name"] == "tool:search"
            ]
            assert len(searches) == 2  # one per question: the crashed run's was replayed, not run again
            state = await client.state(ref)
            assert state["prefs"] == {"tone": "short"}
            assert [turn["role"] for turn in state["history"]] == ["user", "assistant"] * 2
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
