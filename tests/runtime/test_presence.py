"""Worker presence: `ListWorkers` (SDK, CLI, HTTP) lists the connected workers on each store,
and an entity waiting for a type no connected worker hosts is reported so."""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import anyio
import httpx
import pytest
from conftest import Leases
from electric_server.app import ElectricServer

from electric_sdk import AsyncClient, WorkerInfo
from electric_sdk.runtime import AppReloader
from electric_sdk.testing import TestServer

from .rt_support import (
    COMPLETED,
    HOT_APP,
    STARTED,
    TIMEOUT_S,
    Probe,
    probe_app,
    run_status,
    running_worker,
    state_is,
    until,
)


@pytest.fixture
def leases() -> Leases:
    """5 s leases instead of 0.6 s: nothing here is about a lease lapsing (a session ends when its
    worker leaves), and in a loaded CI run a 0.6 s lease lapsed between `get` and `ls` once, so
    `ls` named no holder where `get` had just named one."""
    return Leases(ttl_ms=5_000, heartbeat_ms=100)


pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]


async def workers_until(
    client: AsyncClient, condition: Callable[[list[WorkerInfo]], bool]
) -> list[WorkerInfo]:
    """The worker list once ``condition`` holds: a session's end has no event to wait on."""
    with anyio.fail_after(TIMEOUT_S):
        while not condition(found := await client.workers()):  # noqa: ASYNC110
            await anyio.sleep(0.02)  # a short pause between checks of a bounded wait
    return found


class Shown(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


async def cli(address: str, *args: str) -> Shown:
    """The CLI as its own process, not blocking the loop (the worker's heartbeats run on it)."""
    with anyio.fail_after(TIMEOUT_S * 3):
        done = await anyio.run_process(
            [sys.executable, "-m", "electric_sdk.cli.main", "--address", address, *args], check=False
        )
    return Shown(done.returncode, done.stdout.decode(), done.stderr.decode())


async def test_a_worker_is_listed_while_connected_and_gone_after(
    electric: TestServer, client: AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="electric.runtime")
    before = datetime.now(UTC) - timedelta(seconds=1)  # the database's clock may be a little behind
    assert await client.workers() == []
    async with running_worker(probe_app(Probe()), electric.address, worker_id="w-presence", capacity=7):
        await client.spawn("probe/p1")
        await until(client, "probe/p1", state_is("running"))
        [worker] = await client.workers()
        said = [r.getMessage() for r in caplog.records if r.name == "electric.runtime"]
        assert f"worker w-presence connected to {electric.address}, hosting probe" in said
        assert (worker.worker_id, worker.types, worker.capacity) == ("w-presence", ("probe",), 7)
        assert worker.leases_held == 1
        assert before <= worker.last_heartbeat <= datetime.now(UTC) + timedelta(seconds=1)
        assert worker.replica

        shown = await cli(electric.address, "workers", "--json")
        assert shown.returncode == 0, shown.stderr
        [row] = json.loads(shown.stdout)["workers"]
        # The CLI's process starts in about a second, over which the replica renews the session.
        listed = worker.to_json()
        assert row["last_heartbeat"] >= listed["last_heartbeat"]
        assert row | {"last_heartbeat": listed["last_heartbeat"]} == listed
        assert row["leases_held"] == 1
        assert row["last_heartbeat"].endswith("Z")
        table = (await cli(electric.address, "workers")).stdout.splitlines()
        assert table[0].split()[:4] == ["WORKER", "TYPES", "CODE", "LEASES"]
        assert table[1].split()[:2] == ["w-presence", "probe"]
    assert await workers_until(client, lambda found: not found) == []
    assert (await cli(electric.address, "workers")).stdout.strip() == "no worker connected"


async def test_an_unhosted_type_is_reported_by_get_ls_and_the_log(
    electric: TestServer, client: AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="electric_server.core.presence")
    async with running_worker(probe_app(Probe()), electric.address):
        await client.spawn("probe/hosted")
        await until(client, "probe/hosted", state_is("running"))
        for ref in ("nobody/n1", "nobody/n2"):
            await client.spawn(ref)

        got = await cli(electric.address, "get", "nobody/n1", "--json")
        assert got.returncode == 0, got.stderr
        entity = json.loads(got.stdout)
        assert entity["state"] == "spawning"
        assert entity["hosted"] is False
        assert "no connected worker hosts type 'nobody'" in entity["warning"]
        hosted = json.loads((await cli(electric.address, "get", "probe/hosted", "--json")).stdout)
        assert hosted["hosted"] is True
        assert "warning" not in hosted
        assert (
            "warning: no connected worker hosts type 'nobody'"
            in (await cli(electric.address, "get", "nobody/n1")).stdout
        )

        listed = json.loads((await cli(electric.address, "ls", "--json")).stdout)["entities"]
        assert {e["url"]: e["hosted"] for e in listed} == {
            "/nobody/n1": False,
            "/nobody/n2": False,
            "/probe/hosted": True,
        }
        lines = (await cli(electric.address, "ls")).stdout.splitlines()
        assert lines[0].split()[-1] == "HOSTED"
        marks = {line.split()[0]: line.split()[-1] for line in lines[1:]}
        assert marks["/nobody/n1"] == marks["/nobody/n2"] == "no"
        assert marks["/probe/hosted"] == "yes"
    # The server said it once for the type, not once per entity.
    said = [r.getMessage() for r in caplog.records if r.name == "electric_server.core.presence"]
    assert len(said) == 1, said
    assert "'nobody'" in said[0]


async def test_workers_over_http(door: ElectricServer, http: httpx.AsyncClient) -> None:
    async with running_worker(probe_app(Probe()), door.address, worker_id="w-http"):
        for path in ("/workers", "/_electric/workers"):
            answer = await http.get(path)
            assert answer.status_code == 200, answer.text
            [row] = answer.json()["workers"]
            assert (row["worker_id"], row["types"], row["leases_held"]) == ("w-http", ["probe"], 0)


async def test_an_idle_entity_with_a_message_and_no_worker_is_reported(
    electric: TestServer, client: AsyncClient
) -> None:
    async with running_worker(probe_app(Probe()), electric.address):
        await client.spawn("probe/i1", idle_timeout="50ms")
        await until(client, "probe/i1", state_is("idle"))
    await workers_until(client, lambda found: not found)
    idle = json.loads((await cli(electric.address, "get", "probe/i1", "--json")).stdout)
    assert idle["state"] == "idle"
    assert idle["hosted"] is False
    assert "warning" not in idle  # idle with nothing to run: it waits for no worker
    await client.send("probe/i1", "wake up")
    waiting = json.loads((await cli(electric.address, "get", "probe/i1", "--json")).stdout)
    assert waiting["state"] == "idle"
    assert "no connected worker hosts type 'probe'" in waiting["warning"]


async def test_get_names_the_worker_holding_the_lease_while_it_is_live(
    electric: TestServer, client: AsyncClient
) -> None:
    """`get` shows the entity's worker, as `kubectl describe` shows a pod's node: the lease's
    live holder (SDK, CLI text and JSON, `ls --json`); none once its session has ended."""
    async with running_worker(probe_app(Probe()), electric.address, worker_id="w-holder"):
        await client.spawn("probe/h1")
        await until(client, "probe/h1", state_is("running"))
        entity = await client.get("probe/h1")
        [worker] = await client.workers()
        assert entity.holder is not None
        assert (entity.holder.worker_id, entity.holder.replica) == ("w-holder", worker.replica)
        assert entity.holder.session.startswith(worker.replica)
        assert entity.holder.epoch >= 1
        [listed] = await client.list("probe")
        assert listed.holder == entity.holder

        shown = json.loads((await cli(electric.address, "get", "probe/h1", "--json")).stdout)
        assert shown["holder"] == {
            "worker_id": "w-holder",
            "session": entity.holder.session,
            "replica": worker.replica,
            "epoch": entity.holder.epoch,
        }
        [row] = json.loads((await cli(electric.address, "ls", "--json")).stdout)["entities"]
        assert row["holder"] == shown["holder"]
        text = (await cli(electric.address, "get", "probe/h1")).stdout
        held = f"w-holder (session {entity.holder.session}, lease epoch {entity.holder.epoch})"
        assert f"  worker        {held}" in text.splitlines()
    await workers_until(client, lambda found: not found)
    after = await client.get("probe/h1")
    assert (after.state.value, after.holder) == ("running", None)  # its lease's session ended
    assert json.loads((await cli(electric.address, "get", "probe/h1", "--json")).stdout)["holder"] is None
    assert "  worker        none" in (await cli(electric.address, "get", "probe/h1")).stdout.splitlines()


async def test_http_get_names_the_worker_holding_the_lease(
    door: ElectricServer, http: httpx.AsyncClient
) -> None:
    """The HTTP door renders the entity with the same JSON as the SDK and the CLI."""
    worker = running_worker(probe_app(Probe()), door.address, worker_id="w-http-holder")
    async with AsyncClient(door.address) as client, worker:
        await client.spawn("probe/h2")
        await until(client, "probe/h2", state_is("running"))
        entity = await client.get("probe/h2")
        answer = await http.get("/probe/h2")
        assert answer.status_code == 200, answer.text
        assert answer.json() == entity.to_json()
        assert answer.json()["holder"]["worker_id"] == "w-http-holder"


async def test_a_reload_is_logged_announced_and_named_by_the_runs_it_starts(
    electric: TestServer,
    client: AsyncClient,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`electric dev` re-imports edited code at a wake: the worker logs the old and the new
    version, `workers` lists the version in use now (on either store), and each run's STARTED
    record names the version that started it."""
    caplog.set_level(logging.INFO, logger="electric.runtime")
    module = f"presence_reloaded_{uuid.uuid4().hex[:8]}"  # a name of its own: each store's run imports its own module
    source = tmp_path / f"{module}.py"
    source.write_text(HOT_APP.format(version="v1"))
    monkeypatch.syspath_prepend(str(tmp_path))
    reloader = AppReloader(f"{module}:app")
    v1 = reloader.app.code_version
    async with running_worker(reloader.app, electric.address, worker_id="w-reload", reload_app=reloader):
        await client.spawn("hot/h")
        one = await client.send("hot/h", "a")
        await until(client, "hot/h", run_status(COMPLETED, one.key))
        [worker] = await client.workers()
        assert worker.code_version == v1
        await client.reload("hot/h")
        await until(client, "hot/h", state_is("idle", "reload"))
        source.write_text(HOT_APP.format(version="v2 (edited)"))
        two = await client.send("hot/h", "b")
        assert (await until(client, "hot/h", run_status(COMPLETED, two.key))).raw.run.output == "v2 (edited)"
        v2 = reloader.app.code_version
        assert v2 != v1
        [worker] = await workers_until(client, lambda found: [w.code_version for w in found] == [v2])
        assert worker.worker_id == "w-reload"
        # Every reload is a new version: a type that chose no versioning is auto_upgrade under dev.
        (hot,) = await client.versions("hot")
        assert {(v.code_version, v.versioning) for v in hot.versions} == {
            (v1, "auto_upgrade"),
            (v2, "auto_upgrade"),
        }
        said = [r.getMessage() for r in caplog.records if r.name == "electric.runtime"]
        assert f"reloaded the app: code version {v1} -> {v2}" in said
        events = (await client.events("hot/h", 0, 200)).events
        started = {
            e.value["message_key"]: e.value.get("code_version") for e in events if run_status(STARTED)(e)
        }
        assert started == {one.key: v1, two.key: v2}
        shown = await cli(electric.address, "events", "hot/h")
        assert f"{two.key} started on code {v2}" in shown.stdout, shown.stdout
