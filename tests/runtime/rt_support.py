"""Shared by the runtime tests: a probe entity type whose step the test holds open, a running
worker, and ``until`` (watch the entity's stream for the record a test waits for)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from electric_sdk import AsyncClient, Event
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import Signal
from electric_sdk.runtime import App, Context, Message, SignalInfo, Worker

TIMEOUT_S = 10.0


@dataclass
class Probe:
    """What the probe entities did, and the gates the test opens."""

    release: anyio.Event = field(default_factory=anyio.Event)
    entered: anyio.Event = field(default_factory=anyio.Event)
    log: list[str] = field(default_factory=list)
    signals: list[SignalInfo] = field(default_factory=list)
    seen: dict[Signal, anyio.Event] = field(default_factory=lambda: {s: anyio.Event() for s in Signal})
    step_open: bool = False
    usr_during_step: bool | None = None
    cleanup_release: anyio.Event | None = None


def probe_app(probe: Probe, **profile: Any) -> App:
    """``hold``: a step held open until ``probe.release``; anything else: one quick step
    (``remember X`` first appends X to the ``notes`` list of ``ctx.state``)."""
    app = App(code_version="test")

    @app.entity("probe", **profile)
    class ProbeEntity:
        async def on_message(self, ctx: Context, message: Message) -> None:
            probe.log.append(f"start {message.text} attempt={ctx.attempt}")
            if message.text == "hold":
                ctx.output.write("partial")
                async with ctx.step("tool:hold"):
                    probe.step_open = True
                    probe.entered.set()
                    try:
                        await probe.release.wait()
                    finally:
                        probe.step_open = False
                        probe.log.append("step released")
                ctx.output.write(" more")
                async with ctx.step("model:after"):
                    probe.log.append("after step")
            else:
                if message.text.startswith("remember "):  # durable state, for its readers' tests
                    ctx.state["notes"].append(message.text.removeprefix("remember "))
                async with ctx.step("tool:quick"):
                    ctx.output.write(f"done {message.text}")
            probe.log.append(f"end {message.text}")

        async def on_signal(self, ctx: Context, signal: SignalInfo) -> None:
            probe.log.append(f"signal {signal.signal.value}")
            probe.signals.append(signal)
            if signal.signal is Signal.SIGUSR:
                probe.usr_during_step = probe.step_open
            if signal.signal is Signal.SIGTERM and probe.cleanup_release is not None:
                await probe.cleanup_release.wait()
            probe.seen[signal.signal].set()

    return app


def app_module(tmp_path: Path, module: str, source: str) -> Path:
    """A directory holding ``module``.py with ``source``, for a worker process to import."""
    directory = tmp_path / "app"
    directory.mkdir()
    (directory / f"{module}.py").write_text(source)
    return directory


def worker_process(
    address: str, target: str, cwd: Path, log: Path, *args: str, **env: str
) -> subprocess.Popen[bytes]:
    """`electric worker TARGET ARGS` as its own process (run from ``cwd``, output to ``log``)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "electric_sdk.cli.main", "--address", address, "worker", target, *args],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        )


@contextmanager
def worker_processes(cwd: Path, target: str, *args: str) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """``start(address, **env)``: an `electric worker TARGET ARGS` process run from ``cwd`` (its
    output in ``worker-N.log`` there); each one still running is killed at the end."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(address: str, **env: str) -> subprocess.Popen[bytes]:
        proc = worker_process(address, target, cwd, cwd / f"worker-{len(procs)}.log", *args, **env)
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


@asynccontextmanager
async def running_worker(
    app: App, address: str, worker: Worker | None = None, **kw: Any
) -> AsyncIterator[Worker]:
    """A worker hosting ``app`` on the test's loop (``worker``: one made already, e.g. a subclass)."""
    worker = worker or Worker(app, address, **kw)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(TIMEOUT_S):
            await tg.start(worker.run)
        try:
            yield worker
        finally:
            with anyio.fail_after(TIMEOUT_S):
                await worker.shutdown(1.0)


@contextmanager
def on_log(text: str, call: Callable[[], None]) -> Iterator[None]:
    """Calls ``call`` when the runtime logs a line holding ``text``, its debug lines too (a worker
    run in the test's process logs on the test's loop, so ``call`` may set an ``anyio.Event``)."""

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if text in record.getMessage():
                call()

    logger, handler = logging.getLogger("electric.runtime"), Seen(logging.DEBUG)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def until(client: AsyncClient, ref: str, predicate: Callable[[Event], bool], start: int = 0) -> Event:
    """The first event of the entity's stream (from ``start``) that matches; fails after TIMEOUT_S."""
    with anyio.fail_after(TIMEOUT_S):
        async for event in client.watch(ref, start):
            if predicate(event):
                return event
    raise AssertionError(f"{ref}: the stream ended before the awaited event")


def run_status(status: int, text_key: str | None = None) -> Callable[[Event], bool]:
    def match(event: Event) -> bool:
        return (
            event.type == "run"
            and event.raw.run.status == status
            and (text_key is None or event.raw.run.message_key == text_key)
        )

    return match


def state_is(state: str, cause: str | None = None) -> Callable[[Event], bool]:
    def match(event: Event) -> bool:
        return (
            event.type == "state"
            and event.value["state"] == state
            and (cause is None or event.value["cause"] == cause)
        )

    return match


def outcome_of(key: str, outcome: str | None = None) -> Callable[[Event], bool]:
    def match(event: Event) -> bool:
        return (
            event.type == "signal"
            and event.key == key
            and event.operation == "update"
            and (outcome is None or event.value["outcome"] == outcome)
        )

    return match


COMPLETED, ABORTED, FAILED, STARTED, STEP = (
    pb.RUN_STATUS_COMPLETED,
    pb.RUN_STATUS_ABORTED,
    pb.RUN_STATUS_FAILED,
    pb.RUN_STATUS_STARTED,
    pb.RUN_STATUS_STEP,
)


# An app module whose entity writes ``{version}`` as its output: a test writes it, edits it and
# sees `electric dev`'s reload (AppReloader) pick the edit up at the next wake.
HOT_APP = """
from electric_sdk.runtime import App

app = App()


@app.entity("hot")
async def hot(ctx, message):
    ctx.output.write("{version}")
"""
