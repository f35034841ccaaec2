"""A generation gets its graceful action once: a SIGTERM (or a drain) that comes while another
shutdown of the same generation is under way (its idle timeout's) joins that shutdown. Many
programs read a second SIGINT as "quit now", skipping their own cleanup.

A real process counts the signals it catches (child.py prints ``signal NAME`` for each)."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest
from runtime.rt_support import running_worker, state_is, until

from electric_sdk import Event
from electric_sdk.runtime import App
from electric_sdk.runtime.exec import ShutdownPolicy
from electric_sdk.testing import ManualClock, TestServer

from .support import child, line, output, ready, receipt, receipts

pytestmark = pytest.mark.anyio


def graceful_for(signal_key: str) -> Callable[[Event], bool]:
    def match(event: Event) -> bool:
        return receipt("graceful")(event) and event.value.get("signal_key", "") == signal_key

    return match


@pytest.mark.parametrize("first", ["idle timeout", "drain"])
async def test_a_sigterm_joins_the_shutdown_under_way(
    tmp_path: Path, first: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = App(code_version="t")
    # The first shutdown's policy sends SIGINT; the process takes it and goes on running.
    app.exec(
        "twice", child(), idle_timeout="60s", grace_period="20s", shutdown=ShutdownPolicy("SIGINT", "15s")
    )
    ref = "twice/a"
    clock = ManualClock(datetime.now(UTC))  # the idle timeout passes when the test says so
    with TestServer(
        tmp_path / "electric", clock=clock, lease_ttl_ms=600_000
    ) as server:  # outlives the advance
        async with server.async_client() as client:
            async with (
                running_worker(app, server.address, clock=clock) as worker,
                anyio.create_task_group() as tg,
            ):
                await client.spawn(ref)
                pid = await ready(client, ref)  # its handlers are in
                if first == "drain":
                    tg.start_soon(worker.shutdown, 30.0)
                else:
                    clock.advance(60)
                await until(client, ref, line("signal SIGINT"))  # the first shutdown's graceful action
                term = await client.signal(ref, "SIGTERM")
                await until(client, ref, graceful_for(term.key))  # the cleanup's word on its graceful action
                # Signals are handled in the order of their numbers: a second SIGINT would be seen first.
                os.kill(pid, signal.SIGUSR1)
                await until(client, ref, line("signal SIGUSR1"))
                os.kill(pid, signal.SIGUSR2)  # its default action ends it: the shutdown is over
                await until(client, ref, state_is("stopped", "cleanup_complete"))
            caught = [ln for ln in await output(client, ref) if ln.startswith("signal")]
            got = await receipts(client, ref)
    assert caught == ["signal SIGINT", "signal SIGUSR1"]
    assert [
        r.get("signal_key", "") for r in got if r["action"] == "graceful" and r["disposition"] == "issued"
    ] == [""]
    # The idle timeout's end found the entity stopping: no attempt at `idle`, no host failure.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
