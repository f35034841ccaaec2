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
    """bench_dbos's floor of SIGINT → `unwound` (three processes, gRPC, two commits) makes its trips."""
    import chain_floor

    ms = chain_floor.measure(postgres_url, 5, timeout=120)
    assert len(ms) == 5
    assert all(x > 0 for x in ms)
