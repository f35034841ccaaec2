"""Our own processes' signals (ARCHITECTURE §5): the first SIGTERM or SIGINT
asks for a drain; a second one exits at once with 128 + its number."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Iterator

DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def drain_on_signals(announce: Callable[[str], None]) -> Iterator[asyncio.Event]:
    """Install the handlers on the running loop; the event is set by the first signal.

    ``announce`` is told the first signal's name. The handlers are removed on exit.
    """
    loop = asyncio.get_running_loop()
    drain = asyncio.Event()
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        if len(received) > 1:
            # Exit at once: acknowledged writes are already durable, so nothing
            # acknowledged is lost; what was in flight is the caller's to retry.
            os._exit(128 + signum)
        announce(signal.Signals(signum).name)
        drain.set()

    for signum in DRAIN_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield drain
    finally:
        for signum in DRAIN_SIGNALS:
            loop.remove_signal_handler(signum)
