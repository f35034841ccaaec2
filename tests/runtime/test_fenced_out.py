"""A worker fenced out of its lease says so in one WARNING line: what its run raised after that is
no longer the entity's (the next lease runs the message again), so it is not an ERROR with a
traceback, and no record of the run is written by the worker that lost it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from electric_sdk.runtime import App, Context, Message
from electric_sdk.testing import TestServer

from .rt_support import COMPLETED, FAILED, TIMEOUT_S, run_status, running_worker, state_is, until

pytestmark = pytest.mark.anyio

REF = "frozen/f1"


def frozen_app(entered: threading.Event, thaw: threading.Event) -> App:
    """Its first attempt's step blocks the worker's event loop until ``thaw`` (a frozen worker:
    a long GC pause, SIGSTOP), then times out as the tool's own call would."""
    app = App(code_version="test")

    @app.entity("frozen")
    class Frozen:
        async def on_message(self, ctx: Context, message: Message) -> str:
            async def tool() -> str:
                if ctx.attempt == 1:
                    entered.set()
                    thaw.wait(TIMEOUT_S)  # blocks the loop: no heartbeat goes out meanwhile
                    raise TimeoutError("the tool's call timed out")
                return "done"

            return str(await ctx.step("tool:call", tool))

    return app


@contextmanager
def runtime_records() -> Iterator[tuple[list[logging.LogRecord], threading.Event]]:
    """The runtime's WARNING-and-above records naming the entity; the event is set at the first."""
    records: list[logging.LogRecord] = []
    seen = threading.Event()

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "f1" in record.getMessage():
                records.append(record)
                seen.set()

    logger, handler = logging.getLogger("electric.runtime"), Keep(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield records, seen
    finally:
        logger.removeHandler(handler)


async def test_a_fenced_out_run_is_one_warning_without_a_traceback(tmp_path: Path) -> None:
    entered, thaw, stop = threading.Event(), threading.Event(), threading.Event()

    def serve(address: str) -> None:  # on a loop of its own: the step freezes that loop, not ours
        async def main() -> None:
            async with running_worker(frozen_app(entered, thaw), address):
                await anyio.to_thread.run_sync(stop.wait)

        anyio.run(main)

    with (
        TestServer(tmp_path / "electric", lease_ttl_ms=300, heartbeat_interval_ms=50) as server,
        runtime_records() as (records, seen),
    ):
        worker = threading.Thread(target=serve, args=(server.address,))
        worker.start()
        try:
            async with server.async_client() as client:
                await client.spawn(REF)
                receipt = await client.send(REF, "go")
                with anyio.fail_after(TIMEOUT_S):
                    assert await anyio.to_thread.run_sync(entered.wait, TIMEOUT_S)
                await until(client, REF, state_is("idle", "runtime_lost"))  # the frozen worker's lease ended
                thaw.set()
                with anyio.fail_after(TIMEOUT_S):
                    assert await anyio.to_thread.run_sync(seen.wait, TIMEOUT_S)
                done = await until(client, REF, run_status(COMPLETED, receipt.key))
                assert done.raw.run.attempt == 2  # the next lease ran the message again
                runs = [e.raw.run for e in (await client.events(REF, 0, 100)).events if e.type == "run"]
        finally:
            thaw.set()
            stop.set()
            await anyio.to_thread.run_sync(worker.join, TIMEOUT_S)
    [line] = records
    assert line.levelno == logging.WARNING
    assert line.exc_info is None  # no traceback
    assert "fenced out" in line.getMessage()
    assert "TimeoutError" in line.getMessage()
    assert FAILED not in [r.status for r in runs]  # the worker that lost the run recorded nothing of it
