"""`electric replay-check` and ``testing.replay``: new code against runs recorded on a real server.

Runs are left in flight by killing their worker with kill -9 mid-run
(test_patches.py's app and helpers); the check runs as its own process
(the CLI) or in the test (``testing.replay``), against the server or an
``electric export`` of its data. The counts file shows that no step ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from electric_sdk.runtime import App, Context, Message
from electric_sdk.testing import TestServer, replay

from .rt_support import COMPLETED, run_status, until
from .test_crash_recovery import free_port
from .test_durable_steps import lines, server, step_is
from .test_patches import make_app_dir, start_and_kill, started_workers

pytestmark = pytest.mark.anyio

Workers = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    return make_app_dir(tmp_path)


@pytest.fixture
def counts(app_dir: Path) -> Path:
    return app_dir / "counts.txt"


@pytest.fixture
def workers(app_dir: Path, counts: Path) -> Iterator[Workers]:
    yield from started_workers(app_dir, counts)


async def check(app_dir: Path, mode: str, *args: str, counts: Path | None = None) -> tuple[int, str]:
    """`electric replay-check patch_app:app ARGS` as its own process, on the code of ``mode``:
    its exit code and its output (stdout, then stderr)."""
    command = [sys.executable, "-m", "electric_sdk.cli.main", "replay-check", "patch_app:app", *args]
    env = {**os.environ, "MODE": mode, "COUNTS": str(counts or os.devnull)}
    done = await anyio.run_process(command, cwd=app_dir, check=False, env=env)
    return done.returncode, done.stdout.decode() + done.stderr.decode()


async def two_runs_in_flight(srv: TestServer, workers: Workers) -> tuple[str, str]:
    """job/ab recorded A and B on the old code, job/a only A; both workers were killed -9, so
    both runs are in flight. Returns their messages' keys."""
    async with srv.async_client() as client:
        ab = await start_and_kill(srv, client, workers, "job/ab", "old", "B", step_is(1, "ok", name="B"))
        a = await start_and_kill(srv, client, workers, "job/a", "old", "A", step_is(0, "ok", name="A"))
    return ab, a


def export(data: Path, to: Path) -> None:
    command = [sys.executable, "-m", "electric_sdk.cli.main", "export", str(to), "--data", str(data)]
    subprocess.run(command, check=True, capture_output=True)


async def test_a_renamed_step_is_found_in_the_runs_in_flight_and_the_patch_passes(
    tmp_path: Path, app_dir: Path, workers: Workers, counts: Path
) -> None:
    data = tmp_path / "electric"
    with server(data, free_port()) as srv:
        ab, _ = await two_runs_in_flight(srv, workers)
        before = lines(counts)
        code, said = await check(app_dir, "renamed", "--server", srv.address, counts=counts)
        assert code == 8, said
        assert f"job/ab run {ab}: step 1 was recorded as 'B'; the new code asks for 'B2'" in said
        assert said.splitlines()[-1] == "checked 2 runs of 2 entities: 1 would fail"  # job/a stops at 1
        code, said = await check(app_dir, "new", "--server", srv.address, counts=counts)
        assert (code, said) == (0, "checked 2 runs of 2 entities: all replay\n")
        code, said = await check(app_dir, "renamed", "--server", srv.address, "--json")
        report = json.loads(said)
        assert (report["ok"], report["runs"], len(report["problems"])) == (False, 2, 1)
        assert report["problems"][0] == {
            "entity": "job/ab",
            "run": ab,
            "index": 1,
            "kind": "nondeterministic",
            "recorded": "B",
            "asked": "B2",
            "error": "",
        }
        assert lines(counts) == before  # no step ran during the checks
    # The same runs, read from an export of the stopped server's data.
    export(data, tmp_path / "runs.jsonl")
    code, said = await check(app_dir, "renamed", "--file", str(tmp_path / "runs.jsonl"), counts=counts)
    assert code == 8, said
    assert "step 1 was recorded as 'B'; the new code asks for 'B2'" in said
    code, said = await check(app_dir, "new", "--file", str(tmp_path / "runs.jsonl"))
    assert (code, said) == (0, "checked 2 runs of 2 entities: all replay\n")
    assert lines(counts) == before


async def test_all_runs_checks_the_ended_runs_too(tmp_path: Path, app_dir: Path, workers: Workers) -> None:
    with server(tmp_path / "electric", free_port()) as srv:
        ab, a = await two_runs_in_flight(srv, workers)
        workers(srv.address, "new")  # job/ab ends on the old path, job/a on the new one
        async with srv.async_client() as client:
            await until(client, "job/ab", run_status(COMPLETED, ab))
            await until(client, "job/a", run_status(COMPLETED, a))
        assert await check(app_dir, "renamed", "--server", srv.address) == (
            0,
            "checked 0 runs of 0 entities: all replay\n",
        )
        code, said = await check(app_dir, "renamed", "--server", srv.address, "--all-runs")
        assert code == 8, said
        assert f"job/ab run {ab}: step 1 was recorded as 'B'; the new code asks for 'B2'" in said
        assert f"job/a run {a}: step 1 was recorded as 'C'; the new code asks for 'B2'" in said
        code, said = await check(app_dir, "new", "--server", srv.address, "--all-runs", "--type", "job")
        assert (code, said) == (0, "checked 2 runs of 2 entities: all replay\n")


def job_app(second: str, *, patch: bool, ran: list[str]) -> App:
    """The app of test_patches.py in this process: A, then C when patched, then ``second``."""
    app = App(code_version=f"{second}-{patch}")

    def step(name: str) -> str:
        ran.append(name)  # a replay check must never get here
        return name

    @app.entity("job")
    async def job(ctx: Context, message: Message) -> None:
        await ctx.step("A", step, "A")
        if patch and ctx.patched("fix"):
            await ctx.step("C", step, "C")
        await ctx.step(second, step, second)

    return app


async def test_testing_replay_reports_the_rename_and_passes_the_patch(
    tmp_path: Path, workers: Workers
) -> None:
    data = tmp_path / "electric"
    ran: list[str] = []
    with server(data, free_port()) as srv:
        ab, _ = await two_runs_in_flight(srv, workers)
        result = replay(job_app("B2", patch=False, ran=ran), server=srv)
        assert [(p.entity, p.run, p.index, p.recorded, p.asked) for p in result.problems] == [
            ("job/ab", ab, 1, "B", "B2")
        ]
        with pytest.raises(AssertionError, match="recorded as 'B'; the new code asks for 'B2'"):
            result.assert_replays()
        replay(job_app("B", patch=True, ran=ran), server=srv.address).assert_replays()
    export(data, tmp_path / "runs.jsonl")
    assert not replay(job_app("B2", patch=False, ran=ran), file=tmp_path / "runs.jsonl").ok
    replay(job_app("B", patch=True, ran=ran), file=tmp_path / "runs.jsonl").assert_replays()
    assert ran == []


async def test_code_that_raises_fails_the_check_and_code_that_waits_is_unchecked(
    tmp_path: Path, app_dir: Path, workers: Workers
) -> None:
    with server(tmp_path / "electric", free_port()) as srv:
        ab, a = await two_runs_in_flight(srv, workers)
        code, said = await check(app_dir, "raises", "--server", srv.address)
        assert code == 8, said
        # The state the code sees is the entity's, rebuilt from its stream (A's record holds it).
        assert f"job/a run {a}: the new code raised LookupError: seen ['job'] while replaying" in said
        assert said.splitlines()[-1] == "checked 2 runs of 2 entities: 2 would fail"
        code, said = await check(app_dir, "waits", "--server", srv.address, "--run-timeout", "100ms")
        assert code == 0, said
        assert f"electric: unchecked: job/ab run {ab}: its code waited more than 100ms" in said
        assert said.startswith("checked 2 runs of 2 entities: all replay (2 unchecked)\n")  # stdout


async def test_bad_input_is_a_clear_error(tmp_path: Path, app_dir: Path) -> None:
    code, said = await check(app_dir, "new", "--file", str(tmp_path / "missing.jsonl"))
    assert (code, said.startswith("electric: INVALID_EXPORT_FILE: cannot read")) == (2, True), said
    (tmp_path / "not-an-export.jsonl").write_text('{"hello": 1}\n')
    code, said = await check(app_dir, "new", "--file", str(tmp_path / "not-an-export.jsonl"))
    assert (code, "not an electric export" in said) == (2, True), said
    (tmp_path / "cut.jsonl").write_text('{"electric_export": 1, "source": "sqlite"}\n')
    code, said = await check(app_dir, "new", "--file", str(tmp_path / "cut.jsonl"))
    assert (code, "cut short" in said) == (2, True), said
    code, said = await check(app_dir, "new", "--server", f"127.0.0.1:{free_port()}", "--timeout", "300ms")
    assert (code, "electric: UNAVAILABLE: no server at" in said) == (5, True), said
    code, said = await check(app_dir, "new", "--type", "nope", "--file", str(tmp_path / "cut.jsonl"))
    assert (code, "the app defines no entity type 'nope' (it defines job)" in said) == (2, True), said
    command = [sys.executable, "-m", "electric_sdk.cli.main", "replay-check", "no_such_module:app"]
    done = await anyio.run_process(command, cwd=app_dir, check=False)
    assert done.returncode == 2
    assert "cannot load no_such_module:app: No module named 'no_such_module'" in done.stderr.decode()
