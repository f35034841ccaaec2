"""A worker's requests on one entity apply in order, each waiting for the one ahead of it
(``WorkerRequests.after_tail``). A step whose task is cancelled before it gets its turn (the server is
draining) must be closed, not left for the garbage collector to report as never awaited."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from electric_server.runtime.hosting import Runtime
from electric_server.runtime.local_leases import WorkerSession
from electric_server.store.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[Runtime]:
    store = SQLiteStore(tmp_path / "electric.db")
    await store.open()
    service = Runtime(store, lease_ttl_ms=1_000, heartbeat_interval_ms=100)
    yield service
    await service.stop()
    await store.close()


def _session() -> WorkerSession:
    return WorkerSession(
        id="r-1", worker_id="w", types=frozenset({"t"}), code_version="v1", announced=1, capacity=1
    )


async def test_a_step_cancelled_before_its_task_first_ran_is_closed(runtime: Runtime) -> None:
    session = _session()
    step = runtime.requests.release(session, ("t", "a"), 1)
    runtime.requests.after_tail(session, ("t", "a"), step)
    task = session.tails[("t", "a")]
    runtime.drain()  # before the task has run at all
    await asyncio.wait([task])
    assert task.cancelled()
    assert inspect.getcoroutinestate(step) == inspect.CORO_CLOSED


async def test_a_step_cancelled_while_waiting_its_turn_is_closed(runtime: Runtime) -> None:
    session = _session()
    ahead = asyncio.Event()

    async def slow() -> None:
        await ahead.wait()

    runtime.requests.after_tail(session, ("t", "a"), slow())
    step = runtime.requests.release(session, ("t", "a"), 1)
    runtime.requests.after_tail(session, ("t", "a"), step)
    task = session.tails[("t", "a")]
    await asyncio.sleep(0)  # both tasks start; the second now waits for the first
    assert not task.done()
    runtime.drain()
    await asyncio.wait([task])
    assert task.cancelled()
    assert inspect.getcoroutinestate(step) == inspect.CORO_CLOSED


async def test_steps_on_one_entity_run_in_order(runtime: Runtime) -> None:
    session = _session()
    ran: list[int] = []

    async def step(n: int, gate: asyncio.Event | None) -> None:
        if gate is not None:
            await gate.wait()
        ran.append(n)

    gate = asyncio.Event()
    runtime.requests.after_tail(session, ("t", "a"), step(1, gate))
    runtime.requests.after_tail(session, ("t", "a"), step(2, None))
    runtime.requests.after_tail(session, ("t", "a"), step(3, None))
    await asyncio.sleep(0)
    assert ran == []
    gate.set()
    task = session.tails[("t", "a")]
    await asyncio.wait([task])
    assert not task.cancelled()
    assert ran == [1, 2, 3]
    assert ("t", "a") not in session.tails
