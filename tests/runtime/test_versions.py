"""Versions an operator can move (issue 45, point 4): which code version new wakes get.

Two workers host type `job`, one per code version. New wakes go to the newest announced unless
an operator selects one (a rollback is selecting the older); a ramp sends a share of the type's
entities, by a hash of each one's id, to another version. The same over gRPC (SDK), HTTP and the
CLI; choosing needs the `admin` scope; bad choices are refused and write nothing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import httpx
import pytest
from conftest import Leases
from electric_server.runtime.versions import ramp_bucket

from electric_sdk import AsyncClient, PermissionDenied, TypeVersions, errors
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.runtime import App, Context, Message
from electric_sdk.testing import TestServer

from .rt_support import TIMEOUT_S, run_status, running_worker, until

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]


@pytest.fixture
def electric(tmp_path: Path, database_url: str | None, leases: Leases) -> Iterator[TestServer]:
    """The conftest's server, with its HTTP door too."""
    with TestServer(
        tmp_path / "electric",
        lease_ttl_ms=leases.ttl_ms,
        heartbeat_interval_ms=leases.heartbeat_ms,
        database_url=database_url,
        http="127.0.0.1:0",
    ) as server:
        yield server


def job_app(version: str) -> App:
    app = App(code_version=version)

    @app.entity("job", idle_timeout="100ms")
    async def job(ctx: Context, message: Message) -> None:
        ctx.output.write(version)

    return app


@pytest.fixture
async def two_versions(electric: TestServer) -> AsyncIterator[None]:
    """Workers of v1 then v2 connected (v2 announced last: the newest)."""
    async with AsyncExitStack() as stack, electric.async_client() as client:
        for version in ("v1", "v2"):
            await stack.enter_async_context(running_worker(job_app(version), electric.address))
            with anyio.fail_after(TIMEOUT_S):
                while not any(  # noqa: ASYNC110 (a hello has no event to wait on)
                    v.code_version == version and v.workers
                    for t in await client.versions("job")
                    for v in t.versions
                ):
                    await anyio.sleep(0.02)  # a short pause between checks of a bounded wait
        yield


async def ran_on(client: AsyncClient, ref: str) -> str:
    """Spawn ``ref``, send it a message, and answer the code version its run started on."""
    await client.spawn(ref)
    receipt = await client.send(ref, "go")
    done = await until(client, ref, run_status(pb.RUN_STATUS_COMPLETED, receipt.key))
    assert done.raw.run.output in ("v1", "v2")
    started = await until(client, ref, run_status(pb.RUN_STATUS_STARTED, receipt.key))
    assert started.raw.run.code_version == done.raw.run.output
    return started.raw.run.code_version


async def test_new_wakes_get_the_newest_then_the_selected_then_a_sticky_ramp(
    electric: TestServer, client: AsyncClient, two_versions: None
) -> None:
    (job,) = await client.versions("job")
    assert [v.code_version for v in job.versions] == ["v2", "v1"]
    assert (job.current, job.selected) == ("v2", None)
    assert await ran_on(client, "job/a") == "v2"

    rolled = await client.set_version("job", "v1", reason="v2 answers badly")
    assert (rolled.current, rolled.selected) == ("v1", "v1")
    assert await ran_on(client, "job/b") == "v1"

    ramped = await client.set_version("job", "v1", ramp_version="v2", ramp_percent=50)
    assert (ramped.ramp_version, ramped.ramp_percent) == ("v2", 50)
    refs = [f"job/r{i}" for i in range(12)]
    for ref in refs:
        wanted = "v2" if ramp_bucket(tuple(ref.split("/"))) < 50 else "v1"  # type: ignore[arg-type]
        assert await ran_on(client, ref) == wanted, ref
        # Sticky: the entity's next wake (it went idle) goes to the same version.
        await until(client, ref, lambda e: e.type == "state" and e.value["state"] == "idle")
        again = await client.send(ref, "again")
        started = await until(client, ref, run_status(pb.RUN_STATUS_STARTED, again.key))
        assert started.raw.run.code_version == wanted, ref

    newest = await client.set_version("job", None)
    assert (newest.current, newest.selected, newest.ramp_version) == ("v2", None, None)
    assert await ran_on(client, "job/c") == "v2"


async def test_bad_choices_are_refused_and_write_nothing(
    electric: TestServer, client: AsyncClient, two_versions: None
) -> None:
    before = await client.versions()
    cases: list[tuple[dict[str, object], type[errors.ElectricError], str]] = [
        ({"type": "nosuch", "version": "v1"}, errors.ElectricError, "TYPE_NOT_ANNOUNCED"),
        ({"type": "job", "version": "v9"}, errors.FailedPrecondition, "VERSION_NOT_ANNOUNCED"),
        (
            {"type": "job", "ramp_version": "v9", "ramp_percent": 5},
            errors.FailedPrecondition,
            "VERSION_NOT_ANNOUNCED",
        ),
        ({"type": "job", "ramp_version": "v1", "ramp_percent": 0}, errors.InvalidArgument, "INVALID_RAMP"),
        ({"type": "job", "ramp_version": "v1", "ramp_percent": 101}, errors.InvalidArgument, "INVALID_RAMP"),
        ({"type": "job", "ramp_percent": 20}, errors.InvalidArgument, "INVALID_RAMP"),
        ({"type": "bad name!", "version": "v1"}, errors.InvalidArgument, "INVALID_NAME"),
    ]
    for kw, kind, code in cases:
        type_ = str(kw.pop("type"))
        version = kw.pop("version", None)
        with pytest.raises(kind) as info:
            await client.set_version(type_, version, **kw)  # type: ignore[arg-type]
        assert info.value.code == code, (type_, version, kw)
    assert await client.versions() == before

    async with httpx.AsyncClient(base_url=electric.http_address) as http:
        listed = await http.get("/_electric/versions", params={"type": "job"})
        assert listed.status_code == 200
        assert [v["code_version"] for v in listed.json()["types"][0]["versions"]] == ["v2", "v1"]
        refused = await http.put("/_electric/versions/job", json={"code_version": "v9"})
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "VERSION_NOT_ANNOUNCED"
        unknown = await http.put("/_electric/versions/job", json={"code_version": "v1", "colour": "red"})
        assert unknown.status_code == 400
        chosen = await http.put("/_electric/versions/job", json={"code_version": "v1", "reason": "rollback"})
        assert chosen.status_code == 200
        assert (chosen.json()["selected"], chosen.json()["current"]) == ("v1", "v1")
    (job,) = await client.versions("job")
    assert job.selected == "v1"


async def test_the_cli_lists_selects_and_ramps(
    electric: TestServer, client: AsyncClient, two_versions: None
) -> None:
    listed = await cli(electric.address, "versions", "job")
    assert listed.returncode == 0
    assert "job: new wakes get v2 (the newest announced)" in listed.stdout
    selected = await cli(electric.address, "versions", "job", "--select", "v1", "--reason", "roll back")
    assert selected.returncode == 0
    assert "selected by an operator: v1" in selected.stdout
    ramped = await cli(electric.address, "versions", "job", "--ramp", "v2", "--percent", "10")
    assert "10% of its entities get v2" in ramped.stdout
    (job,) = await client.versions("job")
    assert (job.selected, job.ramp_version, job.ramp_percent) == ("v1", "v2", 10)  # --ramp kept --select
    bad = await cli(electric.address, "versions", "job", "--select", "v9")
    assert bad.returncode == 4
    assert "v9" in bad.stderr
    usage = await cli(electric.address, "versions", "job", "--ramp", "v2")
    assert usage.returncode == 2
    assert "--percent" in usage.stderr
    back = await cli(electric.address, "versions", "job", "--newest", "--no-ramp", "--json")
    assert back.returncode == 0
    assert (json.loads(back.stdout)["selected"], json.loads(back.stdout)["ramp_version"]) == ("", "")


async def test_choosing_needs_the_admin_scope(tmp_path: Path, database_url: str | None) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[[tokens]]\ntoken = "ops-token-0123456789"\nprincipal = "ops"\nscopes = ["admin"]\n'
        '[[tokens]]\ntoken = "reader-token-0123456789"\nprincipal = "reader"\nscopes = ["read", "signal", "send"]\n'
    )
    tokens.chmod(0o600)
    with TestServer(tmp_path / "secured", database_url=database_url, tokens_file=tokens) as server:
        async with (
            server.async_client(token="ops-token-0123456789") as ops,
            server.async_client(token="reader-token-0123456789") as reader,
            running_worker(job_app("v1"), server.address, token="ops-token-0123456789"),
        ):
            with anyio.fail_after(TIMEOUT_S):
                while not await reader.versions("job"):  # noqa: ASYNC110
                    await anyio.sleep(0.02)  # a short pause between checks of a bounded wait
            with pytest.raises(PermissionDenied) as info:
                await reader.set_version("job", "v1")
            assert info.value.code == "MISSING_SCOPE"
            chosen: TypeVersions = await ops.set_version("job", "v1")
            assert chosen.selected == "v1"


class Shown:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


async def cli(address: str, *args: str) -> Shown:
    with anyio.fail_after(TIMEOUT_S * 3):
        done = await anyio.run_process(
            [sys.executable, "-m", "electric_sdk.cli.main", "--address", address, *args], check=False
        )
    return Shown(done.returncode, done.stdout.decode(), done.stderr.decode())
