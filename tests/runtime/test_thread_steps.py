"""SIGINT (and a SIGTERM that interrupts) aborts a run blocked in a thread at once, with a real
worker process.

The step's thread writes a `started` file, blocks until the test creates a gate file, then
writes a `finished` file:
the run's `aborted` record is awaited while the gate is still shut, so the abort cannot have
waited for the thread. Once the gate opens, the abandoned thread finishes unobserved, and what
the run's code then tries (an emit) is refused, not recorded.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from subprocess import Popen

import anyio
import pytest

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.testing import TestServer

from .rt_support import TIMEOUT_S, app_module, outcome_of, run_status, state_is, until, worker_process

pytestmark = pytest.mark.anyio

APP = textwrap.dedent(
    """
    import time
    from pathlib import Path

    import anyio
    import anyio.to_thread

    from electric_sdk.errors import RunAborted
    from electric_sdk.runtime import App, Context, Message

    app = App("thread-steps")


    def block(directory: str) -> str:
        # Blocking work that cannot be cancelled: it ends when the test opens the gate.
        here = Path(directory)
        (here / "started").write_text("the thread runs")
        while not (here / "gate").exists():
            time.sleep(0.005)
        (here / "finished").write_text("the thread ran to its end")
        return "late result"


    @app.entity("blocker", grace_period="5s", idle_timeout="60s")
    class Blocker:
        async def on_message(self, ctx: Context, message: Message) -> None:
            how, _, directory = message.text.partition(" ")
            if how == "quick":
                return
            ctx.output.write("partial")
            if how == "step":
                result = await ctx.step("tool:block", block, directory)
            else:
                result = await anyio.to_thread.run_sync(block, directory)
            ctx.output.write(result)
            try:
                await ctx.emit("late", result)
            except RunAborted:
                (Path(directory) / "refused").write_text("late emit refused")


    @app.entity("cutter", grace_period="30s", idle_timeout="60s", sigterm_interrupts=True)
    class Cutter(Blocker):
        async def on_signal(self, ctx: Context, signal) -> None:
            if signal.signal.value == "SIGTERM":
                await ctx.emit("cleanup", {"partial": signal.partial_output})
    """
)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    return app_module(tmp_path, "thread_app", APP)


async def wait_file(path: Path) -> None:
    """The file the worker process writes: no stream event can say it is there."""
    with anyio.fail_after(TIMEOUT_S):
        while not await anyio.Path(path).exists():  # noqa: ASYNC110
            await anyio.sleep(0.005)


@pytest.mark.parametrize("how", ["to_thread", "step"])
async def test_sigint_aborts_a_thread_blocked_step_at_once(
    tmp_path: Path, app_dir: Path, electric: TestServer, how: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    proc: Popen[bytes] = worker_process(electric.address, "thread_app:app", app_dir, app_dir / "worker.log")
    try:
        async with electric.async_client() as client:
            ref = f"blocker/{how}"
            await client.spawn(ref)
            receipt = await client.send(ref, f"{how} {work}")
            await wait_file(work / "started")  # the thread blocks now
            result = await client.interrupt(ref)
            aborted = await until(client, ref, run_status(pb.RUN_STATUS_ABORTED, receipt.key))
            assert not (work / "finished").exists()  # aborted while the thread still blocks
            assert aborted.raw.run.output == "partial"
            await until(client, ref, outcome_of(result.key, "aborted"))
            # The entity takes its next message while the abandoned thread still blocks.
            nxt = await client.send(ref, "quick")
            await until(client, ref, run_status(pb.RUN_STATUS_COMPLETED, nxt.key))
            assert not (work / "finished").exists()

            (work / "gate").touch()
            await wait_file(work / "finished")
            if how == "to_thread":  # the body came back from its thread: its late work is refused
                await wait_file(work / "refused")
            events = (await client.events(ref, 0, 1000)).events
            # Neither the thread's result nor the late emit reached the stream.
            assert "late result" not in repr([e.value for e in events])
    finally:
        proc.kill()
        proc.wait(10)


async def test_an_interrupting_sigterm_cleans_up_beside_a_blocked_thread(
    tmp_path: Path, app_dir: Path, electric: TestServer
) -> None:
    """The type opted in to SIGTERM interrupting the step; the step's thread cannot be cancelled:
    the run is abandoned there, and the cleanup runs with its partial output while the thread
    still blocks, within the grace (30 s: the test does not wait it out)."""
    work = tmp_path / "work"
    work.mkdir()
    proc: Popen[bytes] = worker_process(electric.address, "thread_app:app", app_dir, app_dir / "worker.log")
    try:
        async with electric.async_client() as client:
            ref = "cutter/t1"
            await client.spawn(ref)
            receipt = await client.send(ref, f"to_thread {work}")
            await wait_file(work / "started")
            await client.terminate(ref, reason="shutdown")
            cleanup = await until(client, ref, lambda e: e.type == "cleanup")
            assert cleanup.value["data"] == {"partial": "partial"}
            aborted = await until(client, ref, run_status(pb.RUN_STATUS_ABORTED, receipt.key))
            assert aborted.raw.run.error == "SIGTERM (interrupted mid-step)"
            await until(client, ref, state_is("stopped", "cleanup_complete"))
            assert not (work / "finished").exists()  # all of it while the thread still blocks
            assert aborted.offset < cleanup.offset  # the run's end is written before the cleanup's
    finally:
        (work / "gate").touch()
        proc.kill()
        proc.wait(10)
