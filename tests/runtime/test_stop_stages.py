"""Staged receipts (issue 48): a signal's answer waits for a stage, and lists each stage reached
(with its record's offset and time) or not (and why).

A real server on either store, a worker on the test's loop (a worker process where it is
killed), real exec processes. Every wait is on the stream, never a sleep.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import anyio
import httpx
import pytest

from electric_sdk import AsyncClient
from electric_sdk.errors import InvalidArgument
from electric_sdk.lifecycle import Signal, Stage, stages_of
from electric_sdk.models import SignalResult
from electric_sdk.runtime import App
from electric_sdk.testing import TestServer

from .rt_support import app_module, running_worker, until, worker_process

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]

SOURCE = textwrap.dedent(
    """
    import sys

    import anyio

    from electric_sdk.runtime import App, Context, Message, SignalInfo

    app = App("stages", code_version="t")
    SLOW_S = 1.5


    @app.entity("agent", grace_period="20s", idle_timeout="1h")
    class Agent:
        async def on_message(self, ctx: Context, message: Message) -> None:
            ctx.output.write("thinking")
            await ctx.emit("in_step", None)
            await ctx.step("model", anyio.sleep, 3600)

        async def on_signal(self, ctx: Context, signal: SignalInfo) -> None:
            if signal.signal.value == "SIGUSR" and signal.payload == "block":
                await ctx.emit("blocking", None)
                await anyio.sleep(3600)
            if signal.payload == "slow":  # outlasts test_stage_answers' short calls: its work
                await anyio.sleep(SLOW_S)
            await ctx.emit("handler", signal.signal.value)


    @app.entity("cutter", grace_period="20s", idle_timeout="1h", sigterm_interrupts=True)
    class Cutter(Agent):
        pass


    LINES = "import sys\\nfor line in sys.stdin: print(line.strip(), flush=True)"
    app.exec("proc", [sys.executable, "-u", "-c", LINES], keep=True)
    """
)


def _app() -> App:
    namespace: dict[str, object] = {}
    exec(compile(SOURCE, "stages_app.py", "exec"), namespace)
    app = namespace["app"]
    assert isinstance(app, App)
    return app


async def _in_step(client: AsyncClient, ref: str) -> str:
    await client.spawn(ref)
    receipt = await client.send(ref, "go")
    await until(client, ref, lambda e: e.type == "in_step")
    return receipt.key


def _stage(result: SignalResult, stage: Stage) -> dict[str, object]:
    (report,) = [r for r in result.stages if r.stage is stage]
    return report.to_json()


async def _offset_of(client: AsyncClient, ref: str, match: object) -> int:
    events = (await client.events(ref, 0, 1000)).events
    return next(e.offset for e in events if match(e))  # type: ignore[operator]


async def test_sigint_waits_until_the_run_is_unwound(electric: TestServer, client: AsyncClient) -> None:
    async with running_worker(_app(), electric.address):
        key = await _in_step(client, "agent/i1")
        result = await client.interrupt("agent/i1", wait="unwound", timeout="30s")
        assert [r.stage for r in result.stages] == list(stages_of(Signal.SIGINT))
        assert result.reached("unwound")
        # No MCP call or child entity: downstream is reached with the run's end.
        assert _stage(result, Stage.DOWNSTREAM)["offset"] == _stage(result, Stage.UNWOUND)["offset"]
        ended = await _offset_of(
            client,
            "agent/i1",
            lambda e: e.type == "run" and e.value["message_key"] == key and e.value["status"] == "aborted",
        )
        assert _stage(result, Stage.ACCEPTED)["offset"] == result.raw.offset
        assert _stage(result, Stage.UNWOUND)["offset"] == ended  # the run's own end record
        assert result.to_json()["stages"][1]["at"]


async def test_sigterm_waits_for_the_cleanup_and_the_end(electric: TestServer, client: AsyncClient) -> None:
    async with running_worker(_app(), electric.address):
        await _in_step(client, "cutter/t1")
        result = await client.terminate("cutter/t1", wait="terminal", timeout="30s")
        assert [r.stage for r in result.stages] == list(stages_of(Signal.SIGTERM))
        assert all(r.reached for r in result.stages), result.stages
        stopped = await _offset_of(
            client, "cutter/t1", lambda e: e.type == "state" and e.value["state"] == "stopped"
        )
        handler = await _offset_of(client, "cutter/t1", lambda e: e.type == "handler")
        assert _stage(result, Stage.TERMINAL)["offset"] == stopped
        assert _stage(result, Stage.UNWOUND)["offset"] == stopped > handler  # the cleanup ran first
        assert _stage(result, Stage.REAPED)["detail"] == "no process was running"


async def test_sigusr_waits_for_its_handler_and_a_timeout_says_what_was_not_reached(
    electric: TestServer, client: AsyncClient
) -> None:
    async with running_worker(_app(), electric.address):
        await _in_step(client, "agent/u1")
        result = await client.usr("agent/u1", "hello", wait="handled", timeout="30s")
        handled = _stage(result, Stage.HANDLED)
        assert handled["reached"] is True
        handler = await _offset_of(client, "agent/u1", lambda e: e.type == "handler")
        assert isinstance(handled["offset"], int)
        assert handled["offset"] > handler  # its outcome, written once the handler returned
        blocked = await client.usr("agent/u1", "block", wait="handled", timeout="300ms")
        assert not blocked.reached("handled")
        assert _stage(blocked, Stage.HANDLED)["detail"] == "not reached within 300ms"


async def test_an_exec_sigkill_waits_until_its_process_is_reaped(
    electric: TestServer, client: AsyncClient
) -> None:
    async with running_worker(_app(), electric.address):
        await client.spawn("proc/k1")
        await client.send("proc/k1", "hello")
        await until(client, "proc/k1", lambda e: e.type == "output")
        result = await client.kill("proc/k1", wait="reaped", timeout="30s")
        assert result.reached("reaped")
        exited = await _offset_of(
            client, "proc/k1", lambda e: e.type == "exec" and e.value["action"] == "exit"
        )
        assert _stage(result, Stage.REAPED)["offset"] == exited
        assert _stage(result, Stage.UNWOUND)["offset"] == result.raw.offset  # no run was in progress


async def test_a_stage_the_signal_does_not_have_is_refused_and_nothing_written(
    electric: TestServer, client: AsyncClient
) -> None:
    await client.spawn("agent/bad")
    before = (await client.events("agent/bad")).head_offset
    for signal, wait, code in (
        ("SIGUSR", "unwound", "STAGE_NOT_AVAILABLE"),
        ("SIGINT", "terminal", "STAGE_NOT_AVAILABLE"),
        ("SIGSTOP", "handled", "STAGE_NOT_AVAILABLE"),
        ("SIGTERM", "soon", "UNKNOWN_WAIT"),
    ):
        with pytest.raises(InvalidArgument) as raised:
            await client.signal("agent/bad", signal, wait=wait)
        assert raised.value.code == code
    with pytest.raises(InvalidArgument) as raised:
        await client.signal("agent/bad", "SIGTERM", timeout="1s")
    assert raised.value.code == "USAGE"
    assert (await client.events("agent/bad")).head_offset == before


async def test_a_worker_killed_between_stages_is_named(
    tmp_path: Path, electric: TestServer, client: AsyncClient
) -> None:
    """SIGUSR's handler blocks; the worker dies with kill -9 before it returns: `handled` is
    not reached, because the worker was lost (its lease ended), not because time ran out."""
    directory = app_module(tmp_path, "stages_app", SOURCE)
    proc = worker_process(electric.address, "stages_app:app", directory, directory / "worker.log")
    try:
        await _in_step(client, "agent/w1")
        async with anyio.create_task_group() as tg:
            answers: list[SignalResult] = []

            async def signal() -> None:
                answers.append(await client.usr("agent/w1", "block", wait="handled", timeout="60s"))

            tg.start_soon(signal)
            await until(client, "agent/w1", lambda e: e.type == "blocking")
            proc.kill()
        (answer,) = answers
        assert not answer.reached("handled")
        assert _stage(answer, Stage.HANDLED)["detail"] == "the worker was lost"
    finally:
        proc.kill()
        proc.wait(10)


async def test_the_cli_waits_for_a_stage_and_says_each(electric: TestServer, client: AsyncClient) -> None:
    cli = [sys.executable, "-m", "electric_sdk.cli.main", "--address", electric.address]
    async with running_worker(_app(), electric.address):
        await _in_step(client, "agent/c1")
        done = await anyio.run_process(
            [*cli, "signal", "agent/c1", "INT", "--wait", "unwound", "--timeout", "30s"]
        )
        lines = done.stdout.decode().splitlines()
        assert lines[0].startswith("/agent/c1: SIGINT running → running")
        assert [line.split()[0] for line in lines[1:]] == ["accepted", "unwound", "downstream"]
        assert "unwound     reached at offset" in lines[2]
        block = [*cli, "signal", "agent/c1", "USR", "--payload", '"block"', "--wait", "handled"]
        blocked = await anyio.run_process([*block, "--timeout", "200ms"], check=False)
        assert blocked.returncode == 124
        assert "handled not reached: not reached within 200ms" in blocked.stderr.decode()
        # --timeout 0 answers at once, with what is reached by then (the call keeps its deadline).
        at_once = await anyio.run_process([*block, "--timeout", "0"], check=False)
        assert at_once.returncode == 124, at_once.stderr
        assert at_once.stdout.decode().splitlines()[1].split()[:2] == ["accepted", "reached"]
        assert "handled not reached: not reached within 0s" in at_once.stderr.decode()
        refused = await anyio.run_process([*cli, "kill", "agent/c1", "--wait", "handled"], check=False)
        assert refused.returncode == 2
        assert "STAGE_NOT_AVAILABLE" in refused.stderr.decode()
        assert (await client.get("agent/c1")).state.value == "running"  # the refused kill sent nothing


async def test_the_http_door_waits_for_a_stage_too(tmp_path: Path) -> None:
    """`POST /{type}/{id}/signal?wait=unwound&timeout=30s`: the same stages as the SDK's; a stage
    the signal lacks is 400 STAGE_NOT_AVAILABLE with nothing written."""
    with TestServer(tmp_path / "electric", http="127.0.0.1:0") as server:
        async with server.async_client() as client, running_worker(_app(), server.address):
            key = await _in_step(client, "agent/h1")
            base = f"{server.http_address}/agent/h1/signal"
            async with httpx.AsyncClient(timeout=60) as http:
                refused = await http.post(f"{base}?wait=handled", json={"signal": "SIGINT"})
                assert refused.status_code == 400
                assert refused.json()["error"]["code"] == "STAGE_NOT_AVAILABLE"
                assert (await client.get("agent/h1")).state.value == "running"
                answer = await http.post(f"{base}?wait=unwound&timeout=30s", json={"signal": "SIGINT"})
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["signal"] == "SIGINT"
            stages = {s["stage"]: s for s in body["stages"]}
            assert list(stages) == ["accepted", "unwound", "downstream"]
            ended = await _offset_of(
                client,
                "agent/h1",
                lambda e: (
                    e.type == "run" and e.value["message_key"] == key and e.value["status"] == "aborted"
                ),
            )
            assert stages["unwound"]["reached"] is True
            assert stages["unwound"]["offset"] == ended
            async with httpx.AsyncClient(timeout=60) as http:
                # timeout=0ms is "now", as a send's ?wait=run takes it: a stage reached already
                # (no run left to unwind) says so, one still to come says it was not reached.
                idle = await http.post(f"{base}?wait=unwound&timeout=0ms", json={"signal": "SIGINT"})
                blocked = await http.post(
                    f"{base}?wait=handled&timeout=0ms", json={"signal": "SIGUSR", "payload": "block"}
                )
            assert idle.status_code == 200, idle.text
            assert {s["stage"]: s["reached"] for s in idle.json()["stages"]}["unwound"] is True
            assert blocked.status_code == 200, blocked.text
            handled = {s["stage"]: s for s in blocked.json()["stages"]}["handled"]
            assert handled["reached"] is False
            assert handled["detail"] == "not reached within 0s"
