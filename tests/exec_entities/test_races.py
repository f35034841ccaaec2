"""Generation safety with real processes: the generation changes between the graceful action and
the timeout, or between planning an action and issuing it; a sibling is never touched. (A process
the generation forks into its own group is part of it, not a replacement: test_group.py.)"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest
from runtime.rt_support import running_worker, state_is, until

from electric_sdk import AsyncClient
from electric_sdk.runtime import App
from electric_sdk.runtime.exec import ActionPlan, ShutdownPolicy, action_hook
from electric_sdk.testing import TestServer

from .support import alive, child, exit_before, line, logged, output, ready, receipt, receipts, spawn_and_stop

pytestmark = pytest.mark.anyio


async def test_exit_between_graceful_and_timeout_means_no_force(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="t")
    app.exec(
        "slow", child("--on-term", "ignore"), grace_period="10s", shutdown=ShutdownPolicy("SIGTERM", "8s")
    )
    async with running_worker(app, electric.address):
        await client.spawn("slow/a")
        await ready(client, "slow/a")
        await client.signal("slow/a", "SIGTERM")
        await until(client, "slow/a", line("signal SIGTERM"))
        # Stopping: messages are not delivered, so the process is told to exit another way.
        got = await receipts(client, "slow/a")
        os.kill(got[0]["generation"]["pid"], signal.SIGUSR2)  # default action: terminate
        await until(client, "slow/a", state_is("stopped", "cleanup_complete"))
    got = await receipts(client, "slow/a")
    assert [r["action"] for r in got] == ["start", "graceful", "exit"]
    assert got[2]["exit_status"] == -signal.SIGUSR2
    assert got[2]["escalated"] is False


async def test_pre_action_race_exit_holds_the_graceful_action(
    electric: TestServer, client: AsyncClient
) -> None:
    """The generation exits between planning SIGTERM and issuing it: held, nothing sent."""
    app = App(code_version="t")
    app.exec("race", child("--on-term", "exit"), grace_period="2s", shutdown=ShutdownPolicy("SIGTERM", "1s"))
    planned: list[ActionPlan] = []

    exit_first = exit_before("graceful")

    def kill_first(plan: ActionPlan) -> None:
        planned.append(plan)
        exit_first(plan)

    with action_hook(kill_first):
        got = await spawn_and_stop(client, electric.address, app, "race/a")
    assert [(r["action"], r["disposition"]) for r in got] == [
        ("start", "observed"),
        ("graceful", "held"),
        ("exit", "observed"),
    ]
    assert "has exited (killed by SIGKILL)" in got[1]["reason"]
    assert "nothing sent" in got[1]["reason"]
    assert got[2]["exit_status"] == -signal.SIGKILL
    assert [p.action for p in planned] == ["graceful"]  # no force was even planned
    assert "signal SIGTERM" not in await output(client, "race/a")


async def test_pre_action_race_reaped_elsewhere_is_unprovable_and_held(
    electric: TestServer, client: AsyncClient
) -> None:
    """Reaped behind the runtime's back: its PID could name anything now; held, nothing sent."""
    app = App(code_version="t")
    app.exec("reaped", child(), grace_period="2s", shutdown=ShutdownPolicy("SIGTERM", "1s"))

    def reap_it(plan: ActionPlan) -> None:
        if plan.action == "graceful":
            os.kill(plan.evidence.pid, signal.SIGKILL)
            os.waitpid(plan.evidence.pid, 0)

    with action_hook(reap_it):
        got = await spawn_and_stop(client, electric.address, app, "reaped/a")
    assert [(r["action"], r["disposition"]) for r in got] == [
        ("start", "observed"),
        ("graceful", "held"),
        ("exit", "observed"),
    ]
    assert "reaped outside the runtime" in got[1]["reason"]
    assert "exit_status" not in got[2]


async def test_force_is_held_when_the_generation_changes_before_it(
    electric: TestServer, client: AsyncClient
) -> None:
    """The race at the second boundary: the generation exits between planning the force and issuing it."""
    app = App(code_version="t")
    app.exec(
        "late", child("--on-term", "ignore"), grace_period="2s", shutdown=ShutdownPolicy("SIGTERM", "200ms")
    )

    with action_hook(exit_before("force", signal.SIGUSR2)):
        got = await spawn_and_stop(client, electric.address, app, "late/a")
    assert [(r["action"], r["disposition"]) for r in got] == [
        ("start", "observed"),
        ("graceful", "issued"),
        ("force", "held"),
        ("exit", "observed"),
    ]
    assert got[3]["exit_status"] == -signal.SIGUSR2
    assert got[3]["escalated"] is False


async def test_isolation_stopping_one_task_never_touches_a_sibling(
    electric: TestServer, client: AsyncClient, tmp_path: Path
) -> None:
    log = tmp_path / "signals.log"
    app = App(code_version="t")
    app.exec(
        "job",
        child("--on-term", "ignore", "--log", str(log)),
        grace_period="2s",
        keep=True,
        shutdown=ShutdownPolicy("SIGTERM", "200ms"),
    )
    async with running_worker(app, electric.address):
        await client.spawn("job/a")
        await client.spawn("job/b")
        pid_a = await ready(client, "job/a")
        pid_b = await ready(client, "job/b")
        await client.signal("job/a", "SIGTERM")
        await until(client, "job/a", state_is("stopped", "cleanup_complete"))
        await client.send("job/b", "still here?")
        await until(client, "job/b", line("got still here?"))
        assert alive(pid_b)
        assert logged(log, pid_b) == [f"ready pid={pid_b}", "got still here?"]
        assert "signal SIGTERM" in logged(log, pid_a)
        assert [r["action"] for r in await receipts(client, "job/b")] == ["start"]
        with anyio.fail_after(5):
            await client.signal("job/b", "SIGKILL")
            await until(client, "job/b", receipt("exit"))
