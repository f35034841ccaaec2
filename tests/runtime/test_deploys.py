"""Deploys that never lose a run: runs bound to the code version they started on (issue 45).

Real worker processes (``electric worker``), each running one code version of the same app
(``App(code_version=...)`` from the environment); v2 renames a step. A worker is killed with
kill -9 mid-run; what happens to its run depends on the type's versioning:

- ``pinned``: it waits, visibly, for a v1 worker, and completes on it with no step run twice;
- ``auto_upgrade``: it is replayed at once on v2, where the renamed step fails it as recorded;
- pinned for a bound (a type's ``upgrade_after``, or the server's ``--upgrade-after``): it
  waits the bound, then is replayed on the version new wakes get.

Each signal reaches a waiting run with no runtime: the server decides alone. Tests synchronize
on the entities' streams, never on sleeps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
from conftest import Leases

from electric_sdk import AsyncClient, Event, TypeVersions
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.testing import TestServer

from .rt_support import run_status, state_is, until, worker_processes

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]

TIMEOUT_S = 30.0

APP = textwrap.dedent(
    """
    import os

    import anyio

    from electric_sdk.runtime import App, Context, Message, SignalInfo

    VERSION = os.environ["APP_VERSION"]
    HANG = os.environ.get("HANG") == "1"
    RENAMED = os.environ.get("RENAMED") == "1"
    app = App("deploys", code_version=VERSION)


    def mark(name: str) -> None:
        with open(os.environ["STEP_LOG"], "a") as log:
            log.write(f"{VERSION} {name}\\n")


    async def research(ctx: Context, message: Message) -> None:
        first = "search_v2" if RENAMED else "search"  # v2 renamed the recorded step

        async def search() -> str:
            mark(first)
            return "results"

        async def read() -> str:
            mark("read")
            if HANG and message.text != "quick":
                await anyio.sleep(60)
            return "notes"

        await ctx.step(first, search)
        await ctx.step("read", read)
        ctx.output.write(f"done on {VERSION}")


    async def cleanup(ctx: Context, signal: SignalInfo) -> None:
        mark("cleanup")


    KINDS = {
        "pinned": {"versioning": "pinned"},
        "auto": {"versioning": "auto_upgrade"},
        "bounded": {"versioning": "pinned", "upgrade_after": "300ms"},
        "plain": {},
    }
    for kind, versioning in KINDS.items():
        app.entity(kind, idle_timeout="60s", grace_period="10s", **versioning)(research).on_signal(
            cleanup, handles=["SIGTERM"]
        )
    """
)


@pytest.fixture
def leases() -> Leases:
    """A killed worker's leases lapse in 0.6 s."""
    return Leases(ttl_ms=600, heartbeat_ms=100)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    d = tmp_path / "app"
    d.mkdir()
    (d / "deploy_app.py").write_text(APP)
    return d


Start = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def worker(app_dir: Path) -> Iterator[Start]:
    """``start(address, version, hang=False, renamed=False)``: an `electric worker` process."""
    with worker_processes(app_dir, "deploy_app:app") as start:

        def start_version(
            address: str, version: str, *, hang: bool = False, renamed: bool = False
        ) -> subprocess.Popen[bytes]:
            flags = {"HANG": "1" if hang else "", "RENAMED": "1" if renamed else ""}
            return start(address, APP_VERSION=version, STEP_LOG=str(app_dir / "steps.log"), **flags)

        yield start_version


def steps_run(app_dir: Path) -> list[str]:
    """Every step the workers executed (a replayed step is not executed), as "VERSION NAME"."""
    path = app_dir / "steps.log"
    return path.read_text().splitlines() if path.exists() else []


async def watch_for(
    client: AsyncClient, ref: str, predicate: Callable[[Event], bool], start: int = 0
) -> Event:
    try:
        with anyio.fail_after(TIMEOUT_S):
            return await until(client, ref, predicate, start)
    except TimeoutError:  # say what the stream holds instead
        events = [(e.offset, e.type, e.value) for e in (await client.events(ref, 0, 100)).events]
        raise AssertionError(f"{ref}: the awaited event never came; the stream: {events}") from None


async def versions_until(
    client: AsyncClient, type_: str, condition: Callable[[TypeVersions], bool]
) -> TypeVersions:
    """The type's versions once ``condition`` holds (a worker's hello has no event to wait on)."""
    with anyio.fail_after(TIMEOUT_S):
        while True:
            found = await client.versions(type_)
            if found and condition(found[0]):
                return found[0]
            await anyio.sleep(0.02)  # a short pause between checks of a bounded wait


def connected(*versions: str) -> Callable[[TypeVersions], bool]:
    def holds(t: TypeVersions) -> bool:
        present = {v.code_version for v in t.versions if v.workers}
        return set(versions) <= present

    return holds


def step_named(name: str) -> Callable[[Event], bool]:
    return lambda e: (
        e.type == "electric.step"
        and e.value["data"].get("name") == name
        and e.value["data"].get("outcome") == "ok"
    )


async def started_runs(client: AsyncClient, ref: str) -> list[tuple[int, str]]:
    """(attempt, code version) of each STARTED record of the entity's runs."""
    events = (await client.events(ref, 0, 1000)).events
    return [
        (e.raw.run.attempt, e.raw.run.code_version)
        for e in events
        if e.type == "run" and e.raw.run.status == pb.RUN_STATUS_STARTED
    ]


async def crash_mid_run(
    client: AsyncClient, address: str, worker: Start, refs: list[str], *, renamed: bool
) -> dict[str, int]:
    """A rolling deploy: each of ``refs`` mid-run on a v1 worker (its first step recorded, the
    second hanging); then a v2 worker (``renamed``: its code renames the second step) connects
    and the v1 worker is killed with kill -9. Returns each one's offset after its lease ended."""
    type_ = refs[0].split("/")[0]
    v1 = worker(address, "v1", hang=True)
    await versions_until(client, type_, connected("v1"))
    for ref in refs:
        await client.spawn(ref)
        await client.send(ref, "the question")
    for ref in refs:
        await watch_for(client, ref, step_named("search"))
    worker(address, "v2", renamed=renamed)
    await versions_until(client, type_, connected("v2"))
    os.kill(v1.pid, signal.SIGKILL)
    v1.wait(10)
    lost = {}
    for ref in refs:
        lost[ref] = (await watch_for(client, ref, state_is("idle", "runtime_lost"))).offset
    return lost


async def test_a_pinned_run_waits_visibly_for_its_version_and_completes_on_it(
    electric: TestServer, client: AsyncClient, worker: Start, app_dir: Path
) -> None:
    lost = await crash_mid_run(client, electric.address, worker, ["pinned/p1"], renamed=True)

    entity = await client.get("pinned/p1")
    assert entity.bound_code_version == "v1"
    assert entity.waiting_for_code == "v1"
    assert entity.holder is None  # the v2 worker was not given it
    shown = await versions_until(client, "pinned", lambda t: t.waiting == {"v1": 1})
    assert shown.current == "v2"  # new wakes get the newest announced
    for args, wanted in (
        (("get", "pinned/p1"), "waiting for code v1"),
        (("ls", "--type", "pinned"), "waiting for code v1"),
        (("workers",), "1 run(s) of pinned waiting for code v1"),
        (("versions", "pinned"), "new wakes get v2"),
    ):
        shown_text = await cli(electric.address, *args)
        assert wanted in shown_text, (args, shown_text)

    worker(electric.address, "v1")  # one v1 worker back: the run completes on it
    done = await watch_for(client, "pinned/p1", run_status(pb.RUN_STATUS_COMPLETED), lost["pinned/p1"])
    assert done.raw.run.output == "done on v1"
    assert await started_runs(client, "pinned/p1") == [(1, "v1"), (2, "v1")]
    # The recorded step was replayed, not run again; the step cut short ran again, on v1 only.
    assert steps_run(app_dir) == ["v1 search", "v1 read", "v1 read"]
    assert (await client.get("pinned/p1")).waiting_for_code is None


async def test_an_auto_upgrade_run_is_replayed_on_the_new_code_and_a_rename_is_recorded(
    electric: TestServer, client: AsyncClient, worker: Start, app_dir: Path
) -> None:
    lost = await crash_mid_run(client, electric.address, worker, ["auto/a1"], renamed=True)
    failed = await watch_for(client, "auto/a1", run_status(pb.RUN_STATUS_FAILED), lost["auto/a1"])
    assert "NonDeterministicRun" in failed.raw.run.error
    assert "search_v2" in failed.raw.run.error
    assert await started_runs(client, "auto/a1") == [(1, "v1"), (2, "v2")]
    assert not [s for s in steps_run(app_dir) if s.startswith("v2")]  # it failed before any step ran


async def test_a_bounded_pin_upgrades_after_its_bound(
    electric: TestServer, client: AsyncClient, worker: Start, app_dir: Path
) -> None:
    lost = await crash_mid_run(client, electric.address, worker, ["bounded/b1"], renamed=False)
    done = await watch_for(client, "bounded/b1", run_status(pb.RUN_STATUS_COMPLETED), lost["bounded/b1"])
    assert done.raw.run.output == "done on v2"
    assert await started_runs(client, "bounded/b1") == [(1, "v1"), (2, "v2")]
    assert steps_run(app_dir).count("v1 search") == 1
    assert "v2 search" not in steps_run(app_dir)


async def test_the_servers_upgrade_after_bounds_a_type_that_chose_nothing(
    tmp_path: Path, database_url: str | None, worker: Start
) -> None:
    with TestServer(
        tmp_path / "short",
        lease_ttl_ms=600,
        heartbeat_interval_ms=100,
        database_url=database_url,
        upgrade_after_ms=300,
    ) as server:
        async with server.async_client() as client:
            worker(server.address, "v2")
            await versions_until(client, "plain", connected("v2"))
            lost = await crash_mid_run(client, server.address, worker, ["plain/d1"], renamed=False)
            done = await watch_for(client, "plain/d1", run_status(pb.RUN_STATUS_COMPLETED), lost["plain/d1"])
            assert done.raw.run.output == "done on v2"


async def test_each_signal_reaches_a_run_waiting_for_its_version(
    electric: TestServer, client: AsyncClient, worker: Start, app_dir: Path
) -> None:
    refs = [f"pinned/{name}" for name in ("int", "bulkint", "term", "stop", "hup", "kill", "none")]
    lost = await crash_mid_run(client, electric.address, worker, refs, renamed=True)
    for ref in refs:
        assert (await client.get(ref)).waiting_for_code == "v1", ref

    # SIGINT: the waiting run is aborted, its end recorded by the server; it never resumes.
    sigint = await client.signal("pinned/int", "SIGINT", reason="user pressed stop")
    assert sigint.outcome is not None
    assert sigint.outcome.value == "aborted"
    aborted = await watch_for(client, "pinned/int", run_status(pb.RUN_STATUS_ABORTED), lost["pinned/int"])
    assert "waited for a worker of code version v1" in aborted.raw.run.error
    assert (await client.get("pinned/int")).waiting_for_code is None
    # The same by SignalEntities (a SIGINT to many): each waiting run is aborted alike.
    bulk = await client.signal_many("SIGINT", refs=["pinned/bulkint"], reason="stop them all")
    assert bulk.signalled == 1
    aborted = await watch_for(
        client, "pinned/bulkint", run_status(pb.RUN_STATUS_ABORTED), lost["pinned/bulkint"]
    )
    assert "waited for a worker of code version v1" in aborted.raw.run.error
    assert (await client.get("pinned/bulkint")).waiting_for_code is None

    # SIGTERM: → stopping; the cleanup runs on the version new wakes get (v2), within the grace.
    term = await client.signal("pinned/term", "SIGTERM")
    assert (term.previous_state.value, term.new_state.value) == ("idle", "stopping")
    await watch_for(client, "pinned/term", state_is("stopped", "cleanup_complete"), lost["pinned/term"])
    assert "v2 cleanup" in steps_run(app_dir)
    assert "v1 cleanup" not in steps_run(app_dir)

    # SIGSTOP: paused, still bound; SIGKILL: killed; SIGHUP: nothing changes for the run.
    stop = await client.signal("pinned/stop", "SIGSTOP")
    assert stop.new_state.value == "paused"
    assert (await client.get("pinned/stop")).waiting_for_code == "v1"
    kill = await client.signal("pinned/kill", "SIGKILL")
    assert kill.new_state.value == "killed"
    hup = await client.signal("pinned/hup", "SIGHUP")
    assert hup.outcome is not None
    assert hup.outcome.value == "ignored"
    assert (await client.get("pinned/hup")).waiting_for_code == "v1"
    await client.signal("pinned/stop", "SIGCONT")

    worker(electric.address, "v1")  # v1 back: the bound runs left finish on it
    for ref in ("pinned/none", "pinned/hup", "pinned/stop"):
        done = await watch_for(client, ref, run_status(pb.RUN_STATUS_COMPLETED), lost[ref])
        assert done.raw.run.output == "done on v1", ref
        assert await started_runs(client, ref) == [(1, "v1"), (2, "v1")], ref
    # The aborted run never resumed: a message sent after it runs, and nothing else did.
    receipt = await client.send("pinned/int", "quick")
    await watch_for(client, "pinned/int", run_status(pb.RUN_STATUS_COMPLETED, receipt.key))
    # (a new wake: the version new wakes get, the newest announced)
    assert await started_runs(client, "pinned/int") == [(1, "v1"), (1, "v2")]
    assert (await client.get("pinned/kill")).closed


async def cli(address: str, *args: str) -> str:
    with anyio.fail_after(TIMEOUT_S):
        done = await anyio.run_process(
            [sys.executable, "-m", "electric_sdk.cli.main", "--address", address, *args], check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()
