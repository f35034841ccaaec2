"""Runs bound to their code across three `electric server` replicas on one PostgreSQL database
(real processes): a v1 worker on replica A dies mid-run with kill -9 while a v2 worker serves on
replica B; the run waits for code v1 — B's v2 worker is never given it, whichever replica polls —
and completes on a v1 worker that connects to replica C, no recorded step run twice.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
from runtime.rt_support import worker_processes
from runtime.test_deploys import APP, step_named
from test_replicas import StartReplica, anyio_backend, one_loop, replica  # noqa: F401 - fixtures

from electric_sdk import AsyncClient, Event, TypeVersions
from electric_sdk._proto.electric.v1 import types_pb2 as pb

pytestmark = pytest.mark.anyio

TIMEOUT_S = 30.0


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    d = tmp_path / "app"
    d.mkdir()
    (d / "deploy_app.py").write_text(APP)
    return d


@pytest.fixture
def worker(app_dir: Path) -> Iterator[Callable[..., object]]:
    with worker_processes(app_dir, "deploy_app:app") as start:
        yield lambda address, version, hang=False: start(
            address, APP_VERSION=version, HANG="1" if hang else "", STEP_LOG=str(app_dir / "steps.log")
        )


async def until(client: AsyncClient, ref: str, predicate: Callable[[Event], bool]) -> Event:
    with anyio.fail_after(TIMEOUT_S):
        async for event in client.watch(ref, 0):
            if predicate(event):
                return event
    raise AssertionError(f"{ref}: the stream ended first")


async def versions_until(client: AsyncClient, condition: Callable[[TypeVersions], bool]) -> TypeVersions:
    with anyio.fail_after(TIMEOUT_S):
        while True:
            found = await client.versions("pinned")
            if found and condition(found[0]):
                return found[0]
            await anyio.sleep(0.02)  # a short pause between checks of a bounded wait


def workers_of(t: TypeVersions, version: str) -> int:
    return next((len(v.workers) for v in t.versions if v.code_version == version), 0)


async def test_a_bound_run_waits_on_every_replica_and_completes_on_its_version_anywhere(
    replica: StartReplica,  # noqa: F811 - the fixture
    worker: Callable[..., object],
    app_dir: Path,
) -> None:
    a, b, c = replica(), replica(), replica()
    async with (
        AsyncClient(a.address) as via_a,
        AsyncClient(b.address) as via_b,
        AsyncClient(c.address) as via_c,
    ):
        v1 = worker(a.address, "v1", hang=True)
        await versions_until(via_b, lambda t: workers_of(t, "v1") == 1)
        await via_b.spawn("pinned/x")
        await via_b.send("pinned/x", "the question")
        await until(via_c, "pinned/x", step_named("search"))
        worker(b.address, "v2")
        await versions_until(via_c, lambda t: workers_of(t, "v2") == 1)
        os.kill(v1.pid, signal.SIGKILL)  # type: ignore[attr-defined]
        lost = await until(
            via_c, "pinned/x", lambda e: e.type == "state" and e.value.get("cause") == "runtime_lost"
        )
        shown = await versions_until(via_a, lambda t: t.waiting == {"v1": 1})
        assert workers_of(shown, "v2") == 1
        entity = await via_c.get("pinned/x")
        assert (entity.waiting_for_code, entity.holder) == ("v1", None)

        worker(c.address, "v1")  # a v1 worker back, on the third replica
        with anyio.fail_after(TIMEOUT_S):
            async for event in via_a.watch("pinned/x", lost.offset):
                if event.type == "run" and event.raw.run.status == pb.RUN_STATUS_COMPLETED:
                    assert event.raw.run.output == "done on v1"
                    break
        events = (await via_b.events("pinned/x", 0, 1000)).events
        started = [
            (e.raw.run.attempt, e.raw.run.code_version)
            for e in events
            if e.type == "run" and e.raw.run.status == pb.RUN_STATUS_STARTED
        ]
        assert started == [(1, "v1"), (2, "v1")]
        assert (app_dir / "steps.log").read_text().splitlines().count("v1 search") == 1
