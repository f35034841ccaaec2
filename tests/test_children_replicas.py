"""A tree of entities across three replicas: the root's SIGTERM stops every descendant within its
grace, and a SIGINT reaches the children working for the run it aborted, though the replica that
took the signal is killed (kill -9) at once.

Real `electric server` replicas on one PostgreSQL database (test_replicas.py's fixture: polls of
20 ms, sessions living 1 s past their last renewal) and a worker given every replica's address.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import anyio
import pytest
from test_children_cascade import ENDED, WAIT_S, ended_by_cascade, hosting_app
from test_children_interrupt import delegate, delegating_app, first, run_status, told
from test_replicas import (  # noqa: F401 - fixtures
    StartReplica,
    anyio_backend,
    one_loop,
    replica,
)

from electric_sdk import AsyncClient, State
from electric_sdk._wire.times import timestamp_to_datetime
from electric_sdk.runtime.worker import Worker

pytestmark = pytest.mark.anyio


@pytest.fixture
async def three(replica: StartReplica) -> AsyncIterator[tuple[Any, Any, Any]]:  # noqa: F811
    a, b, c = replica(), replica(), replica()
    worker = Worker(
        hosting_app(),
        [a.address, b.address, c.address],
        worker_id="w-tree",
        keepalive_ms=100,
        keepalive_timeout_ms=200,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        yield a, b, c
        await worker.shutdown(0)


async def test_a_sigterm_cascade_survives_the_kill_9_of_the_replica_that_took_it(
    three: tuple[Any, Any, Any],
) -> None:
    a, b, c = three
    long = timedelta(seconds=600)
    async with AsyncClient(a.address) as on_a, AsyncClient(b.address) as on_b, AsyncClient(c.address) as on_c:
        await on_a.spawn("boss/root", grace_period=timedelta(seconds=3))
        await on_b.spawn("team/a", grace_period=long, parent="boss/root")
        await on_b.spawn("team/b", grace_period=long, parent="boss/root")
        await on_c.spawn("team/a1", grace_period=long, parent="team/a")
        for ref in ("boss/root", "team/a", "team/b", "team/a1"):
            await on_b.wait_for_state(ref, State.RUNNING, timeout=WAIT_S)
        sent = await on_a.signal("boss/root", "SIGTERM")
        a.send(signal.SIGKILL)  # at once: its own cascade may or may not have begun
        a.wait()
        root_deadline = sent.created_at + timedelta(seconds=3)
        for ref in ("team/a", "team/b", "team/a1"):
            assert await ended_by_cascade(on_b, ref) is State.STOPPED
            # A child whose lease was on A's worker session went idle when A died (runtime_lost),
            # and an idle entity's SIGTERM stops it at once: no `stopping` record then.
            events = (await on_c.events(ref, 0, limit=100)).events
            for stopping in [e for e in events if e.state is State.STOPPING]:
                assert timestamp_to_datetime(stopping.raw.state.deadline) <= root_deadline
        assert (await on_c.wait_for_state("boss/root", ENDED, timeout=WAIT_S)).state is State.STOPPED


async def test_a_sigint_cascade_survives_the_kill_9_of_the_replica_that_took_it(
    replica: StartReplica,  # noqa: F811
) -> None:
    """The lead's SIGINT goes to replica A, killed at once: its child's run of the lead's message
    is aborted all the same, by one SIGINT, whichever replica's sweep sent it."""
    a, b, c = replica(), replica(), replica()
    worker = Worker(
        delegating_app(),
        [a.address, b.address, c.address],
        worker_id="w-sigint-tree",
        keepalive_ms=100,
        keepalive_timeout_ms=200,
    )
    async with (
        anyio.create_task_group() as tg,
        AsyncClient(a.address) as on_a,
        AsyncClient(b.address) as on_b,
    ):
        await tg.start(worker.run)
        message = await delegate(on_b, "lead/k1")
        await on_a.signal("lead/k1", "SIGINT")
        a.send(signal.SIGKILL)  # at once: its sweep may or may not have begun
        a.wait()
        await first(on_b, "helper/k1", run_status("aborted"))
        children = await told(on_b, "lead/k1")
        assert children["/helper/k1"]["message"] == message
        events = (await on_b.events("helper/k1", 0, limit=100)).events
        signals = {e.key: e.to_json()["value"] for e in events if e.type == "signal"}
        assert [(s["sender"], s["message_key"]) for s in signals.values()] == [("electric:cascade", message)]
        await worker.shutdown(0)
