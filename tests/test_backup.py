"""`electric backup` and `electric restore` (issue 17) with a real server process and real files:
a backup taken under concurrent writes restores to a store that `verify` finds clean and that
holds every write acknowledged before the backup began; the refusals say why and write nothing.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import grpc

from electric_sdk import Client
from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb

ELECTRIC = [sys.executable, "-m", "electric_sdk.cli.main"]
ENTITIES = 8
WRITERS = 8
ACKS_BEFORE_BACKUP = 200


def electric(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ELECTRIC, *args], capture_output=True, text=True, timeout=60, check=False)


def signal_request(n: int) -> api.SignalEntityRequest:
    key = f"sig-{n}"
    ref = pb.EntityRef(type="load", id=f"e{n % ENTITIES}")
    return api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGUSR, reason=key, idempotency_key=key)


def signals_in(database: Path) -> set[tuple[str, str, int]]:
    """(entity id, event key, txid) of every signal event in a store."""
    with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT id, key, txid FROM events WHERE kind = 'signal'").fetchall()
    return {(str(i), str(k), int(t)) for i, k, t in rows}


async def write_while_backing_up(
    address: str, data_dir: Path, out: Path
) -> tuple[subprocess.CompletedProcess[bytes], dict[str, api.SignalEntityResponse], int]:
    """Concurrent writers, and `electric backup` once they have had ACKS_BEFORE_BACKUP answers.

    Returns the backup's process, the writes acknowledged before it began, and how many were
    acknowledged while it ran.
    """
    acked: dict[str, api.SignalEntityResponse] = {}
    during: list[str] = []
    backup_started = anyio.Event()
    backup_done = anyio.Event()
    counter = iter(range(10**9))
    backup: list[subprocess.CompletedProcess[bytes]] = []
    acked_before: dict[str, api.SignalEntityResponse] = {}

    async with grpc.aio.insecure_channel(address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        for i in range(ENTITIES):
            await stub.SpawnEntity(api.SpawnEntityRequest(ref=pb.EntityRef(type="load", id=f"e{i}")))

        async def writer() -> None:
            while not backup_done.is_set() or len(during) < WRITERS:
                n = next(counter)
                response = await stub.SignalEntity(signal_request(n))
                acked[f"sig-{n}"] = response
                if backup_started.is_set():
                    during.append(f"sig-{n}")
                elif len(acked) >= ACKS_BEFORE_BACKUP:
                    backup_started.set()

        async def take_backup() -> None:
            await backup_started.wait()
            acked_before.update(acked)  # every write acknowledged before the backup began
            backup.append(
                await anyio.run_process(
                    [*ELECTRIC, "backup", "--data", str(data_dir), str(out), "--json"], check=False
                )
            )
            backup_done.set()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(take_backup)
                for _ in range(WRITERS):
                    tg.start_soon(writer)
    return backup[0], acked_before, len(during)


def test_backup_under_load_restores_every_acknowledged_write(
    server_process: Callable[..., Any], tmp_path: Path
) -> None:
    srv = server_process()
    out = tmp_path / "backup.db"

    backup, acked_before, during = anyio.run(write_while_backing_up, srv.address, srv.data_dir, out)

    assert backup.returncode == 0, backup.stderr
    assert during >= WRITERS, "writes went on while the backup ran"
    copied = json.loads(backup.stdout)
    assert copied["path"] == str(out)
    assert copied["entities"] == ENTITIES
    assert copied["head_txid"] >= max(r.txid for r in acked_before.values())
    assert copied["bytes"] == out.stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".backup")) == [], (
        "temporary file left"
    )

    restored = tmp_path / "restored"
    result = electric("restore", str(out), "--data", str(restored), "--json")
    assert result.returncode == 0, result.stderr
    assert {k: v for k, v in json.loads(result.stdout).items() if k not in ("path", "bytes")} == {
        "entities": ENTITIES,
        "events": copied["events"],
        "head_txid": copied["head_txid"],
    }
    # Only the database (and the lock file restore held): no WAL, no other state.
    assert sorted(p.name for p in restored.iterdir()) == ["LOCK", "electric.db"]

    verified = electric("verify", "--data", str(restored), "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads(verified.stdout)["clean"] is True

    in_backup = signals_in(restored / "electric.db")
    for key, response in acked_before.items():
        assert (signal_request(int(key[4:])).ref.id, response.key, response.txid) in in_backup, key
    assert all(txid <= copied["head_txid"] for _, _, txid in in_backup)

    # The restored directory starts, and answers an acknowledged request's retry as it did.
    srv.send(signal.SIGTERM)
    assert srv.wait() == 0
    again = server_process(restored)
    with grpc.insecure_channel(again.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        key, response = next(iter(acked_before.items()))
        assert stub.SignalEntity(signal_request(int(key[4:]))) == response
    again.send(signal.SIGTERM)
    assert again.wait() == 0


def test_restore_refuses_a_locked_or_non_empty_dir(
    server_process: Callable[..., Any], tmp_path: Path
) -> None:
    srv = server_process()
    with Client(srv.address) as client:
        client.spawn("agent/a1")
    out = tmp_path / "backup.db"
    assert electric("backup", "--data", str(srv.data_dir), str(out)).returncode == 0
    live = sorted(p.name for p in srv.data_dir.iterdir())

    locked = electric("restore", str(out), "--data", str(srv.data_dir))

    assert locked.returncode == 2, locked.stderr
    assert f"electric restore: the data directory {srv.data_dir} is in use" in locked.stderr
    assert f"pid {srv.proc.pid}" in locked.stderr
    assert sorted(p.name for p in srv.data_dir.iterdir()) == live

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")

    not_empty = electric("restore", str(out), "--data", str(busy))

    assert not_empty.returncode == 2, not_empty.stderr
    assert f"cannot restore into {busy}: it is not empty (it holds notes.txt)" in not_empty.stderr
    assert [p.name for p in busy.iterdir()] == ["notes.txt"], "a refused restore wrote into the directory"


def test_backup_refuses_to_overwrite_unless_forced(
    server_process: Callable[..., Any], tmp_path: Path
) -> None:
    srv = server_process()
    out = tmp_path / "backup.db"
    out.write_text("precious")

    refused = electric("backup", "--data", str(srv.data_dir), str(out))

    assert refused.returncode == 2
    assert f"electric backup: {out} exists; pass --force to overwrite it" in refused.stderr
    assert out.read_text() == "precious"

    forced = electric("backup", "--data", str(srv.data_dir), str(out), "--force")

    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.startswith("backed up 0 entities, 0 events"), forced.stdout
    with closing(sqlite3.connect(out)) as conn:
        assert conn.execute("SELECT count(*) FROM entities").fetchone() == (0,)


def test_missing_or_foreign_files_are_clear_errors(tmp_path: Path) -> None:
    missing = electric("backup", "--data", str(tmp_path / "nowhere"), str(tmp_path / "b.db"))
    empty_dir = electric("backup", "--data", str(tmp_path), str(tmp_path / "b.db"))
    (tmp_path / "notes.txt").write_text("not a database " * 100)
    foreign = electric("restore", str(tmp_path / "notes.txt"), "--data", str(tmp_path / "target"))
    no_file = electric("restore", str(tmp_path / "b.db"), "--data", str(tmp_path / "target"))

    for result, message in [
        (missing, f"electric backup: no data directory at {tmp_path / 'nowhere'}"),
        (empty_dir, f"electric backup: no electric database at {tmp_path}"),
        (foreign, f"electric restore: {tmp_path / 'notes.txt'} is not an electric store"),
        (no_file, f"electric restore: no backup file at {tmp_path / 'b.db'}"),
    ]:
        assert result.returncode == 2, result.stderr
        assert message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "b.db").exists()
    assert not (tmp_path / "target").exists()


def test_restore_refuses_a_damaged_backup(server_process: Callable[..., Any], tmp_path: Path) -> None:
    srv = server_process()
    with Client(srv.address) as client:
        for i in range(50):
            client.spawn(f"agent/a{i}")
            client.signal(f"agent/a{i}", "SIGUSR", payload={"filler": "x" * 500})
    out = tmp_path / "backup.db"
    assert electric("backup", "--data", str(srv.data_dir), str(out)).returncode == 0
    with closing(sqlite3.connect(out)) as conn:
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'events'").fetchone()
    data = bytearray(out.read_bytes())
    start = (root - 1) * page_size
    data[start : start + 12] = b"\xff" * 12  # the events table's root page: its b-tree header
    out.write_bytes(bytes(data))

    result = electric("restore", str(out), "--data", str(tmp_path / "target"))

    assert result.returncode == 2, result.stderr
    assert f"electric restore: {out} is damaged (SQLite's integrity check: " in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "target").exists()
