"""`electric worker --metrics` (issue 21): a real worker process hosts real runs and signals, then
its scrape, parsed with prometheus_client's own parser, is held to what was done; across a
server restart it counts the reconnect."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ServerProcess
from prometheus_client.parser import text_string_to_metric_families

from electric_sdk import AsyncClient, Client
from electric_sdk.lifecycle import Action, Effect, Outcome, runtime_outcome

from .rt_support import ABORTED, COMPLETED, FAILED, STARTED, outcome_of, run_status, until
from .test_cli_runtime import ROOT, read_until, start

pytestmark = pytest.mark.anyio

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
APP = "tests.runtime.metrics_app:app"


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def family(samples: Samples, name: str) -> dict[tuple[str, ...], float]:
    return {tuple(v for _, v in sorted(labels)): value for (n, labels), value in samples.items() if n == name}


@pytest.fixture
def worker(
    server_process: Callable[..., ServerProcess], tmp_path: Path
) -> Iterator[tuple[str, ServerProcess]]:
    """A server process, and a worker process hosting APP with --metrics on a free port: its URL."""
    server = server_process(tmp_path / "data")
    proc = start("--address", server.address, "worker", APP, "--metrics", "127.0.0.1:0", "--grace", "1s")
    try:
        url = read_until(proc, r"electric worker metrics on (\S+)").group(1)
        read_until(proc, r"electric worker \S+ connecting")
        yield url, server
    finally:
        proc.kill()
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()


async def test_worker_metrics_match_what_was_done(
    worker: tuple[str, ServerProcess], server_process: Callable[..., ServerProcess]
) -> None:
    url, server = worker
    async with AsyncClient(server.address) as client:
        await client.spawn("probe/a")
        for text, status in [("one", COMPLETED), ("two", COMPLETED), ("fail", FAILED)]:
            sent = await client.send("probe/a", text)
            await until(client, "probe/a", run_status(status, sent.key), sent.offset)

        await client.spawn("probe/b")
        sent = await client.send("probe/b", "wait")
        await until(client, "probe/b", run_status(STARTED, sent.key), sent.offset)
        sigint = await client.signal("probe/b", "SIGINT", reason="stop waiting")
        await until(client, "probe/b", run_status(ABORTED, sent.key), sent.offset)
        await until(client, "probe/b", outcome_of(sigint.key, Outcome.ABORTED.value))
        for payload in ("hello", "fail", "again"):
            usr = await client.signal("probe/b", "SIGUSR", payload=payload)
            await until(client, "probe/b", outcome_of(usr.key))  # written once on_sigusr returned

        samples = scrape(url)
        assert family(samples, "electric_worker_runs_started_total") == {("probe",): 4}
        assert family(samples, "electric_worker_runs_ended_total") == {
            ("completed", "probe"): 2,
            ("failed", "probe"): 1,
            ("aborted", "probe"): 1,
        }
        assert family(samples, "electric_worker_run_seconds_count") == {("probe",): 4}
        assert 0 < samples["electric_worker_run_seconds_sum", frozenset({("type", "probe")})] < 60
        assert family(samples, "electric_worker_signals_delivered_total") == {("SIGINT",): 1, ("SIGUSR",): 3}
        failed = runtime_outcome(Action.DELIVER, Effect.FAILED).value
        delivered = runtime_outcome(Action.DELIVER, Effect.DELIVERED).value
        assert family(samples, "electric_worker_signal_outcomes_total") == {
            ("aborted", "SIGINT"): 1,
            (delivered, "SIGUSR"): 2,
            (failed, "SIGUSR"): 1,
        }
        # SIGINT has no handler here; on_sigusr ran three times, raising once.
        assert family(samples, "electric_worker_handler_seconds_count") == {
            ("returned", "SIGUSR"): 2,
            ("failed", "SIGUSR"): 1,
        }
        assert family(samples, "electric_worker_leases_held") == {(): 2}
        assert family(samples, "electric_worker_connected") == {(): 1}
        assert family(samples, "electric_worker_reconnects_total") == {(): 0}
        # The worker's own registry: nothing of the process's default one.
        assert not any(name.startswith(("python_", "process_")) for name, _ in samples)

    # The server restarts on the same port and data: the worker reconnects and runs on.
    server.proc.terminate()
    assert server.wait() == 0
    port = int(server.address.rpartition(":")[2])
    restarted = server_process(server.data_dir, port=port)
    async with AsyncClient(restarted.address) as client:
        await client.spawn("probe/c")
        sent = await client.send("probe/c", "after the restart")
        await until(client, "probe/c", run_status(COMPLETED, sent.key), sent.offset)
    samples = scrape(url)
    assert family(samples, "electric_worker_reconnects_total") == {(): 1}
    assert family(samples, "electric_worker_connected") == {(): 1}
    assert family(samples, "electric_worker_runs_started_total") == {("probe",): 5}
    assert family(samples, "electric_worker_runs_ended_total")["completed", "probe"] == 3


@pytest.mark.parametrize(
    ("command", "address", "error"),
    [
        ("worker", "0.0.0.0:0", "pass --insecure to allow it"),
        ("dev", "0.0.0.0:0", "(they have no auth)"),
        ("worker", "9100", "--metrics must be HOST:PORT"),
    ],
)
def test_metrics_address_is_checked(command: str, address: str, error: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "electric_sdk.cli.main", command, APP, "--metrics", address]
        + (["--data", str(tmp_path / "d"), "--listen", "127.0.0.1:0"] if command == "dev" else []),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 2, result
    assert error in result.stderr


def test_dev_serves_its_workers_metrics(tmp_path: Path) -> None:
    proc = start(
        "dev", APP, "--listen", "127.0.0.1:0", "--data", str(tmp_path / "d"), "--metrics", "127.0.0.1:0"
    )
    try:
        address = read_until(proc, r"electric server listening on (\S+)").group(1)
        url = read_until(proc, r"electric worker metrics on (\S+)").group(1)
        with Client(address) as client:
            client.spawn("probe/d")
            sent = client.send("probe/d", "in dev")
            for event in client.watch("probe/d", sent.offset):
                if event.type == "run" and event.raw.run.status == COMPLETED:
                    break
        samples = scrape(url)
        assert family(samples, "electric_worker_runs_ended_total") == {("completed", "probe"): 1}
        assert family(samples, "electric_worker_leases_held") == {(): 1}
    finally:
        proc.kill()
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()
