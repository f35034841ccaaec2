"""``ctx.stop_requested`` inside a run: a loop that checks it between its steps returns cleanly
within the grace, and its run is recorded completed, not aborted."""

from __future__ import annotations

import anyio
import pytest

from electric_sdk import AsyncClient
from electric_sdk.lifecycle import Signal, State
from electric_sdk.runtime import App, Context, Message, SignalInfo
from electric_sdk.testing import TestServer

from .rt_support import COMPLETED, TIMEOUT_S, run_status, running_worker, state_is, until

pytestmark = pytest.mark.anyio


async def test_a_loop_that_checks_stop_requested_completes_its_run(
    electric: TestServer, client: AsyncClient
) -> None:
    entered, release = anyio.Event(), anyio.Event()
    seen: list[tuple[bool, bool]] = []
    cleanup: list[SignalInfo] = []
    app = App(code_version="test")

    @app.entity("looper", grace_period="10s")
    class Looper:
        async def on_message(self, ctx: Context, message: Message) -> None:
            ticks = 0
            while not ctx.stop_requested:
                async with ctx.step("tick"):
                    ticks += 1
                    if ticks == 1:
                        entered.set()
                        await release.wait()
            seen.append((ctx.stop_requested, ctx.grace_deadline is not None))
            ctx.output.write(f"stopped cleanly after {ticks}")

        async def on_signal(self, ctx: Context, signal: SignalInfo) -> None:
            cleanup.append(signal)

    async with running_worker(app, electric.address) as worker:
        await client.spawn("looper/l")
        receipt = await client.send("looper/l", "go")
        with anyio.fail_after(TIMEOUT_S):
            await entered.wait()
        host = worker.host("looper/l")
        assert host is not None
        await client.terminate("looper/l")
        with anyio.fail_after(TIMEOUT_S):
            await host.wait_state(State.STOPPING)
        release.set()
        done = await until(client, "looper/l", run_status(COMPLETED, receipt.key))
        assert done.raw.run.output == "stopped cleanly after 1"
        await until(client, "looper/l", state_is("stopped", "cleanup_complete"))
    assert seen == [(True, True)]
    assert [s.signal for s in cleanup] == [Signal.SIGTERM]
    assert cleanup[0].partial_output is None  # no run was stopped: it had completed
