"""`electric worker` and `electric dev` drain on their first SIGTERM or SIGINT (seed 004), as real
processes: no new lease, the run in progress finishes, the leases go back, exit 0.

The held step of headless_app.py waits for a file the test creates, so "the run is still in
progress while the worker drains" holds by construction, not by timing. (A second signal exits at
once: test_cli_runtime.py.)
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from electric_sdk import Client
from electric_sdk.testing import TestServer

from .test_headless import APP, ELECTRIC, Proc, start_worker, wait_run_end, wait_run_started

# Far longer than the test: the second worker can only get the entity because the first gave it back.
LEASE_TTL_MS = 600_000


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_draining_worker_finishes_its_run_then_another_worker_takes_the_entity(
    tmp_path: Path, procs: list[Proc], signum: int
) -> None:
    ref, gate = "headless/drained", tmp_path / "gate"
    with TestServer(tmp_path / "s", lease_ttl_ms=LEASE_TTL_MS, heartbeat_interval_ms=100) as server:
        sdk = server.client()
        first = start_worker(procs, server.address)
        sdk.spawn(ref)
        held = sdk.send(ref, f"hold {gate}")
        wait_run_started(sdk, ref, held.key, held.offset)
        second = start_worker(procs, server.address)  # connected, but the entity is leased to the first

        first.signal(signum)
        first.out.until(lambda line: f"received {signal.Signals(signum).name}: draining" in line)
        queued = sdk.send(ref, "after the drain")  # the draining worker must not start it
        gate.touch()

        end = wait_run_end(sdk, ref, held.key, held.offset)
        assert end.value["status"] == "completed"  # the run in progress finished, not aborted
        assert end.value["output"] == f"partial pid={first.popen.pid} done"
        assert first.wait() == 0

        after = wait_run_end(sdk, ref, queued.key, queued.offset)
        assert after.value["status"] == "completed"
        assert after.value["output"] == f"echo after the drain pid={second.popen.pid}"
        assert after.value["attempt"] == 1  # it had never started on the first worker
        assert sdk.get(ref).state.value == "running"


def test_dev_drains_its_worker_then_its_server(tmp_path: Path, procs: list[Proc]) -> None:
    ref, gate = "headless/dev", tmp_path / "gate"
    data = tmp_path / "data"
    dev = Proc(
        [*ELECTRIC, "dev", f"{APP}:app", "--listen", "127.0.0.1:0", "--data", str(data), "--grace", "1m"]
    )
    procs.append(dev)
    line = dev.out.until(lambda line: line.startswith("electric server listening on "))
    address = line.split()[4]
    with Client(address) as sdk:
        sdk.spawn(ref)
        held = sdk.send(ref, f"hold {gate}")
        wait_run_started(sdk, ref, held.key, held.offset)
        dev.signal(signal.SIGTERM)
        dev.out.until(lambda line: "received SIGTERM: draining" in line)
        gate.touch()
        end = wait_run_end(sdk, ref, held.key, held.offset)
        assert end.value["status"] == "completed"
        assert dev.wait() == 0
