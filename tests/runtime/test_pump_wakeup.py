"""A SIGCONT that commits while the delivery pump reads the entity still lets the queued message run.

The runtime service delivers a lease's messages from one pump at a time: a commit that wants
messages delivered (a message, or SIGCONT taking `paused` to `running`) finds the pump running
and asks it to go round again. A pump that found the entity `paused` used to stop without
looking at that request, so a SIGCONT committed while it was reading the record was lost, and
the message queued while paused waited for ever. Only a slow read shows it (PostgreSQL under
load: the likely cause of a CI run on two cores that once timed out in the RFC table's
paused/SIGCONT cell).

Here the read is made slow at the chosen moment: the real store answers the pump's read, and
the answer is held until the SIGCONT has committed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest
from electric_server.app import ElectricServer

from electric_sdk import AsyncClient
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.runtime import App, Context, Message

from .rt_support import TIMEOUT_S, running_worker

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]


class HeldPumpRead:
    """Holds the answer of the delivery pump's next read of ``ref`` once ``arm()`` is called."""

    def __init__(self, store: Any, ref: tuple[str, str]) -> None:
        self._read = store.get_entity
        self._ref = ref
        self._armed = False
        self.reached = asyncio.Event()
        self.release = asyncio.Event()
        store.get_entity = self.get_entity  # on this store object only

    def arm(self) -> None:
        self._armed = True

    async def get_entity(self, ref: tuple[str, str]) -> Any:
        record = await self._read(ref)
        task = asyncio.current_task()
        in_pump = task is not None and task.get_coro().__qualname__ == "Runtime._pump"  # type: ignore[union-attr]
        if self._armed and ref == self._ref and in_pump:
            self._armed = False
            self.reached.set()
            await self.release.wait()
        return record


async def test_a_sigcont_during_the_pumps_read_still_delivers_the_queued_message(
    server: ElectricServer,
) -> None:
    app = App(code_version="pump")

    @app.entity("agent")
    class Agent:
        async def on_message(self, ctx: Context, message: Message) -> None:
            ctx.output.write(f"ran {message.text}")

    held = HeldPumpRead(server.store, ("agent", "a"))
    async with AsyncClient(server.address) as client, running_worker(app, server.address):
        try:
            with anyio.fail_after(TIMEOUT_S):
                await client.spawn("agent/a")
                await client.wait_for_state("agent/a", "running", timeout=TIMEOUT_S)
                await client.pause("agent/a")
                held.arm()
                sent = await client.send("agent/a", "queued")
                await held.reached.wait()  # the pump has read the record: `paused`
                resumed = await client.resume("agent/a")
                assert resumed.new_state.value == "running"
                held.release.set()  # the pump goes on with what it read
                async for event in client.watch("agent/a", sent.offset):
                    run = event.raw.run
                    if (
                        event.type == "run"
                        and run.message_key == sent.key
                        and run.status == pb.RUN_STATUS_COMPLETED
                    ):
                        assert run.output == "ran queued"
                        break
        finally:
            held.release.set()
