"""`stopped` by grace expiry never comes while an exec entity's process lives: the server's
`grace_expired` waits for the process's `exit` receipt, or at most the settle past the deadline.
Until then the entity is `stopping` past its deadline and `electric get` shows the process exiting.
(The compatibility default forces at the grace period counted from the SIGTERM's issue, so just
after the server's deadline: the case where the two met.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from runtime.rt_support import running_worker, state_is, until

from electric_sdk import AsyncClient
from electric_sdk.cli.exec_view import process_json
from electric_sdk.runtime import App
from electric_sdk.runtime.exec import ActionPlan, action_hook
from electric_sdk.testing import TestServer

from .support import child, events, ready

pytestmark = pytest.mark.anyio
REF = "stubborn/a"


def _app() -> App:
    app = App(code_version="t")
    app.exec("stubborn", child("--on-term", "ignore"), grace_period="300ms", keep=True)
    return app


def _offset(got: list[Any], match: Any) -> int:
    return next(e.offset for e in got if match(e))


def _exit(e: Any) -> bool:
    return e.type == "exec" and e.value["action"] == "exit"


async def test_stopped_by_grace_expiry_comes_after_the_exit(
    electric: TestServer, client: AsyncClient
) -> None:
    seen: dict[str, Any] = {}

    async def at_the_force(plan: ActionPlan) -> None:
        if plan.action != "force":
            return
        with anyio.move_on_after(0.1):  # past the server's deadline, with the process alive
            await until(client, REF, state_is("stopped"))
            seen["stopped while the process lived"] = True
        entity = await client.get(REF)
        seen["state"] = entity.state.value
        seen["past its deadline"] = entity.stopping_deadline is not None and (
            entity.stopping_deadline < datetime.now(UTC)
        )
        seen["process"] = process_json(await events(client, REF))

    with action_hook(at_the_force):
        async with running_worker(_app(), electric.address):
            await client.spawn(REF)
            await ready(client, REF)
            await client.signal(REF, "SIGTERM")
            await until(client, REF, state_is("stopped", "grace_expired"))
    assert "stopped while the process lived" not in seen
    assert seen["state"] == "stopping"
    assert seen["past its deadline"] is True
    process = seen["process"]
    assert process["running"] is True
    assert process["exiting"] is True
    got = await events(client, REF)
    assert _offset(got, _exit) < _offset(got, state_is("stopped"))
    with anyio.fail_after(5):
        async for _ in client.watch(REF, got[-1].offset):  # the stream's end: after the exit receipt
            pass
    assert (await client.get(REF)).closed


async def test_grace_expiry_waits_for_the_exit_at_most_the_settle(
    electric: TestServer, client: AsyncClient
) -> None:
    """A process that does not die (here: the force held back until `stopped` comes) does not hold
    the entity in `stopping`: `stopped` comes at the deadline plus the settle, and the force and the
    exit receipt still land after it (the stream stays open while the worker holds the lease)."""
    from electric_server.core.reaper import EXIT_SETTLE_MS

    async def hold_the_force(plan: ActionPlan) -> None:
        if plan.action == "force":
            await until(client, REF, state_is("stopped"))

    with action_hook(hold_the_force):
        async with running_worker(_app(), electric.address):
            await client.spawn(REF)
            await ready(client, REF)
            await client.signal(REF, "SIGTERM")
            stopped = await until(client, REF, state_is("stopped", "grace_expired"))
            await until(client, REF, _exit)
    got = await events(client, REF)
    stopping = next(e for e in got if state_is("stopping")(e))
    late = stopped.timestamp - datetime.fromisoformat(stopping.value["deadline"])
    assert timedelta(milliseconds=EXIT_SETTLE_MS) <= late < timedelta(milliseconds=EXIT_SETTLE_MS + 1000)
    assert _offset(got, state_is("stopped")) < _offset(got, _exit)
