"""`make cluster` (scripts/cluster.py) as real processes: three replicas on one PostgreSQL database
and a worker; an entity spawned through one replica is seen through another; SIGINT to the launcher
stops every process it started."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import postgres_dbs
import pytest

from electric_sdk import Client

ROOT = Path(__file__).parents[1]
# What a replica says while a database takes one server only (before leases live in the database).
ONE_SERVER = "one server per database"


@pytest.fixture
def database(postgres_url: str) -> Iterator[str]:
    """A database that does not exist yet: the launcher creates it."""
    url = postgres_url + "_cluster"
    yield url
    name = url.rsplit("/", 1)[1]
    postgres_dbs.run(lambda: postgres_dbs.admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def launcher(tmp_path: Path, database: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "scripts" / "cluster.py"),
            "--ports",
            "0",
            "--database",
            database,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)
    assert proc.stdout is not None
    proc.stdout.close()


def read_until(proc: subprocess.Popen[str], pattern: str) -> tuple[re.Match[str] | None, list[str]]:
    assert proc.stdout is not None
    seen: list[str] = []
    for line in proc.stdout:
        seen.append(line)
        if match := re.search(pattern, line):
            return match, seen
    return None, seen


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def started(lines: list[str]) -> list[int]:
    """The pids of the processes the launcher said it started."""
    return [int(m.group(1)) for line in lines if (m := re.match(r"cluster: \S+ started, pid (\d+)", line))]


def test_three_replicas_serve_one_database_and_sigint_stops_them_all(launcher: subprocess.Popen[str]) -> None:
    ready, seen = read_until(launcher, r"^cluster ready: 3 replicas")
    assert any(line.startswith("cluster: created the database") for line in seen), "".join(seen)
    if ready is None and any(ONE_SERVER in line for line in seen):
        assert launcher.wait(30) == 2, "the refusal's exit code"
        assert [pid for pid in started(seen) if alive(pid)] == [], "the replica that started has ended"
        pytest.skip("the database still takes one server only: replicas need leases in the database")
    assert ready is not None, "".join(seen)
    _, lines = read_until(launcher, r"^  stop: ")
    addresses = re.findall(r"replica-\d: grpc (\S+)", "".join(lines))
    pids = started(seen + lines)
    assert len(addresses) == 3, "".join(lines)
    assert len(pids) == 4, "".join(seen + lines)

    with Client(addresses[0]) as first, Client(addresses[2]) as third:
        first.spawn("chat/across")
        assert third.get("chat/across").ref.id == "across"

    launcher.send_signal(signal.SIGINT)
    stopped, rest = read_until(launcher, r"^cluster: stopped")
    assert stopped is not None, "".join(rest)
    assert launcher.wait(30) == 0
    assert [pid for pid in pids if alive(pid)] == [], "every process the launcher started has ended"
