"""The benchmarks' raw-SQLite ceilings write the store's own schema: run each on a tiny load, so a
schema change that breaks them fails here rather than in the next `make bench`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import bench_pg_store
import bench_restart
import bench_signal
import bench_signal_many
import bench_store
import postgres_dbs


def test_signal_ceiling(tmp_path: Path) -> None:
    assert bench_signal.raw_commit_latency(tmp_path / "raw.db", 3)["n"] == 3


@pytest.mark.parametrize("shared", [False, True])
def test_store_ceiling(tmp_path: Path, shared: bool) -> None:
    assert bench_store.raw_run(tmp_path / "raw.db", [2, 3], shared)


def test_signal_many_ceiling(tmp_path: Path) -> None:
    assert bench_signal_many.raw_ceiling(tmp_path / "raw.db", 5)


def test_restart_dataset(tmp_path: Path) -> None:
    assert bench_restart.build_dataset(tmp_path / "electric.db", 5)


def test_pg_store_ceiling(postgres_url: str) -> None:
    """The PostgreSQL store bench's raw asyncpg ceiling writes the store's own events table."""
    assert postgres_dbs.run(lambda: bench_pg_store.raw_run(postgres_url, [2, 3]))["events"] == 5


def test_chain_floor(postgres_url: str) -> None:
    """bench_dbos's floor of SIGINT → `unwound` (three processes, gRPC, two commits) makes its
    trips, and reads what more of them cost each process."""
    import chain_floor
    import trip_cpu

    ms, cpu = chain_floor.measure_with_cpu(postgres_url, 5, 3, timeout=120)
    assert len(ms) == 5
    assert all(x > 0 for x in ms)
    if not trip_cpu.available():
        assert cpu is None
        return
    per_trip = trip_cpu.per_trip_ms([cpu])
    assert cpu is not None
    assert cpu["trips"] == 3
    # Each trip wakes the server, the worker and the client, and commits twice.
    assert all(per_trip[group] > 0 for group in ("server", "worker", "client", "PostgreSQL")), per_trip


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
def test_trip_cpu_charges_each_process_its_own_work() -> None:
    """A trip that makes another process spin is charged to it, and reading it is not charged to
    the reader; rounds add up by trips."""
    import subprocess

    import trip_cpu

    spin = "import sys\nfor _ in sys.stdin:\n    sum(range(2_000_000)); print(flush=True)"
    with subprocess.Popen(
        [sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdin is not None
        assert child.stdout is not None
        meter = trip_cpu.TripCPU({"spinner": [child.pid]})
        for _ in range(3):
            meter.before()
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline() == "\n"
            meter.after()
        idle = trip_cpu.TripCPU({"spinner": [child.pid]})
        for _ in range(3):
            idle.before()
            idle.after()
        child.kill()
    busy, quiet = trip_cpu.per_trip_ms([meter.result()]), trip_cpu.per_trip_ms([idle.result(), None])
    assert busy["spinner"] > 5 * max(busy[trip_cpu.SELF], 0.001)  # the spin is the child's
    assert quiet["spinner"] < busy["spinner"] / 5
    assert busy["all"] == pytest.approx(busy["spinner"] + busy[trip_cpu.SELF])
    both = trip_cpu.per_trip_ms([meter.result(), idle.result()])
    assert both["spinner"] == pytest.approx((busy["spinner"] + quiet["spinner"]) / 2)
    assert trip_cpu.per_trip_ms([None]) == {}
