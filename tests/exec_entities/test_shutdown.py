"""Seed 003's shutdown cases with real processes: the compatibility default, graceful success,
bounded escalation. The evidence is the receipts and the processes' own reports."""

from __future__ import annotations

from datetime import datetime

import pytest
from runtime.rt_support import running_worker, state_is, until

from electric_sdk import AsyncClient
from electric_sdk.runtime import App
from electric_sdk.runtime.exec import ShutdownPolicy
from electric_sdk.testing import TestServer

from .support import alive, child, output, ready, receipt, receipts, spawn_and_stop

pytestmark = pytest.mark.anyio


def _t(value: str) -> datetime:
    return datetime.fromisoformat(value)


async def test_compatibility_default_is_sigterm_grace_then_sigkill(
    electric: TestServer, client: AsyncClient
) -> None:
    """No policy authored: SIGTERM, the entity's grace period, then SIGKILL (the recorded baseline)."""
    app = App(code_version="t")
    app.exec("stubborn", child("--on-term", "ignore"), grace_period="400ms", keep=True)
    async with running_worker(app, electric.address):
        await client.spawn("stubborn/a")
        pid = await ready(client, "stubborn/a")
        await client.signal("stubborn/a", "SIGTERM")
        exit_ = await until(client, "stubborn/a", receipt("exit"))
    got = await receipts(client, "stubborn/a")
    graceful = next(r for r in got if r["action"] == "graceful")
    force = [r for r in got if r["action"] == "force"]
    assert graceful["action_name"] == "SIGTERM"
    assert graceful["disposition"] == "issued"
    assert graceful["timeout_ms"] == 400
    assert "compatibility default" in graceful["reason"]
    assert len(force) == 1
    assert force[0]["action_name"] == "SIGKILL"
    assert _t(force[0]["issued_at"]) >= _t(graceful["deadline"])
    assert exit_.value["exit_status"] == -9
    assert exit_.value["escalated"] is True
    assert "signal SIGTERM" in await output(client, "stubborn/a")
    assert not alive(pid)


async def test_graceful_success_exits_before_the_timeout_and_is_never_forced(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="t")
    app.exec(
        "polite", child("--on-term", "exit"), grace_period="5s", shutdown=ShutdownPolicy("SIGTERM", "3s")
    )
    got = await spawn_and_stop(client, electric.address, app, "polite/a")
    actions = [(r["action"], r["disposition"]) for r in got]
    assert actions == [("start", "observed"), ("graceful", "issued"), ("exit", "observed")]
    graceful, exit_ = got[1], got[2]
    assert graceful["timeout_ms"] == 3000
    assert exit_["exit_status"] == 0
    assert exit_["escalated"] is False
    assert _t(exit_["issued_at"]) < _t(graceful["deadline"])


async def test_bounded_escalation_no_force_before_the_deadline_and_exactly_one_after(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="t")
    app.exec(
        "trap", child("--on-term", "ignore"), grace_period="2s", shutdown=ShutdownPolicy("SIGTERM", "300ms")
    )
    async with running_worker(app, electric.address):
        await client.spawn("trap/a")
        await ready(client, "trap/a")
        await client.signal("trap/a", "SIGTERM", reason="deploy")
        await until(client, "trap/a", line_after := receipt("exit"))
        del line_after
        await until(client, "trap/a", state_is("stopped", "cleanup_complete"))
    got = await receipts(client, "trap/a")
    graceful = next(r for r in got if r["action"] == "graceful")
    forces = [r for r in got if r["action"] == "force"]
    exit_ = next(r for r in got if r["action"] == "exit")
    assert len(forces) == 1
    assert forces[0]["disposition"] == "issued"
    assert _t(forces[0]["issued_at"]) >= _t(graceful["deadline"])
    # Still alive at the deadline: it caught SIGTERM and ran on until the force.
    assert "signal SIGTERM" in await output(client, "trap/a")
    assert exit_["exit_status"] == -9
    assert _t(exit_["issued_at"]) >= _t(graceful["deadline"])
    for r in got:
        if r["action"] != "start":
            assert r["generation"]["generation"] == 1
            assert r["task_id"] == "trap/a"
