"""An event loop on a daemon thread, reachable through an anyio blocking portal."""

from __future__ import annotations

import queue
import threading

import anyio
from anyio.from_thread import BlockingPortal


def start_portal(name: str) -> tuple[BlockingPortal, threading.Thread]:
    """Start the loop thread; stop it with ``portal.call(portal.stop)`` then join.

    Not anyio's start_blocking_portal: its executor thread is joined at
    interpreter exit, so a portal someone forgot to stop would hang exit.
    """
    handoff: queue.Queue[BlockingPortal] = queue.Queue()

    async def main() -> None:
        async with BlockingPortal() as portal:
            handoff.put(portal)
            await portal.sleep_until_stopped()

    thread = threading.Thread(target=anyio.run, args=(main,), name=name, daemon=True)
    thread.start()
    return handoff.get(), thread
