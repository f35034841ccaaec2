"""A rolling deploy with real processes (issue 45, "Show"): 100 entities mid-run on v1 workers;
v2 workers start whose code renames the first step; half the v1 workers are killed with kill -9
and the rest drained. What happens to the 100 runs is each type's versioning's:

- ``pinned``: every run waits, visibly; one v1 worker restarted completes every one on v1:
  0 failed, 0 lost, 0 steps repeated;
- ``auto_upgrade`` with ``ctx.patched`` around the rename: every run completes on v2, 0 failed;
- neither (the server's bound, short here): the runs are replayed on v2 and the rename fails
  them, recorded; ``retry --from-step 0`` completes each one on v2.

The recipe is docs/runtime.md's "A rolling deploy". Tests synchronize on streams and on
``electric versions``' counts, never on sleeps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
from conftest import Leases

from electric_sdk import AsyncClient, TypeVersions
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.testing import TestServer

from .rt_support import run_status, until, worker_processes

pytestmark = [pytest.mark.anyio]

N = 100
TIMEOUT_S = 90.0

APP = textwrap.dedent(
    """
    import os

    import anyio

    from electric_sdk.runtime import App, Context, Message

    VERSION = os.environ["APP_VERSION"]
    V2 = VERSION == "v2"
    GATE = os.environ["GATE"]  # the second step of a v1 run waits until this file exists
    app = App("rolling", code_version=VERSION)


    def mark(name: str) -> None:
        with open(os.environ["STEP_LOG"], "a") as log:
            log.write(f"{VERSION} {name}\\n")


    async def research(ctx: Context, message: Message) -> None:
        async def search() -> str:
            mark("search")
            return "results"

        async def read() -> str:
            mark("read")
            while not os.path.exists(GATE):
                await anyio.sleep(0.05)
            return "notes"

        first = "search"
        if V2:  # v2 renamed the first step; the `auto` type ships the rename behind a patch
            first = "search_v2" if ctx.ref.type != "auto" or ctx.patched("search-v2") else "search"
        await ctx.step(first, search)
        await ctx.step("read", read)
        ctx.output.write(f"done on {VERSION}")


    app.entity("pinned", versioning="pinned")(research)
    app.entity("auto", versioning="auto_upgrade")(research)
    app.entity("plain")(research)
    """
)


@pytest.fixture
def leases() -> Leases:
    return Leases(ttl_ms=600, heartbeat_ms=100)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    d = tmp_path / "app"
    d.mkdir()
    (d / "rolling_app.py").write_text(APP)
    return d


Start = Callable[[str, str], subprocess.Popen[bytes]]


@pytest.fixture
def worker(app_dir: Path) -> Iterator[Start]:
    """``start(address, version)``: an `electric worker` process (drained within 100 ms)."""
    with worker_processes(app_dir, "rolling_app:app", "--grace", "100ms") as start:
        yield lambda address, version: start(
            address, APP_VERSION=version, GATE=str(app_dir / "gate"), STEP_LOG=str(app_dir / "steps.log")
        )


async def versions_until(
    client: AsyncClient, type_: str, condition: Callable[[TypeVersions], bool]
) -> TypeVersions:
    """The type's versions once ``condition`` holds (workers and leases have no event to wait on)."""
    with anyio.fail_after(TIMEOUT_S):
        while True:
            found = await client.versions(type_)
            if found and condition(found[0]):
                return found[0]
            await anyio.sleep(0.05)  # a short pause between checks of a bounded wait


def version(t: TypeVersions, name: str) -> tuple[int, int, int]:
    """(workers, runs in flight, runs waiting) of version ``name``."""
    for v in t.versions:
        if v.code_version == name:
            return len(v.workers), v.runs_in_flight, v.runs_waiting
    return 0, 0, 0


async def runs_of(client: AsyncClient, ref: str) -> list[pb.RunValue]:
    events = (await client.events(ref, 0, 1000)).events
    return [e.raw.run for e in events if e.type == "run"]


async def ended(client: AsyncClient, refs: list[str], status: int) -> None:
    """Every one of ``refs`` has a run with ``status``."""
    with anyio.fail_after(TIMEOUT_S):
        waiting = list(refs)
        while waiting:
            waiting = [
                r for r in waiting if not any(run.status == status for run in await runs_of(client, r))
            ]
            if waiting:
                await anyio.sleep(0.05)  # a short pause between checks of a bounded wait


async def deploy(client: AsyncClient, address: str, worker: Start, app_dir: Path, type_: str) -> list[str]:
    """The rolling deploy: N entities mid-run on four v1 workers; two v2 workers start; two v1
    workers are killed with kill -9 and two drained (SIGTERM, --grace 100ms). Returns the refs."""
    v1 = [worker(address, "v1") for _ in range(4)]
    await versions_until(client, type_, lambda t: version(t, "v1")[0] == 4)
    refs = [f"{type_}/e{i:03}" for i in range(N)]
    for ref in refs:
        await client.spawn(ref)
        await client.send(ref, "the question")
    await versions_until(client, type_, lambda t: version(t, "v1")[1] == N)  # all N in flight
    with anyio.fail_after(TIMEOUT_S):  # every run is in its second step
        while Counter(steps_run(app_dir))["v1 read"] < N:  # noqa: ASYNC110 (a file: no event)
            await anyio.sleep(0.05)  # a short pause between checks of a bounded wait
    for _ in range(2):
        worker(address, "v2")
    await versions_until(client, type_, lambda t: version(t, "v2")[0] == 2)
    for proc in v1[:2]:
        os.kill(proc.pid, signal.SIGKILL)
    for proc in v1[2:]:
        proc.send_signal(signal.SIGTERM)
    for proc in v1:
        proc.wait(30)
    assert [proc.returncode for proc in v1[2:]] == [0, 0]  # drained cleanly
    (app_dir / "gate").touch()  # from now on a second step finishes at once
    return refs


def steps_run(app_dir: Path) -> list[str]:
    path = app_dir / "steps.log"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.both_stores
async def test_pinned_runs_wait_and_complete_on_their_version(
    electric: TestServer, client: AsyncClient, worker: Start, app_dir: Path
) -> None:
    refs = await deploy(client, electric.address, worker, app_dir, "pinned")
    shown = await versions_until(client, "pinned", lambda t: version(t, "v1")[2] == N)
    assert version(shown, "v2") == (2, 0, 0)  # the v2 workers took none of them
    assert all(e.waiting_for_code == "v1" for e in await client.list("pinned"))

    worker(electric.address, "v1")  # one v1 worker back
    await ended(client, refs, pb.RUN_STATUS_COMPLETED)
    for ref in refs:
        runs = await runs_of(client, ref)
        assert [r.status for r in runs if r.status not in (pb.RUN_STATUS_STARTED, pb.RUN_STATUS_STEP)] == [
            pb.RUN_STATUS_COMPLETED
        ], ref  # 0 failed, 0 lost
        assert {r.code_version for r in runs if r.status == pb.RUN_STATUS_STARTED} == {"v1"}, ref
        assert runs[-1].output == "done on v1"
    done = Counter(steps_run(app_dir))
    assert done["v1 search"] == N  # 0 steps repeated: each recorded step was replayed
    assert not [s for s in done if s.startswith("v2")]
    assert version(await versions_until(client, "pinned", lambda t: True), "v1")[1:] == (0, 0)


async def test_auto_upgrade_with_a_patch_completes_every_run_on_the_new_code(
    electric: TestServer, client: AsyncClient, worker: Start, app_dir: Path
) -> None:
    refs = await deploy(client, electric.address, worker, app_dir, "auto")
    await ended(client, refs, pb.RUN_STATUS_COMPLETED)
    for ref in refs:
        runs = await runs_of(client, ref)
        assert not [r for r in runs if r.status == pb.RUN_STATUS_FAILED], ref
        assert runs[-1].output == "done on v2"
        assert [r.code_version for r in runs if r.status == pb.RUN_STATUS_STARTED][-1] == "v2"
    done = Counter(steps_run(app_dir))
    assert done["v1 search"] == N
    assert done["v2 search"] == 0  # replayed on v2 from its record, on the old path the patch kept
    receipt = await client.send(refs[0], "a new question")  # a new run takes the new path
    await until(client, refs[0], run_status(pb.RUN_STATUS_COMPLETED, receipt.key))
    assert Counter(steps_run(app_dir))["v2 search"] == 1


async def test_neither_fails_the_runs_as_recorded_and_retry_completes_them(
    tmp_path: Path, worker: Start, app_dir: Path
) -> None:
    with TestServer(
        tmp_path / "short", lease_ttl_ms=600, heartbeat_interval_ms=100, upgrade_after_ms=200
    ) as server:
        async with server.async_client() as client:
            refs = await deploy(client, server.address, worker, app_dir, "plain")
            await ended(client, refs, pb.RUN_STATUS_FAILED)
            failed = {}
            for ref in refs:
                runs = await runs_of(client, ref)
                (fail,) = [r for r in runs if r.status == pb.RUN_STATUS_FAILED]
                assert "NonDeterministicRun" in fail.error, ref
                assert "search_v2" in fail.error, ref
                failed[ref] = fail.message_key
            # One retry from the CLI as an operator types it, the rest through the SDK.
            first = refs[0]
            retried = await anyio.run_process(
                [
                    sys.executable,
                    "-m",
                    "electric_sdk.cli.main",
                    "--address",
                    server.address,
                    "retry",
                    first,
                    failed[first],
                    "--from-step",
                    "0",
                ],
                check=False,
            )
            assert retried.returncode == 0, retried.stderr.decode()
            for ref in refs[1:]:
                await client.retry(ref, failed[ref], from_step=0, reason="v2 renamed the first step")
            await ended(client, refs, pb.RUN_STATUS_COMPLETED)
            for ref in refs:
                assert (await runs_of(client, ref))[-1].output == "done on v2", ref
