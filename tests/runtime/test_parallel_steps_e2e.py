"""Parallel recorded steps and typed results with real worker processes, killed with kill -9.

Each step's side effect appends a line to a file, so a test counts how often
each one really ran; tests synchronize on the entities' event streams, never
on sleeps.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from electric_sdk import Event
from electric_sdk.runtime import App, Context, Message
from electric_sdk.testing import TestServer, replay

from .rt_support import ABORTED, COMPLETED, FAILED, run_status, until, worker_process
from .test_crash_recovery import free_port

pytestmark = pytest.mark.anyio

APP = textwrap.dedent(
    """
    import asyncio
    import os
    from pathlib import Path

    import anyio
    import pydantic

    from electric_sdk.runtime import App, Context, Message, Retry

    app = App("parallel-steps")
    MODE = os.environ.get("MODE", "")
    COUNTS = Path(os.environ["COUNTS"])


    class Answer(pydantic.BaseModel):
        text: str
        sources: list[str]


    def count(what: str) -> None:
        with COUNTS.open("a") as f:
            f.write(what + "\\n")


    async def tool(ctx: Context, name: str) -> str:
        count(name)
        if MODE == "hang" and name == "c":
            await anyio.sleep(60)  # killed here, a and b recorded
        if name == "flaky" and COUNTS.read_text().split().count("flaky") < 3:
            raise ConnectionError("try again")
        if name.startswith("hold"):
            try:
                await ctx.emit("test.holding", name)
                await anyio.sleep(60)  # the SIGINT comes here
            except BaseException:
                count("cancelled:" + name)
                raise
        return name.upper()


    @app.entity("fan", idle_timeout="60s")
    async def fan(ctx: Context, message: Message) -> str:
        if message.text == "report":
            return " ".join(sorted(COUNTS.read_text().split()))
        retry = Retry(attempts=3, backoff="1ms", on=(ConnectionError,))
        names = message.text.split(",")
        found = await asyncio.gather(*(ctx.step(f"tool:{n}", tool, ctx, n, retry=retry) for n in names))
        return "+".join(found)


    @app.entity("dup", idle_timeout="60s")
    async def dup(ctx: Context, message: Message) -> None:
        await asyncio.gather(ctx.step("tool:search", str, 1), ctx.step("tool:search", str, 2))


    @app.entity("typed", idle_timeout="60s")
    async def typed(ctx: Context, message: Message) -> str:
        def answer() -> Answer:
            count("answer")
            return Answer(text=message.text, sources=["a", "b"])

        found = await ctx.step("model:answer", answer)
        if MODE == "hang":
            await anyio.sleep(60)  # killed here, the answer recorded
        assert isinstance(found, Answer)
        return found.model_dump_json()
    """
)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    d = tmp_path / "app"
    d.mkdir()
    (d / "parallel_app.py").write_text(APP)
    return d


@pytest.fixture
def counts(app_dir: Path) -> Path:
    return app_dir / "counts.txt"


@pytest.fixture
def workers(app_dir: Path, counts: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(address: str, mode: str = "") -> subprocess.Popen[bytes]:
        log = app_dir / f"worker-{len(procs)}.log"
        proc = worker_process(address, "parallel_app:app", app_dir, log, MODE=mode, COUNTS=str(counts))
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


def server(data: Path) -> TestServer:
    return TestServer(data, listen=f"127.0.0.1:{free_port()}", lease_ttl_ms=500, heartbeat_interval_ms=100)


def nth_ok_step(n: int) -> Callable[[Event], bool]:
    seen: list[str] = []

    def match(e: Event) -> bool:
        data = e.value.get("data") if e.type == "electric.step" else None
        if isinstance(data, dict) and data["outcome"] == "ok":
            seen.append(data["name"])
        return len(seen) >= n

    return match


def lines_in_order(counts: Path) -> list[str]:
    return counts.read_text().split()


def lines(counts: Path) -> Counter[str]:
    return Counter(counts.read_text().split())


async def test_three_parallel_steps_killed_with_two_done_run_only_the_third_again(
    tmp_path: Path, workers: Callable[..., subprocess.Popen[bytes]], counts: Path
) -> None:
    with server(tmp_path / "electric") as srv:
        async with srv.async_client() as client:
            first = workers(srv.address, "hang")
            await client.spawn("fan/f1")
            key = (await client.send("fan/f1", "a,b,c")).key
            await until(client, "fan/f1", nth_ok_step(2))
            kill9(first)
            workers(srv.address)
            done = await until(client, "fan/f1", run_status(COMPLETED, key))
            assert done.raw.run.attempt == 2
            assert done.raw.run.output == "A+B+C"
            assert lines(counts) == {"a": 1, "b": 1, "c": 2}
            events = (await client.events("fan/f1", 0, 1000)).events
            steps = [e.value["data"] for e in events if e.type == "electric.step"]
            assert sorted((s["key"], s["attempt"]) for s in steps) == [
                ("tool:a", 1),
                ("tool:b", 1),
                ("tool:c", 2),
            ]
            assert {s["index"] for s in steps} == {0}  # one group, one position
        # The replay check answers each parallel step from its record (and runs none of them), and
        # finds code that asks for another step where the group was recorded.
        replay(check_app(plan_first=False), server=srv, all_runs=True).assert_replays()
        problems = replay(check_app(plan_first=True), server=srv, all_runs=True).problems
        assert [(p.index, p.recorded, p.asked) for p in problems] == [
            (0, "parallel steps 'tool:a', 'tool:b', 'tool:c'", "model:plan")
        ]


def check_app(*, plan_first: bool) -> App:
    app = App("check")

    def never() -> str:
        raise AssertionError("a replay check runs no step")

    @app.entity("fan")
    async def fan(ctx: Context, message: Message) -> None:
        if plan_first:
            await ctx.step("model:plan", never)
        await asyncio.gather(*(ctx.step(f"tool:{n}", never) for n in message.text.split(",")))

    return app


async def test_a_failing_parallel_step_is_retried_alone_and_sigint_aborts_them_all(
    tmp_path: Path, workers: Callable[..., subprocess.Popen[bytes]], counts: Path
) -> None:
    with server(tmp_path / "electric") as srv:
        async with srv.async_client() as client:
            workers(srv.address)
            await client.spawn("fan/f2")
            key = (await client.send("fan/f2", "a,flaky,b")).key
            done = await until(client, "fan/f2", run_status(COMPLETED, key))
            assert done.raw.run.output == "A+FLAKY+B"
            assert lines(counts) == {"a": 1, "b": 1, "flaky": 3}

            held: list[str] = []
            key = (await client.send("fan/f2", "hold1,hold2,hold3")).key
            await until(
                client,
                "fan/f2",
                lambda e: e.type == "test.holding" and held.append(e.key) is None and len(held) == 3,
            )
            await client.interrupt("fan/f2")
            aborted = await until(client, "fan/f2", run_status(ABORTED, key))
            assert aborted.raw.run.message_key == key
            key = (await client.send("fan/f2", "report")).key
            report = await until(client, "fan/f2", run_status(COMPLETED, key))
            reported = report.raw.run.output.split()
            assert [x for x in reported if x.startswith("cancelled:")] == [
                "cancelled:hold1",
                "cancelled:hold2",
                "cancelled:hold3",
            ]
            events = (await client.events("fan/f2", 0, 1000)).events
            held_records = [
                e.value["data"]
                for e in events
                if e.type == "electric.step" and str(e.value["data"].get("key", "")).startswith("tool:hold")
            ]
            assert held_records == []  # cut short: no outcome, they would run again


async def test_a_duplicate_unnamed_pair_is_refused(
    tmp_path: Path, workers: Callable[..., subprocess.Popen[bytes]]
) -> None:
    with server(tmp_path / "electric") as srv:
        async with srv.async_client() as client:
            workers(srv.address)
            await client.spawn("dup/d1")
            key = (await client.send("dup/d1", "go")).key
            failed = await until(client, "dup/d1", run_status(FAILED, key))
            assert "two parallel steps named 'tool:search'" in failed.raw.run.error
            assert "key=" in failed.raw.run.error


async def test_a_pydantic_result_replayed_after_kill9_equals_the_original(
    tmp_path: Path, workers: Callable[..., subprocess.Popen[bytes]], counts: Path
) -> None:
    with server(tmp_path / "electric") as srv:
        async with srv.async_client() as client:
            first = workers(srv.address, "hang")
            await client.spawn("typed/t1")
            key = (await client.send("typed/t1", "why")).key
            recorded = await until(client, "typed/t1", nth_ok_step(1))
            assert recorded.value["data"]["type"] == "parallel_app:Answer"
            assert recorded.value["data"]["result"] == {"text": "why", "sources": ["a", "b"]}
            kill9(first)
            workers(srv.address)
            done = await until(client, "typed/t1", run_status(COMPLETED, key))
            assert done.raw.run.attempt == 2
            assert done.raw.run.output == '{"text":"why","sources":["a","b"]}'
            assert lines(counts) == {"answer": 1}  # replayed from its record, rebuilt as an Answer


async def test_a_worker_that_loses_its_session_cancels_its_steps_before_its_next_lease(
    tmp_path: Path, workers: Callable[..., subprocess.Popen[bytes]], counts: Path
) -> None:
    port, data = free_port(), tmp_path / "electric"

    def holding(e: Event) -> bool:
        return e.type == "test.holding"

    def at(port: int) -> TestServer:
        return TestServer(data, listen=f"127.0.0.1:{port}", lease_ttl_ms=500, heartbeat_interval_ms=100)

    with at(port) as srv:
        async with srv.async_client() as client:
            workers(srv.address)
            await client.spawn("fan/f3")
            await client.send("fan/f3", "hold1")
            first = await until(client, "fan/f3", holding)
    with at(port) as srv:  # the same data and port: the worker reconnects, is leased the entity again
        async with srv.async_client() as client:
            await until(client, "fan/f3", holding, start=first.offset + 1)
            # The first attempt's step was cancelled before the new lease ran it again.
            assert lines_in_order(counts) == ["hold1", "cancelled:hold1", "hold1"]
