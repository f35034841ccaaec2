"""Our own processes' signals (ARCHITECTURE §5): two stages, the first graceful, the second at once.

``drain_on_signals`` is the server's, the worker's and `dev`'s: the first
SIGTERM or SIGINT asks for a drain; a second one exits at once with 128 + its
number. ``two_stage_signals`` is the mechanism under it, also used by
`electric run`, whose first signal interrupts its run instead.

The handlers go through the running asyncio loop (``add_signal_handler``: the
C handler wakes the loop through its wakeup fd, whichever thread the kernel
delivered the signal to), so they run between callbacks, never in the middle
of writing an output line. On exit each signal's previous disposition is put
back exactly: asyncio's ``remove_signal_handler`` would leave SIG_DFL (or
Python's default SIGINT handler) instead of what was there before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Iterator

DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def hard_exit(signum: int) -> None:
    """Exit at once with 128 + the signal's number, as if the signal had killed the process.

    No cleanup runs: acknowledged writes are already durable and every output
    line was flushed when written, so nothing acknowledged is lost.
    """
    os._exit(128 + signum)


@contextlib.contextmanager
def two_stage_signals(
    first: Callable[[int], None],
    second: Callable[[int], None] = hard_exit,
    signals: tuple[signal.Signals, ...] = DRAIN_SIGNALS,
) -> Iterator[None]:
    """While inside: the first of ``signals`` calls ``first(signum)``, any later one ``second(signum)``.

    Both are called on the running loop. Must be entered on the main thread's loop.
    """
    loop = asyncio.get_running_loop()
    received: list[int] = []
    previous = {signum: signal.getsignal(signum) for signum in signals}

    def on_signal(signum: int) -> None:
        received.append(signum)
        (first if len(received) == 1 else second)(signum)

    installed: list[signal.Signals] = []
    try:
        for signum in signals:
            loop.add_signal_handler(signum, on_signal, signum)  # off the main thread: raises here
            installed.append(signum)
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
            handler = previous[signum]
            if handler is not None:  # None: installed outside Python, cannot be put back
                signal.signal(signum, handler)


@contextlib.contextmanager
def drain_on_signals(announce: Callable[[str], None]) -> Iterator[asyncio.Event]:
    """Install the handlers on the running loop; the event is set by the first signal.

    ``announce`` is told the first signal's name. The handlers are removed on exit.
    """
    drain = asyncio.Event()

    def on_first(signum: int) -> None:
        drain.set()  # first: the drain must not depend on its announcement reaching anyone
        announce(signal.Signals(signum).name)

    with two_stage_signals(on_first):
        yield drain
