"""`electric dev` and `electric worker` as real processes: they host the example agents, drain on the
first SIGINT/SIGTERM and exit at once on a second one."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import postgres_dbs
import pytest
from electric_server.tools.datadir import database_path

from electric_sdk import Client
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.testing import TestServer

ROOT = Path(__file__).parents[2]


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "electric_sdk.cli.main", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def read_until(proc: subprocess.Popen[str], pattern: str) -> re.Match[str]:
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if match := re.search(pattern, line):
            return match
    raise AssertionError(f"exited before {pattern!r}:\n" + "".join(seen))


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()


def chat_completes(client: Client, ref: str, text: str) -> str:
    receipt = client.send(ref, text)
    for event in client.watch(ref, receipt.offset):
        if event.type == "run" and event.raw.run.status == pb.RUN_STATUS_COMPLETED:
            return event.raw.run.output
    raise AssertionError("the stream ended")


def test_dev_runs_server_and_worker(tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    proc = start("dev", "examples.agents:app", "--listen", "127.0.0.1:0", "--data", str(tmp_path / "d"))
    processes.append(proc)
    address = read_until(proc, r"electric server listening on (\S+)").group(1)
    read_until(proc, r"stop: ")
    with Client(address) as client:
        client.spawn("chat/c1")
        assert chat_completes(client, "chat/c1", "hello world") == "You said: hello world "
    proc.send_signal(signal.SIGINT)
    read_until(proc, "draining")
    assert proc.wait(30) == 0


def test_dev_on_a_database_keeps_its_entities_there(
    tmp_path: Path, processes: list[subprocess.Popen[str]], postgres_url: str
) -> None:
    """`electric dev --database URL`: the server's store is the PostgreSQL database, not --data's."""
    data = tmp_path / "d"
    proc = start("dev", "--listen", "127.0.0.1:0", "--data", str(data), "--database", postgres_url)
    processes.append(proc)
    address = read_until(proc, r"electric server listening on (\S+) \(database: postgresql://").group(1)
    with Client(address) as client:
        client.spawn("chat/on_pg")
        assert chat_completes(client, "chat/on_pg", "hello") == "You said: hello "
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0
    assert not database_path(data).exists()
    rows = postgres_dbs.run(lambda: fetch(postgres_url, "SELECT type, id FROM entities"))
    assert [tuple(r) for r in rows] == [("chat", "on_pg")]


async def fetch(url: str, sql: str) -> list[Any]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


def test_worker_drains_then_exits_on_a_second_signal(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    with TestServer(tmp_path / "s") as server:
        proc = start("--address", server.address, "worker", "examples.agents:app", "--grace", "30s")
        processes.append(proc)
        read_until(proc, r"electric worker \S+ connecting")
        client = server.client()
        client.spawn("chat/c2")
        assert chat_completes(client, "chat/c2", "one") == "You said: one "
        receipt = client.send("chat/c2", "a longer message that takes a while")
        for event in client.watch("chat/c2", receipt.offset):
            if event.type == "run" and event.raw.run.status == pb.RUN_STATUS_STARTED:
                break
        proc.send_signal(signal.SIGTERM)
        read_until(proc, "draining")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 128 + signal.SIGTERM


def test_a_frozen_worker_loses_its_lease_and_the_run_is_redelivered(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """SIGSTOP the worker process mid-run: its heartbeats stop, the lease expires (runtime_lost),
    and a second worker process runs the message again with attempt 2."""
    with TestServer(tmp_path / "s", lease_ttl_ms=300, heartbeat_interval_ms=50) as server:
        first = start("--address", server.address, "worker", "examples.agents:app")
        processes.append(first)
        read_until(first, r"electric worker \S+ connecting")
        client = server.client()
        client.spawn("chat/frozen")
        receipt = client.send("chat/frozen", "one two three four five six seven eight nine ten")
        for event in client.watch("chat/frozen", receipt.offset):
            if event.type == "run" and event.raw.run.status == pb.RUN_STATUS_STARTED:
                break
        first.send_signal(signal.SIGSTOP)
        try:
            for event in client.watch("chat/frozen", receipt.offset):
                if event.type == "state" and event.value["cause"] == "runtime_lost":
                    break
            second = start("--address", server.address, "worker", "examples.agents:app")
            processes.append(second)
            for event in client.watch("chat/frozen", receipt.offset):
                if event.type == "run" and event.raw.run.status == pb.RUN_STATUS_COMPLETED:
                    assert event.raw.run.attempt == 2
                    assert event.raw.run.output.startswith("You said: one two")
                    break
        finally:
            first.send_signal(signal.SIGKILL)
