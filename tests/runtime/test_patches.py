"""Patches (``ctx.patched``) with real worker processes, killed with kill -9 mid-run.

The app's code is chosen by ``MODE``: ``old`` runs steps A, B; ``new`` inserts
``if ctx.patched("fix"): C`` between them; ``deprecated`` calls
``ctx.deprecate_patch("fix")`` and always runs C; ``renamed`` renames B;
``raises`` raises after A, ``waits`` waits there (for the replay check's tests).
``HANG`` names the step after which a worker hangs, to be killed there.
Each step's side effect appends a line to a file, so a test counts how often
each one really ran. Tests synchronize on the entities' streams, never on sleeps.
"""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from electric_sdk import AsyncClient
from electric_sdk.testing import TestServer

from .rt_support import COMPLETED, run_status, until, worker_processes
from .test_crash_recovery import free_port
from .test_durable_steps import kill9, lines, server, step_is, step_records

pytestmark = pytest.mark.anyio

APP = textwrap.dedent(
    """
    import os
    from pathlib import Path

    import anyio

    from electric_sdk.runtime import App, Context, Message

    app = App("patches")
    MODE = os.environ.get("MODE", "old")
    HANG = os.environ.get("HANG", "")
    COUNTS = Path(os.environ.get("COUNTS", os.devnull))


    def count(what: str) -> str:
        with COUNTS.open("a") as f:
            f.write(what + "\\n")
        return what


    async def hang_after(name: str, ctx: Context) -> None:
        if HANG == name:  # every attempt: another worker of this mode may take a run over
            await anyio.sleep(60)  # killed here


    @app.entity("job", idle_timeout="60s")
    async def job(ctx: Context, message: Message) -> None:
        ctx.state["seen"].append(message.text)  # written with A's record
        done = [await ctx.step("A", count, f"{message.text}:A")]
        await hang_after("A", ctx)
        if MODE == "raises":
            raise LookupError(f"seen {list(ctx.state['seen'])}")
        if MODE == "waits":
            await anyio.sleep(60)
        took_fix = False
        if MODE == "new":
            took_fix = ctx.patched("fix")
        elif MODE == "deprecated":
            ctx.deprecate_patch("fix")
            took_fix = True
        if took_fix:
            done.append(await ctx.step("C", count, f"{message.text}:C"))
            await hang_after("C", ctx)
        done.append(await ctx.step("B2" if MODE == "renamed" else "B", count, f"{message.text}:B"))
        await hang_after("B", ctx)
        ctx.output.write(f"{','.join(done)} fix={took_fix}")
    """
)


def make_app_dir(tmp_path: Path) -> Path:
    d = tmp_path / "app"
    d.mkdir()
    (d / "patch_app.py").write_text(APP)
    return d


def started_workers(app_dir: Path, counts: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """``start(address, mode, hang)``: an `electric worker` process hosting patch_app:app; each is
    killed when the test ends."""
    with worker_processes(app_dir, "patch_app:app") as start:
        yield lambda address, mode, hang="": start(address, MODE=mode, HANG=hang, COUNTS=str(counts))


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    return make_app_dir(tmp_path)


@pytest.fixture
def counts(app_dir: Path) -> Path:
    return app_dir / "counts.txt"


@pytest.fixture
def workers(app_dir: Path, counts: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    yield from started_workers(app_dir, counts)


async def start_and_kill(
    srv: TestServer,
    client: AsyncClient,
    workers: Callable[..., subprocess.Popen[bytes]],
    ref: str,
    mode: str,
    hang: str,
    recorded: Callable[..., bool],
) -> str:
    """Run a message on a ``mode`` worker that hangs after step ``hang``; kill -9 it once
    ``recorded`` is in the stream. Returns the message's key: its run is in flight."""
    first = workers(srv.address, mode, hang)
    await client.spawn(ref)
    receipt = await client.send(ref, "job")
    await until(client, ref, recorded)
    kill9(first)
    return receipt.key


async def test_a_run_recorded_on_old_code_finishes_on_the_old_path(
    tmp_path: Path, workers: Callable[..., subprocess.Popen[bytes]], counts: Path
) -> None:
    with server(tmp_path / "electric", free_port()) as srv:
        async with srv.async_client() as client:
            # Old code recorded A and B, then its worker died; new code takes the run over.
            key = await start_and_kill(
                srv, client, workers, "job/old", "old", "B", step_is(1, "ok", name="B")
            )
            workers(srv.address, "new")
            done = await until(client, "job/old", run_status(COMPLETED, key))
            assert done.raw.run.attempt == 2
            assert done.raw.run.output == "job:A,job:B fix=False"  # no NonDeterministicRun
            assert lines(counts) == {"job:A": 1, "job:B": 1}  # replayed, nothing ran again; no C
            records = await step_records(client, "job/old")
            assert [r["outcome"] for r in records] == ["ok", "ok"]  # no marker: the answer was False


async def test_a_run_cut_before_the_patch_takes_the_new_path(
    tmp_path: Path, workers: Callable[..., subprocess.Popen[bytes]], counts: Path
) -> None:
    with server(tmp_path / "electric", free_port()) as srv:
        async with srv.async_client() as client:
            # Old code recorded only A: nothing recorded says which path the run took after it.
            key = await start_and_kill(
                srv, client, workers, "job/cut", "old", "A", step_is(0, "ok", name="A")
            )
            workers(srv.address, "new")
            done = await until(client, "job/cut", run_status(COMPLETED, key))
            assert done.raw.run.output == "job:A,job:C,job:B fix=True"
            assert lines(counts) == {"job:A": 1, "job:C": 1, "job:B": 1}


async def test_a_new_run_records_its_patch_and_answers_it_again_when_redelivered(
    tmp_path: Path, workers: Callable[..., subprocess.Popen[bytes]], counts: Path
) -> None:
    with server(tmp_path / "electric", free_port()) as srv:
        async with srv.async_client() as client:
            # New code: the marker is written before C's record; the worker dies after C.
            key = await start_and_kill(
                srv, client, workers, "job/new", "new", "C", step_is(1, "ok", name="C")
            )
            records = await step_records(client, "job/new")
            assert records[1] == {
                **records[1],
                "index": 1,
                "outcome": "patched",
                "patch": "fix",
                "attempt": 1,
            }
            assert [(r["index"], r.get("name")) for r in records] == [(0, "A"), (1, None), (1, "C")]
            workers(srv.address, "new")
            done = await until(client, "job/new", run_status(COMPLETED, key))
            assert done.raw.run.attempt == 2
            assert done.raw.run.output == "job:A,job:C,job:B fix=True"  # True again, from the marker
            assert lines(counts) == {"job:A": 1, "job:C": 1, "job:B": 1}
            records = await step_records(client, "job/new")
            assert [r["outcome"] for r in records].count("patched") == 1  # not recorded twice


async def test_a_deprecated_patch_takes_the_new_path_with_or_without_its_marker(
    tmp_path: Path, workers: Callable[..., subprocess.Popen[bytes]], counts: Path
) -> None:
    with server(tmp_path / "electric", free_port()) as srv:
        async with srv.async_client() as client:
            # A run that recorded the marker (new code) and a run that started on deprecated code.
            marked = await start_and_kill(
                srv, client, workers, "job/m", "new", "C", step_is(1, "ok", name="C")
            )
            workers(srv.address, "deprecated")
            done = await until(client, "job/m", run_status(COMPLETED, marked))
            assert done.raw.run.output == "job:A,job:C,job:B fix=True"
            await client.spawn("job/d")
            receipt = await client.send("job/d", "fresh")
            done = await until(client, "job/d", run_status(COMPLETED, receipt.key))
            assert done.raw.run.output == "fresh:A,fresh:C,fresh:B fix=True"
            assert "patched" not in [r["outcome"] for r in await step_records(client, "job/d")]
