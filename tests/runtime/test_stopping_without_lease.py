"""An entity that enters `stopping` while no worker holds it (idle → paused →
SIGTERM) is leased for its cleanup: the handler runs, the entity stops early
(cleanup_complete, not grace_expired), and the SIGTERM gets its outcome."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from electric_sdk import Signal
from electric_sdk.runtime import App, Worker
from electric_sdk.testing import TestServer

pytestmark = pytest.mark.anyio


async def test_sigterm_to_an_unleased_paused_entity_runs_its_cleanup() -> None:
    app = App(code_version="t")
    cleaned = anyio.Event()

    @app.entity("agent", grace_period="20s", idle_timeout="200ms")
    class Agent:
        async def on_message(self, ctx: Any, message: Any) -> None:
            pass

        async def on_signal(self, ctx: Any, signal: Any) -> None:
            if signal.signal is Signal.SIGTERM:
                cleaned.set()

    with TestServer(lease_ttl_ms=600, heartbeat_interval_ms=100) as server:
        async with server.async_client() as client:
            worker = Worker(app, server.address)
            async with anyio.create_task_group() as tg:
                await tg.start(worker.run)
                await client.spawn("agent/a")
                await client.wait_for_state("agent/a", "idle", timeout=10)
                await client.pause("agent/a")
                term = await client.terminate("agent/a")
                with anyio.fail_after(10):
                    await cleaned.wait()
                stopped = await client.wait_for_state("agent/a", "stopped", timeout=10)
                assert stopped.stopping_deadline is None
                events = (await client.events("agent/a", limit=1000)).events
                causes = [e.value.get("cause") for e in events if e.type == "state"]
                assert causes[-1] == "cleanup_complete"  # early, not after the 20 s grace
                outcomes = []
                with anyio.fail_after(10):
                    async for event in client.watch("agent/a"):
                        if event.key == term.key and event.operation == "update":
                            outcomes.append(event.value["outcome"])
                            break
                assert outcomes == ["shutdown_requested"]
                await worker.shutdown(0.2)
