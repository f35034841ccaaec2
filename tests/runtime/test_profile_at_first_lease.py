"""An entity's profile is fixed at its first lease, not at spawn (issue 19, point 7).

Spawned before any worker announced its type, an entity used to keep the
server's default grace (30 s) for life, while one spawned a moment later got
its type's. Now both get the type's default when first leased; until then
``get`` shows what the spawn set and marks the rest "type default, pending".
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from electric_sdk import AsyncClient
from electric_sdk._wire.times import timestamp_to_datetime
from electric_sdk.cli.console import entity_detail
from electric_sdk.runtime import App
from electric_sdk.testing import TestServer

from .rt_support import TIMEOUT_S, running_worker, state_is, until

pytestmark = pytest.mark.anyio


def agent_app() -> App:
    app = App(code_version="t")

    @app.entity("agent", grace_period="8s", idle_timeout="45s")
    class Agent:
        async def on_message(self, ctx: Any, message: Any) -> None:
            pass

    return app


async def test_an_entity_spawned_before_its_type_was_announced_gets_the_types_profile(
    electric: TestServer, client: AsyncClient
) -> None:
    early = await client.spawn("agent/early")  # no worker has announced "agent" yet
    explicit = await client.spawn("agent/explicit", idle_timeout="2s")
    assert (early.grace_period, early.idle_timeout) == (None, None)
    assert (explicit.grace_period, explicit.idle_timeout) == (None, timedelta(seconds=2))
    shown = entity_detail(await client.get("agent/early"))
    assert "grace period  type default, pending" in shown
    assert "idle timeout  type default, pending" in shown
    async with running_worker(agent_app(), electric.address):
        for ref in ("agent/early", "agent/explicit"):
            await client.wait_for_state(ref, "running", timeout=TIMEOUT_S)
        assert (await client.get("agent/early")).grace_period == timedelta(seconds=8)
        assert (await client.get("agent/early")).idle_timeout == timedelta(seconds=45)
        assert (await client.get("agent/explicit")).grace_period == timedelta(seconds=8)
        assert (await client.get("agent/explicit")).idle_timeout == timedelta(seconds=2)  # the spawn's own
        term = await client.terminate("agent/early")
        stopping = await until(client, "agent/early", state_is("stopping"))
        assert timestamp_to_datetime(stopping.raw.state.deadline) - term.created_at == timedelta(seconds=8)
