"""Nothing lost at the end (issue 46, point 1), with real worker processes.

A run appends the user's turn to ``ctx.state`` and then enters a long step (a model call that
never returns within the test). Whatever ends the run — the grace deadline of a SIGTERM, SIGINT,
SIGKILL, a worker killed with kill -9 — the turn is in ``electric state`` afterwards, and the
run's record says how it ended; a cleanup the deadline cuts off keeps its changes too. With the
opt-in (``sigterm_interrupts``, or one SIGTERM's ``--interrupt``) the SIGTERM cuts the step at
once and the cleanup's summary lands beside the turn.

Tests synchronize on the entities' streams, never on sleeps; durations are in ms.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from electric_sdk import AsyncClient
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.durable_state import STATE_EVENT
from electric_sdk.errors import InvalidArgument
from electric_sdk.testing import TestServer

from .rt_support import app_module, state_is, until, worker_processes

pytestmark = pytest.mark.anyio

# ``agent``: on_signal(SIGTERM) writes a summary (never reached at the deadline: the step is
# still running); ``bare``: no handler at all; ``cutter``: SIGTERM interrupts the step.
APP = textwrap.dedent(
    """
    import anyio

    from electric_sdk.runtime import App, Context, Message, SignalInfo

    app = App("grace-app")


    async def model_call(ctx: Context, prompt: str) -> str:
        await ctx.emit("model.called", {"attempt": ctx.attempt})  # the test waits for it
        await anyio.sleep(3600)  # the long call: never returns within a test
        return "answer"


    async def turn(ctx: Context, message: Message) -> None:
        ctx.state["history"].append({"role": "user", "text": message.text})
        ctx.output.write("thinking")
        answer = await ctx.step("model:answer", model_call, ctx, message.text)
        ctx.state["history"].append({"role": "assistant", "text": answer})


    @app.entity("agent", grace_period="300ms", idle_timeout="60s", state=True)
    class Agent:
        async def on_message(self, ctx: Context, message: Message) -> None:
            await turn(ctx, message)

        async def on_signal(self, ctx: Context, signal: SignalInfo) -> None:
            ctx.state["summary"]["signal"] = signal.signal.value
            ctx.state["summary"]["partial"] = signal.partial_output


    @app.entity("bare", grace_period="300ms", idle_timeout="60s", state=True)
    async def bare(ctx: Context, message: Message) -> None:
        await turn(ctx, message)


    @app.entity("stuck", grace_period="300ms", idle_timeout="60s", state=True)
    class Stuck:
        async def on_message(self, ctx: Context, message: Message) -> None:
            ctx.output.write("ok")

        async def on_signal(self, ctx: Context, signal: SignalInfo) -> None:
            ctx.state["summary"]["begun"] = True
            await ctx.emit("cleanup.begun", None)
            await anyio.sleep(3600)  # a cleanup the deadline cuts off


    @app.entity("cutter", grace_period="5s", idle_timeout="60s", state=True, sigterm_interrupts=True)
    class Cutter(Agent):
        pass


    @app.entity("unwinder", grace_period="5s", idle_timeout="60s", state=True, sigterm_interrupts=True)
    class Unwinder(Agent):
        async def on_message(self, ctx: Context, message: Message) -> None:
            try:
                await turn(ctx, message)
            finally:
                ctx.output.write(" (cut)")  # written while the cut run unwinds
    """
)


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    with worker_processes(app_module(tmp_path, "grace_app", APP), "grace_app:app") as start:
        yield start


def cli_state(address: str, ref: str) -> dict[str, Any]:
    """The state `electric state REF --json` prints."""
    done = subprocess.run(
        [sys.executable, "-m", "electric_sdk.cli.main", "--address", address, "state", ref, "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=20,
    )
    state: dict[str, Any] = json.loads(done.stdout)["state"]
    return state


def run_end(key: str) -> Callable[[Any], bool]:
    ends = {pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_ABORTED, pb.RUN_STATUS_FAILED}
    return lambda e: e.type == "run" and e.raw.run.message_key == key and e.raw.run.status in ends


def in_step(attempt: int = 1) -> Callable[[Any], bool]:
    return lambda e: e.type == "model.called" and e.value["data"]["attempt"] == attempt


USER_TURN = {"role": "user", "text": "find the papers"}


async def _in_the_long_step(client: AsyncClient, ref: str) -> str:
    await client.spawn(ref)
    receipt = await client.send(ref, "find the papers")
    await until(client, ref, in_step())
    return receipt.key


@pytest.mark.parametrize("etype", ["agent", "bare"])
async def test_grace_expired_keeps_the_turn(
    tmp_path: Path, start_worker: Callable[..., subprocess.Popen[bytes]], etype: str
) -> None:
    with TestServer(tmp_path / "electric") as server:
        async with server.async_client() as client:
            start_worker(server.address)
            ref = f"{etype}/a1"
            key = await _in_the_long_step(client, ref)
            await client.terminate(ref, reason="shutdown")
            await until(client, ref, state_is("stopped", "grace_expired"))
            end = await until(client, ref, run_end(key))
            assert end.raw.run.status == pb.RUN_STATUS_ABORTED
            assert "grace period ran out" in end.raw.run.error
            assert end.raw.run.output == "thinking"
            state = cli_state(server.address, ref)
            assert state["history"] == [USER_TURN]
            assert "summary" not in state  # the step never reached a boundary: no cleanup ran


async def test_sigint_keeps_the_turn(
    tmp_path: Path, start_worker: Callable[..., subprocess.Popen[bytes]]
) -> None:
    with TestServer(tmp_path / "electric") as server:
        async with server.async_client() as client:
            start_worker(server.address)
            key = await _in_the_long_step(client, "agent/i1")
            await client.signal("agent/i1", "SIGINT", reason="enough")
            end = await until(client, "agent/i1", run_end(key))
            assert end.raw.run.status == pb.RUN_STATUS_ABORTED
            state = cli_state(server.address, "agent/i1")
            assert state["history"] == [USER_TURN]


async def test_sigkill_keeps_the_turn(
    tmp_path: Path, start_worker: Callable[..., subprocess.Popen[bytes]]
) -> None:
    with TestServer(tmp_path / "electric") as server:
        async with server.async_client() as client:
            start_worker(server.address)
            key = await _in_the_long_step(client, "bare/k1")
            await client.signal("bare/k1", "SIGKILL", reason="now")
            end = await until(client, "bare/k1", run_end(key))
            assert end.raw.run.status == pb.RUN_STATUS_ABORTED
            assert "SIGKILL" in end.raw.run.error
            assert cli_state(server.address, "bare/k1")["history"] == [USER_TURN]


async def test_lost_lease_makes_the_turn_once(
    tmp_path: Path, start_worker: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """kill -9 of the worker: nothing of the first attempt can be written by it; the run is
    delivered again, replays its code up to the step, and the turn is in the state once."""
    with TestServer(tmp_path / "electric", lease_ttl_ms=500, heartbeat_interval_ms=100) as server:
        async with server.async_client() as client:
            first = start_worker(server.address)
            key = await _in_the_long_step(client, "bare/l1")
            first.kill()
            first.wait(10)
            await until(client, "bare/l1", state_is("idle", "runtime_lost"))
            start_worker(server.address)
            await until(client, "bare/l1", in_step(2))
            await client.signal("bare/l1", "SIGINT", reason="stop the second attempt")
            end = await until(client, "bare/l1", lambda e: run_end(key)(e) and e.raw.run.attempt >= 2)
            assert end.raw.run.status == pb.RUN_STATUS_ABORTED
            assert cli_state(server.address, "bare/l1")["history"] == [USER_TURN]


@pytest.mark.parametrize(("ref", "recorded"), [("cutter/c1", "thinking"), ("unwinder/u1", "thinking (cut)")])
async def test_sigterm_that_interrupts_runs_the_cleanup(
    tmp_path: Path, start_worker: Callable[..., subprocess.Popen[bytes]], ref: str, recorded: str
) -> None:
    """The step is cut and the cleanup runs with the run's partial output. The cleanup starts
    while the cut run unwinds: its partial output is the run's output when the SIGTERM cut it,
    and what the body writes unwinding (``unwinder``'s ``finally``) is in the run's record, which
    the stream has before the cleanup's writes."""
    with TestServer(tmp_path / "electric") as server:
        async with server.async_client() as client:
            start_worker(server.address)
            key = await _in_the_long_step(client, ref)
            await client.terminate(ref, reason="shutdown")
            await until(client, ref, state_is("stopped", "cleanup_complete"))
            events = (await client.events(ref, 0, 1000)).events
            end = next(e for e in events if run_end(key)(e))
            assert (end.raw.run.status, end.raw.run.output) == (pb.RUN_STATUS_ABORTED, recorded)
            summary = [e for e in events if e.type == STATE_EVENT and "summary" in repr(e.value)]
            assert summary
            assert all(e.offset > end.offset for e in summary)
            state = cli_state(server.address, ref)
            assert state == {"history": [USER_TURN], "summary": {"signal": "SIGTERM", "partial": "thinking"}}


async def test_a_sigterm_asked_to_interrupt_runs_the_cleanup(
    tmp_path: Path, start_worker: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """The SIGTERM itself asks (`electric signal REF TERM --interrupt`), on a type that did not
    opt in: the step is cut, the cleanup's summary lands beside the turn."""
    with TestServer(tmp_path / "electric") as server:
        async with server.async_client() as client:
            start_worker(server.address)
            key = await _in_the_long_step(client, "agent/t1")
            cli = [sys.executable, "-m", "electric_sdk.cli.main", "--address", server.address]
            await anyio.run_process([*cli, "signal", "agent/t1", "TERM", "--interrupt"])
            await until(client, "agent/t1", state_is("stopped", "cleanup_complete"))
            end = await until(client, "agent/t1", run_end(key))
            assert (end.raw.run.status, end.raw.run.error) == (
                pb.RUN_STATUS_ABORTED,
                "SIGTERM (interrupted mid-step)",
            )
            state = cli_state(server.address, "agent/t1")
            assert state == {"history": [USER_TURN], "summary": {"signal": "SIGTERM", "partial": "thinking"}}


async def test_a_batch_sigterm_asked_to_interrupt_runs_each_cleanup(
    tmp_path: Path, start_worker: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """SignalEntities with `interrupt`: every selected entity's step is cut and its cleanup runs."""
    with TestServer(tmp_path / "electric") as server:
        async with server.async_client() as client:
            start_worker(server.address)
            refs = ["agent/b1", "agent/b2"]
            keys = [await _in_the_long_step(client, ref) for ref in refs]
            result = await client.signal_many("SIGTERM", refs=refs, reason="shutdown", interrupt=True)
            assert result.signalled == 2
            for ref, key in zip(refs, keys, strict=True):
                await until(client, ref, state_is("stopped", "cleanup_complete"))
                end = await until(client, ref, run_end(key))
                assert end.raw.run.error == "SIGTERM (interrupted mid-step)"
                assert cli_state(server.address, ref)["summary"] == {
                    "signal": "SIGTERM",
                    "partial": "thinking",
                }
            with pytest.raises(InvalidArgument) as raised:
                await client.signal_many("SIGINT", type="agent", interrupt=True)
            assert raised.value.code == "INTERRUPT_NOT_ALLOWED"


async def test_only_sigterm_may_ask_to_interrupt(tmp_path: Path) -> None:
    """Bad input writes nothing: an `interrupt` with another signal is refused at every door."""
    with TestServer(tmp_path / "electric") as server:
        async with server.async_client() as client:
            await client.spawn("agent/x1")
            with pytest.raises(InvalidArgument) as raised:
                await client.signal("agent/x1", "SIGUSR", interrupt=True)
            assert raised.value.code == "INTERRUPT_NOT_ALLOWED"
            cli = [sys.executable, "-m", "electric_sdk.cli.main", "--address", server.address]
            done = await anyio.run_process([*cli, "signal", "agent/x1", "INT", "--interrupt"], check=False)
            assert done.returncode != 0
            assert "only SIGTERM" in done.stderr.decode()
            assert [e.type for e in (await client.events("agent/x1")).events] == ["state"]


async def test_a_cleanup_cut_off_by_the_deadline_keeps_its_changes(
    tmp_path: Path, start_worker: Callable[..., subprocess.Popen[bytes]]
) -> None:
    with TestServer(tmp_path / "electric") as server:
        async with server.async_client() as client:
            start_worker(server.address)
            await client.spawn("stuck/s1")
            await until(client, "stuck/s1", state_is("running"))
            await client.terminate("stuck/s1", reason="shutdown")
            await until(client, "stuck/s1", lambda e: e.type == "cleanup.begun")
            await until(client, "stuck/s1", state_is("stopped", "grace_expired"))
            await until(client, "stuck/s1", lambda e: e.type == "electric.state")
            assert cli_state(server.address, "stuck/s1") == {"summary": {"begun": True}}
