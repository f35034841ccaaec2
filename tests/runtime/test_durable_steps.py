"""Recorded steps and durable state with real worker processes, killed with kill -9.

Each step's side effect appends a line to a file, so a test counts how often
each one really ran. Tests synchronize on the entities' event streams (the
``electric.step`` / ``electric.state`` records), never on sleeps; durations
are milliseconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from electric_sdk import AsyncClient, Event
from electric_sdk.testing import TestServer

from .rt_support import COMPLETED, FAILED, run_status, until, worker_process
from .test_crash_recovery import free_port

pytestmark = pytest.mark.anyio

TIMEOUT_S = 20.0

APP = textwrap.dedent(
    """
    import os
    from pathlib import Path

    import anyio

    from electric_sdk.lifecycle import Signal
    from electric_sdk.runtime import App, Context, Message, Retry, SignalInfo

    app = App("durable-steps")
    MODE = os.environ.get("MODE", "")
    COUNTS = Path(os.environ["COUNTS"])


    def count(what: str) -> str:
        with COUNTS.open("a") as f:
            f.write(what + "\\n")
        return what


    @app.entity("three", idle_timeout="60s")
    async def three(ctx: Context, message: Message) -> None:
        results = []
        for i in (1, 2, 3):
            if i == 3 and MODE == "hang":
                await anyio.sleep(60)  # killed here: after 2 of 3 steps
            name = f"tool:new{i}" if MODE == "changed" else f"tool:{i}"
            results.append(await ctx.step(name, count, f"{message.text}:{i}"))
        ctx.output.write(",".join(results))


    async def flaky(text: str) -> str:
        count(f"try:{text}")
        if MODE == "hang":
            failed = COUNTS.read_text().count(f"try:{text}")
            if failed <= 2:
                raise ConnectionError(f"flaky try {failed}")
            await anyio.sleep(60)  # the third try: killed here
        return "fine"


    @app.entity("flaky", idle_timeout="60s")
    async def flaky_entity(ctx: Context, message: Message) -> None:
        retry = Retry(attempts=5, backoff="20ms", multiplier=2, jitter=0.5, on=(ConnectionError,))
        ctx.state["asked"].append(message.text)  # written with the step's result, once
        ctx.output.write(await ctx.step("tool:flaky", flaky, message.text, retry=retry))


    @app.entity("slow", idle_timeout="60s")
    async def slow(ctx: Context, message: Message) -> None:
        await ctx.step("tool:slow", anyio.sleep, 30, timeout="50ms")


    @app.entity("notes", idle_timeout="60s")
    class Notes:
        def __init__(self) -> None:
            self.go = anyio.Event()

        async def on_message(self, ctx: Context, message: Message) -> None:
            if message.text == "wait":
                await ctx.step("announce", count, "waiting")
                await self.go.wait()  # the SIGUSR handler sets it, after changing the state
                tone = await ctx.step("read", lambda: ctx.state["prefs"].get("tone"))
                ctx.output.write(f"tone={tone}")
                return
            ctx.state["history"].append(message.text)
            ctx.output.write(",".join(ctx.state["history"]))

        async def on_signal(self, ctx: Context, signal: SignalInfo) -> None:
            if signal.signal is Signal.SIGUSR:
                ctx.state["prefs"]["tone"] = signal.payload
                self.go.set()
    """
)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    d = tmp_path / "app"
    d.mkdir()
    (d / "durable_app.py").write_text(APP)
    return d


@pytest.fixture
def counts(app_dir: Path) -> Path:
    return app_dir / "counts.txt"


@pytest.fixture
def workers(app_dir: Path, counts: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """``start(address, mode)``: an `electric worker` process hosting durable_app:app."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(address: str, mode: str = "") -> subprocess.Popen[bytes]:
        log = app_dir / f"worker-{len(procs)}.log"
        proc = worker_process(address, "durable_app:app", app_dir, log, MODE=mode, COUNTS=str(counts))
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def kill9(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


def server(data: Path, port: int) -> TestServer:
    return TestServer(data, listen=f"127.0.0.1:{port}", lease_ttl_ms=500, heartbeat_interval_ms=100)


def step_is(index: int, outcome: str, **fields: Any) -> Callable[[Event], bool]:
    def match(e: Event) -> bool:
        data = e.value.get("data") if e.type == "electric.step" else None
        return (
            isinstance(data, dict)
            and data["index"] == index
            and data["outcome"] == outcome
            and all(data.get(k) == v for k, v in fields.items())
        )

    return match


async def step_records(client: AsyncClient, ref: str) -> list[dict[str, Any]]:
    events = (await client.events(ref, 0, 1000)).events
    return [e.value["data"] for e in events if e.type == "electric.step"]


async def crash_mid_run(
    address: str,
    client: AsyncClient,
    workers: Callable[..., subprocess.Popen[bytes]],
    ref: str,
    text: str,
    recorded: Callable[[Event], bool],
    then: str = "",
) -> str:
    """Run ``text`` on a worker in mode "hang", kill -9 it once ``recorded`` is in the stream, and
    start a worker in mode ``then``; returns the message's key."""
    first = workers(address, "hang")
    await client.spawn(ref)
    receipt = await client.send(ref, text)
    await until(client, ref, recorded)
    kill9(first)
    workers(address, then)
    return receipt.key


def lines(counts: Path) -> Counter[str]:
    return Counter(counts.read_text().split())


async def test_a_run_redelivered_after_kill9_runs_only_the_steps_not_recorded(
    tmp_path: Path, workers: Callable[..., subprocess.Popen[bytes]], counts: Path
) -> None:
    with server(tmp_path / "electric", free_port()) as srv:
        async with srv.async_client() as client:
            # Killed after 2 of 3 steps.
            key = await crash_mid_run(
                srv.address, client, workers, "three/t1", "job", step_is(1, "ok", name="tool:2")
            )
            done = await until(client, "three/t1", run_status(COMPLETED, key))
            assert done.raw.run.attempt == 2
            assert done.raw.run.output == "job:1,job:2,job:3"  # replayed results, then step 3's
            assert lines(counts) == {"job:1": 1, "job:2": 1, "job:3": 1}
            records = await step_records(client, "three/t1")
            assert [(r["index"], r["attempt"]) for r in records] == [(0, 1), (1, 1), (2, 2)]


async def test_a_changed_code_path_is_refused_and_recorded(
    tmp_path: Path, workers: Callable[..., subprocess.Popen[bytes]], counts: Path
) -> None:
    with server(tmp_path / "electric", free_port()) as srv:
        async with srv.async_client() as client:
            # The worker that takes over runs changed code: a deploy renamed the steps.
            key = await crash_mid_run(
                srv.address, client, workers, "three/t2", "job", step_is(1, "ok"), "changed"
            )
            failed = await until(client, "three/t2", run_status(FAILED, key))
            assert failed.raw.run.attempt == 2
            assert failed.raw.run.error.startswith(
                "NonDeterministicRun: step 0 of this run was recorded as 'tool:1'"
            )
            records = await step_records(client, "three/t2")
            assert records[-1]["outcome"] == "nondeterministic"
            assert (records[-1]["name"], records[-1]["expected"]) == ("tool:new1", "tool:1")
            assert lines(counts) == {"job:1": 1, "job:2": 1}  # nothing ran on the changed path


async def test_retries_back_off_and_their_count_survives_a_crash(
    tmp_path: Path, workers: Callable[..., subprocess.Popen[bytes]], counts: Path
) -> None:
    with server(tmp_path / "electric", free_port()) as srv:
        async with srv.async_client() as client:
            # Killed during the backoff before try 3, or during try 3: neither was recorded.
            key = await crash_mid_run(
                srv.address, client, workers, "flaky/f1", "x", step_is(0, "retry", **{"try": 2})
            )
            done = await until(client, "flaky/f1", run_status(COMPLETED, key))
            assert done.raw.run.attempt == 2
            records = await step_records(client, "flaky/f1")
            # Tries 1 and 2 failed and were recorded; try 3, cut short by the crash, ran again as try 3.
            assert [(r["outcome"], r["try"], r["attempt"]) for r in records] == [
                ("retry", 1, 1),
                ("retry", 2, 1),
                ("ok", 3, 2),
            ]
            events = (await client.events("flaky/f1", 0, 1000)).events
            retried = [e for e in events if e.type == "electric.step"]
            # Backoff: 20 ms before try 2 (+-50% jitter), so at least 10 ms between the records.
            gap_ms = (retried[1].timestamp - retried[0].timestamp).total_seconds() * 1000
            assert gap_ms >= 10, gap_ms
            assert await client.state("flaky/f1") == {"asked": ["x"]}


async def test_a_step_past_its_timeout_fails_and_is_recorded(
    tmp_path: Path, workers: Callable[..., subprocess.Popen[bytes]]
) -> None:
    with server(tmp_path / "electric", free_port()) as srv:
        async with srv.async_client() as client:
            workers(srv.address)
            await client.spawn("slow/s1")
            receipt = await client.send("slow/s1", "go")
            failed = await until(client, "slow/s1", run_status(FAILED, receipt.key))
            assert failed.raw.run.error.startswith("StepTimeout: step 'tool:slow' failed after 1 try")
            (record,) = await step_records(client, "slow/s1")
            assert record["outcome"] == "error"
            assert record["error"]["type"] == "StepTimeout"
            assert "50 ms" in record["error"]["message"]


async def test_a_handlers_state_change_is_seen_by_the_runs_next_step(
    tmp_path: Path, workers: Callable[..., subprocess.Popen[bytes]]
) -> None:
    with server(tmp_path / "electric", free_port()) as srv:
        async with srv.async_client() as client:
            workers(srv.address)
            await client.spawn("notes/n1")
            receipt = await client.send("notes/n1", "wait")
            await until(client, "notes/n1", step_is(0, "ok", name="announce"))
            await client.usr("notes/n1", "short")
            done = await until(client, "notes/n1", run_status(COMPLETED, receipt.key))
            assert done.raw.run.output == "tone=short"
            assert (await client.state("notes/n1")) == {"prefs": {"tone": "short"}}


async def test_state_survives_worker_kill9_sighup_and_server_restart(
    tmp_path: Path, workers: Callable[..., subprocess.Popen[bytes]]
) -> None:
    port, data = free_port(), tmp_path / "electric"
    ref = "notes/n2"

    async def send(client: AsyncClient, text: str) -> str:
        receipt = await client.send(ref, text)
        return (await until(client, ref, run_status(COMPLETED, receipt.key))).raw.run.output

    with server(data, port) as srv:
        async with srv.async_client() as client:
            first = workers(srv.address)
            await client.spawn(ref)
            assert await send(client, "a") == "a"
            assert await send(client, "b") == "a,b"
            kill9(first)
            workers(srv.address)
            assert await send(client, "c") == "a,b,c"  # rebuilt on the new worker's lease
            await client.reload(ref)
            await until(client, ref, lambda e: e.type == "state" and e.value.get("cause") == "reload")
            assert await send(client, "d") == "a,b,c,d"  # rebuilt at the wake after SIGHUP
    with server(data, port) as srv:  # the same data and port: the worker reconnects
        async with srv.async_client() as client:
            assert await send(client, "e") == "a,b,c,d,e"
            assert await client.state(ref) == {"history": ["a", "b", "c", "d", "e"]}
            cli = [sys.executable, "-m", "electric_sdk.cli.main", "--address", srv.address, "--json"]
            shown = await anyio.run_process([*cli, "state", ref])
            assert json.loads(shown.stdout) == {"ref": ref, "state": {"history": ["a", "b", "c", "d", "e"]}}
