"""Entity signals mapped onto the process (ARCHITECTURE §4), seen from the process itself."""

from __future__ import annotations

import anyio
import pytest
from runtime.rt_support import TIMEOUT_S, on_log, outcome_of, running_worker, state_is, until

from electric_sdk import AsyncClient
from electric_sdk.runtime import App
from electric_sdk.runtime.exec import ActionPlan, ShutdownPolicy, action_hook
from electric_sdk.testing import TestServer

from .support import alive, child, line, output, proc_state, ready, receipt, receipts

pytestmark = pytest.mark.anyio


def _app() -> App:
    app = App(code_version="t")
    app.exec(
        "p",
        child("--on-term", "exit"),
        grace_period="2s",
        keep=True,
        shutdown=ShutdownPolicy("SIGTERM", "1s"),
    )
    return app


async def test_sigint_sighup_sigusr_are_passed_on(electric: TestServer, client: AsyncClient) -> None:
    async with running_worker(_app(), electric.address):
        await client.spawn("p/a")
        await ready(client, "p/a")
        for sig, name in (("SIGINT", "SIGINT"), ("SIGHUP", "SIGHUP"), ("SIGUSR", "SIGUSR1")):
            result = await client.signal("p/a", sig)
            await until(client, "p/a", line(f"signal {name}"))
            update = await until(client, "p/a", outcome_of(result.key))
            assert update.value["outcome"] == "delivered"
            assert name in update.value["detail"]
        assert (await client.get("p/a")).state.value == "running"
    forwards = [r for r in await receipts(client, "p/a") if r["action"] == "forward"]
    assert [(r["action_name"], r["disposition"], r["group"]) for r in forwards] == [
        ("SIGINT", "issued", True),
        ("SIGHUP", "issued", True),
        ("SIGUSR1", "issued", True),
    ]


async def test_sigstop_freezes_and_sigcont_thaws_then_queued_lines_flow(
    electric: TestServer, client: AsyncClient
) -> None:
    async with running_worker(_app(), electric.address):
        pid = await _spawn_frozen(client, "p/a")
        await client.send("p/a", "while paused")  # queues: paused delivers nothing
        await client.signal("p/a", "SIGCONT")
        await until(client, "p/a", receipt("forward", "issued", "SIGCONT"))
        await until(client, "p/a", line("got while paused"))
        assert proc_state(pid) in ("S", "R")


async def test_sigterm_to_a_frozen_process_is_followed_by_sigcont(
    electric: TestServer, client: AsyncClient
) -> None:
    async with running_worker(_app(), electric.address):
        await _spawn_frozen(client, "p/a")
        await client.signal("p/a", "SIGTERM")  # paused → stopping
        exit_ = await until(client, "p/a", receipt("exit"))
        await until(client, "p/a", state_is("stopped", "cleanup_complete"))
    assert exit_.value["exit_status"] == 0  # it woke, caught SIGTERM and exited: no force
    assert "signal SIGTERM" in await output(client, "p/a")
    assert not [r for r in await receipts(client, "p/a") if r["action"] == "force"]


async def test_sigkill_forces_at_once(electric: TestServer, client: AsyncClient) -> None:
    app = App(code_version="t")
    app.exec("p", child("--on-term", "ignore"), grace_period="30s", keep=True)
    async with running_worker(app, electric.address):
        await client.spawn("p/a")
        pid = await ready(client, "p/a")
        await client.signal("p/a", "SIGTERM")  # the policy's wait (30 s) is under way ...
        await until(client, "p/a", receipt("graceful", "issued"))
        await client.signal("p/a", "SIGKILL")  # ... and SIGKILL cuts it short
        exit_ = await until(client, "p/a", receipt("exit"))
    assert exit_.value["exit_status"] == -9
    forces = [r for r in await receipts(client, "p/a") if r["action"] == "force"]
    assert len(forces) == 1
    assert forces[0]["reason"].startswith("SIGKILL")
    assert not alive(pid)
    assert (await client.get("p/a")).state.value == "killed"


async def test_sigkill_is_forced_once_when_the_cleanup_it_cut_short_ends_first(
    electric: TestServer, client: AsyncClient
) -> None:
    """SIGKILL cancels the SIGTERM cleanup under way, and the cleanup returns while the SIGKILL's
    force is still going. Its return must not end the hosting then: the force would be cut off and
    issued again by the hosting's end (two force receipts, the second "hosting ended"). The hook
    holds the force until the cleanup is over, so the order is the same every run."""
    app = App(code_version="t")
    app.exec("p", child("--on-term", "ignore"), grace_period="30s", keep=True)

    async def after_the_cleanup(plan: ActionPlan) -> None:
        if plan.action == "force" and plan.reason.startswith("SIGKILL"):
            with anyio.move_on_after(TIMEOUT_S):
                await cleanup_over.wait()

    cleanup_over = anyio.Event()
    with on_log("the cleanup is over", cleanup_over.set), action_hook(after_the_cleanup):
        async with running_worker(app, electric.address):
            await client.spawn("p/a")
            pid = await ready(client, "p/a")
            await client.signal("p/a", "SIGTERM")
            await until(client, "p/a", receipt("graceful", "issued"))
            await client.signal("p/a", "SIGKILL")
            exit_ = await until(client, "p/a", receipt("exit"))
    assert cleanup_over.is_set()
    forces = [r for r in await receipts(client, "p/a") if r["action"] == "force"]
    assert [r["reason"].split()[0] for r in forces] == ["SIGKILL"]
    assert exit_.value["exit_status"] == -9
    assert exit_.value["reason"].split("; ")[-1].startswith("SIGKILL")
    assert not alive(pid)


async def _spawn_frozen(client: AsyncClient, ref: str) -> int:
    """Spawn ``ref``, wait for its process, SIGSTOP it and wait until the kernel shows it stopped."""
    await client.spawn(ref)
    pid = await ready(client, ref)
    await client.signal(ref, "SIGSTOP")
    await until(client, ref, receipt("forward", "issued", "SIGSTOP"))
    assert await _state_becomes(pid, "T")
    return pid


async def _state_becomes(pid: int, state: str) -> bool:
    """The kernel stops a process asynchronously: look again (bounded) until /proc shows it."""
    for _ in range(1000):
        if proc_state(pid) == state:
            return True
        await anyio.sleep(0.005)
    return False


async def test_sigterm_then_sigkill_at_once_force_and_exit_once(
    electric: TestServer, client: AsyncClient
) -> None:
    """SIGTERM and SIGKILL sent back to back. The SIGKILL reaches the worker either before the
    SIGTERM's shutdown has begun (which must then not begin: it settled the exit a second time) or
    while its graceful action's receipt is being written (that receipt, refused as the state moved
    and retried, must not land after the force's). Either way the stream says: one force, then
    one exit, naming the SIGKILL. Eight entities, as the worker picks the order: on the code
    before the fix, most of them broke it."""
    app = App(code_version="t")
    app.exec("p", child("--on-term", "ignore"), grace_period="30s", keep=True)
    refs = [f"p/close{i}" for i in range(8)]
    async with running_worker(app, electric.address):
        for ref in refs:
            await client.spawn(ref)
            await ready(client, ref)
            await client.signal(ref, "SIGTERM")
            await client.signal(ref, "SIGKILL")
            await until(client, ref, receipt("exit"))
        for ref in refs:
            await until(client, ref, state_is("killed"))
    for ref in refs:
        got = await receipts(client, ref)
        acts = [(r["action"], r["disposition"]) for r in got]
        after_force = acts[acts.index(("force", "issued")) :]
        assert after_force == [("force", "issued"), ("exit", "observed")], (ref, acts)
        assert "SIGKILL" in got[-1]["reason"].split("; ")[-1], (ref, got[-1]["reason"])
