"""The server's clock: the one place a SQLite server reads the time its rules judge by.

Grace deadlines (reaper.py), the writes' timestamps (``WriteContext.now_ms``),
worker sessions' liveness and heartbeats (store/sessions.py, lease_sweep.py,
runtime/hosting.py) all ask the ``Clock`` in ``ServerConfig.clock``: the real
one by default, or a test's ``electric_sdk.testing.ManualClock``, so a test of
a 30 s grace advances the clock instead of waiting (docs/runtime.md, "Testing
your agent"). On PostgreSQL the database's clock judges writes and leases
(store/postgres*.py); a manual clock moves only what this replica decides.

A clock that jumps wakes whoever sleeps until a time: ``on_advance`` registers
a callback run after each jump, from the thread that advanced it (so a
callback must be thread-safe: ``wake_on_advance`` hands it to the loop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock", "wake_on_advance"]


@runtime_checkable
class Clock(Protocol):
    def now_ms(self) -> int:
        """The wall clock in milliseconds since the epoch: timestamps and deadlines."""

    def monotonic(self) -> float:
        """Seconds that never go back: liveness of sessions and heartbeats."""

    def on_advance(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` after every jump of the clock; returns the way to stop."""


class SystemClock:
    """The real clock: it never jumps, so nobody needs waking."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    def on_advance(self, callback: Callable[[], None]) -> Callable[[], None]:
        return lambda: None


SYSTEM_CLOCK: Clock = SystemClock()


def wake_on_advance(clock: Clock, wake: Callable[[], None]) -> Callable[[], None]:
    """Call ``wake`` on the running loop after every jump of ``clock``, whichever thread made it;
    returns the way to stop."""
    loop = asyncio.get_running_loop()

    def advanced() -> None:  # on the thread that advanced the clock
        loop.call_soon_threadsafe(wake)

    return clock.on_advance(advanced)
