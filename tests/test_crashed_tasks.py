"""A task of the server that crashes (a bug) is logged when it crashes, and its server says so
when it stops: ``stop()`` raises ``TasksCrashed`` with every crash, and ``serve()`` (so
`electric server`) drains and exits 70 instead of 0.

The bug is injected through the server's one public test hook for time, ``ServerConfig.clock``:
a clock that breaks once told to, and then wakes its readers (the reaper asks it the time
outside any of its own guards, so its task ends with the clock's error).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from electric_server import ElectricServer, ServerConfig, TasksCrashed
from electric_server.app import EXIT_CRASHED, serve
from electric_server.clock import SYSTEM_CLOCK

from electric_sdk.cli import exit_codes

pytestmark = pytest.mark.anyio


class Broken(RuntimeError):
    """The injected bug."""


class BreakingClock:
    """The system's time until ``brake()``; then every reading raises ``Broken``."""

    def __init__(self) -> None:
        self.broken = False
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def now_ms(self) -> int:
        if self.broken:
            raise Broken("the clock broke")
        return SYSTEM_CLOCK.now_ms()

    def monotonic(self) -> float:
        return SYSTEM_CLOCK.monotonic()

    def on_advance(self, callback: Callable[[], None]) -> Callable[[], None]:
        with self._lock:
            self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback)

    def brake(self) -> None:
        self.broken = True
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:  # as a jump of the clock does: its sleepers wake and read it
            callback()


class CrashHeard(logging.Handler):
    """Set once a task's crash is logged (on the loop's thread, where tasks end)."""

    def __init__(self) -> None:
        super().__init__()
        self.heard = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "crashed" in record.getMessage():
            self.heard.set()


@pytest.fixture(name="crash_heard")
def crash_heard_fixture() -> Iterator[asyncio.Event]:
    handler = CrashHeard()
    logger = logging.getLogger("electric_server.lifetime")
    logger.addHandler(handler)
    try:
        yield handler.heard
    finally:
        logger.removeHandler(handler)


async def test_stop_raises_every_crash_after_a_full_stop(tmp_path: Path, crash_heard: asyncio.Event) -> None:
    clock = BreakingClock()
    server = ElectricServer(ServerConfig(listen="127.0.0.1:0", data_dir=tmp_path / "d", clock=clock))
    await server.start()
    clock.brake()
    await crash_heard.wait()  # logged when it happens, not only at the stop
    with pytest.raises(TasksCrashed) as raised:
        await server.stop()
    assert [type(e) for e in raised.value.exceptions] == [Broken]
    assert "1 of its tasks had crashed" in str(raised.value)
    await server.stop()  # stopped all the same: a second stop is a no-op
    # Every component was left: the data directory can be served again.
    again = ElectricServer(ServerConfig(listen="127.0.0.1:0", data_dir=tmp_path / "d"))
    await again.start()
    await again.stop()


async def test_serve_drains_and_exits_70_after_a_crash(
    tmp_path: Path, crash_heard: asyncio.Event, caplog: pytest.LogCaptureFixture
) -> None:
    assert EXIT_CRASHED == exit_codes.SOFTWARE  # the server's code is the CLI's contract
    clock = BreakingClock()
    ready = asyncio.Event()
    serving = asyncio.ensure_future(
        serve(ServerConfig(listen="127.0.0.1:0", data_dir=tmp_path / "d", clock=clock), ready=ready)
    )
    await ready.wait()
    clock.brake()
    await crash_heard.wait()
    os.kill(os.getpid(), signal.SIGTERM)  # serve's own handler drains (it is removed after)
    assert await serving == exit_codes.SOFTWARE
    assert any(
        r.levelno == logging.CRITICAL and f"exiting {EXIT_CRASHED}" in r.getMessage() for r in caplog.records
    )
