"""A disk full at the server's start, for real (a small tmpfs, as tests/test_disk_full.py mounts).

After a clean stop on a disk that then filled up, SQLite cannot open the store for writing (it
cannot size its shared-memory file: SQLITE_IOERR_SHMSIZE). The server names it a full disk and
starts read-only: reads serve, writes answer UNAVAILABLE/DISK_FULL, the readiness of writes and
``/readyz`` say no; once space is freed writes resume by themselves. A store it cannot even read without writing (a WAL left to replay) makes
`electric server` exit 75, naming the full disk, not 74, the code of a failed disk.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import grpc
import httpx
import pytest
from conftest import StartServer
from electric_server.app import SERVICE_NAME
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import error_info
from test_disk_full import mount_tmpfs, unmount

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.cli import exit_codes

pytestmark = pytest.mark.anyio

WRITES_HEALTH_NAME = "electric.v1.writes"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
REF = pb.EntityRef(type="t", id="e")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    mount_tmpfs(disk, "4m")
    try:
        yield disk
    finally:
        unmount(disk)


def fill(disk: Path) -> None:
    """Write a file until the disk has no byte left."""
    with (disk / "filler").open("wb", buffering=0) as f:
        chunk = b"\0" * 65536
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return
                chunk = chunk[: len(chunk) // 2]
    assert os.statvfs(disk).f_bavail == 0


async def test_a_full_disk_at_the_start_serves_reads_and_refuses_writes(
    small_disk: Path, start_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    data = small_disk / "data"
    srv = await start_server(data, database_url=None)
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=REF))
        await stub.SendMessage(api.SendMessageRequest(ref=REF, text="kept"))
    await srv.stop()  # a clean stop: the WAL is folded into the database
    fill(small_disk)

    caplog.set_level(logging.INFO)
    srv = await start_server(data, database_url=None, http="127.0.0.1:0")
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        entity = (await stub.GetEntity(api.GetEntityRequest(ref=REF))).entity
        assert entity.head_offset == 2
        page = await stub.ReadEvents(api.ReadEventsRequest(ref=REF, limit=10))
        assert [e.message.text for e in page.events if e.type == "message"] == ["kept"]
        for write in (
            stub.SendMessage(api.SendMessageRequest(ref=REF, text="refused")),
            stub.SpawnEntity(api.SpawnEntityRequest(ref=pb.EntityRef(type="t", id="new"))),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await write
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert error_info(refused.value).reason == "DISK_FULL"
        for service, status in (("", SERVING), (SERVICE_NAME, SERVING), (WRITES_HEALTH_NAME, NOT_SERVING)):
            check = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert check.status == status, service
        nothing = await stub.GetEntity(api.GetEntityRequest(ref=REF))
        assert nothing.entity.head_offset == 2  # nothing written
        assert srv.http is not None
        async with httpx.AsyncClient(base_url=srv.http.address, timeout=30) as http:
            ready = await http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["error"]["code"] == "DISK_FULL"

        # Space comes back: the store opens for writing by itself, and writes resume.
        watch = health.Watch(health_pb2.HealthCheckRequest(service=WRITES_HEALTH_NAME))
        assert (await watch.read()).status == NOT_SERVING
        (small_disk / "filler").unlink()
        with anyio.fail_after(10):
            assert (await watch.read()).status == SERVING
        watch.cancel()
        await stub.SendMessage(api.SendMessageRequest(ref=REF, text="after"))
        page = await stub.ReadEvents(api.ReadEventsRequest(ref=REF, limit=10))
        assert [e.message.text for e in page.events if e.type == "message"] == ["kept", "after"]
    said = [r.getMessage() for r in caplog.records if "starts read-only" in r.getMessage()]
    assert len(said) == 1
    assert "is full" in said[0]
    assert str(data) in said[0]  # where to free space
    assert "SQLITE_IOERR_SHMSIZE" in said[0] or "SQLITE_FULL" in said[0]  # what SQLite said
    assert len([r for r in caplog.records if "writes resume:" in r.getMessage()]) == 1
    await srv.stop()

    srv = await start_server(data, database_url=None)  # and all of it is there after a restart
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        page = await stub.ReadEvents(api.ReadEventsRequest(ref=REF, limit=10))
        assert [e.message.text for e in page.events if e.type == "message"] == ["kept", "after"]
    await srv.stop()


def test_a_full_disk_with_a_wal_to_replay_exits_75(small_disk: Path) -> None:
    """The server crashed (kill -9: its WAL stays, to be replayed), then the disk filled and its
    shared-memory file went: the store cannot be read without writing."""
    data = small_disk / "data"
    server = [sys.executable, "-m", "electric_sdk.cli.main", "server", "--listen", "127.0.0.1:0"]
    first = subprocess.Popen([*server, "--data", str(data)], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None
        address = next(
            line.split()[-1] for line in first.stdout if line.startswith("electric server listening")
        )
        cli = [sys.executable, "-m", "electric_sdk.cli.main", "--address", address]
        subprocess.run([*cli, "spawn", "t/e"], check=True, capture_output=True, timeout=60)
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.wait(30)
        if first.stdout is not None:
            first.stdout.close()
    assert (data / "electric.db-wal").stat().st_size > 32  # frames to replay
    (data / "electric.db-shm").unlink()
    fill(small_disk)
    done = subprocess.run(
        [*server, "--data", str(data)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == exit_codes.DISK_FULL == 75, done.stderr
    assert f"the disk holding {data} is full" in done.stderr
