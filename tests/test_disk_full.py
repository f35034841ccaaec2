"""A full disk, for real: the data directory on a small tmpfs mounted by the test.

Writes are refused at once with UNAVAILABLE/DISK_FULL, nothing of them is
kept, reads and health go on while the readiness of writes says NOT_SERVING,
it is logged once, and once space is freed writes resume by themselves with
every acknowledged write present, also after a restart. Mounting needs root:
outside CI the test is skipped where it cannot mount, never in CI.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import grpc
import pytest
from conftest import StartServer
from electric_server.app import SERVICE_NAME
from electric_server.fastpaths import forced
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import error_info

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb

pytestmark = pytest.mark.anyio

WRITES_HEALTH_NAME = "electric.v1.writes"  # the readiness of writes, as docs/server.md names it
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
TEXT = os.urandom(1500).hex()  # 3,000 bytes a message: the disk fills in a few seconds
FILLER = 5 * 1024 * 1024  # what the test gives back: more than the 4 MB writes resume at


def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        why = f"cannot mount a tmpfs (needs root): {result.stderr.strip() or result.returncode}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


def unmount(path: Path) -> None:
    subprocess.run(["umount", "--lazy", str(path)], check=False, capture_output=True)


@pytest.fixture
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    disk = tmp_path / "disk"
    mount_tmpfs(disk, request.param)
    try:
        yield disk
    finally:
        unmount(disk)


def message(n: int) -> api.SendMessageRequest:
    return api.SendMessageRequest(
        ref=pb.EntityRef(type="t", id="e"), text=f"{n} {TEXT}", idempotency_key=f"m{n}"
    )


# The WAL is checkpointed every 1,000 pages (4 MB): with 3 MB left it fills first, and a
# commit meets the full disk; with 7 MB the checkpoint does, copying the WAL into the database.
@pytest.mark.parametrize(
    ("small_disk", "during"), [("8m", "a commit"), ("12m", "a checkpoint")], indirect=["small_disk"]
)
async def test_a_full_disk_refuses_writes_at_once_and_they_resume_once_space_is_freed(
    small_disk: Path, start_server: StartServer, during: str, caplog: pytest.LogCaptureFixture
) -> None:
    """(``small_disk`` first: it is unmounted after the servers stop.)"""
    caplog.set_level(logging.INFO)
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * FILLER)
    srv = await start_server(small_disk / "data", disk_full_retry_ms=20)
    acked: list[int] = []
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=pb.EntityRef(type="t", id="e")))
        refused: grpc.aio.AioRpcError | None = None
        with anyio.fail_after(60):
            while refused is None:
                started = time.monotonic()
                try:
                    await stub.SendMessage(message(len(acked)), timeout=10)
                except grpc.aio.AioRpcError as exc:
                    refused = exc
                else:
                    acked.append(len(acked))
        assert time.monotonic() - started < 5, "refused only after waiting out much of its deadline"
        assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused
        assert error_info(refused).reason == "DISK_FULL"
        assert len(acked) > 50
        full = [r for r in caplog.records if "is full" in r.getMessage()]
        assert len(full) == 1, [r.getMessage() for r in full]
        if not forced("wal_index"):  # the fallback's estimate of pages moves the checkpoints
            assert f"during {during}" in full[0].getMessage()
        assert str(small_disk / "data") in full[0].getMessage()  # where to free space

        # Reads and the server's health go on; the readiness of writes says no.
        entity = (await stub.GetEntity(api.GetEntityRequest(ref=pb.EntityRef(type="t", id="e")))).entity
        assert entity.head_offset == 1 + len(acked)  # the spawn and every acknowledged message, no more
        page = await stub.ReadEvents(api.ReadEventsRequest(ref=pb.EntityRef(type="t", id="e"), limit=10))
        assert len(page.events) == 10
        for service, status in (("", SERVING), (SERVICE_NAME, SERVING), (WRITES_HEALTH_NAME, NOT_SERVING)):
            check = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert check.status == status, service
        for n in range(50):  # every write refused at once; logged no more
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.SendMessage(message(10_000 + n), timeout=10)
            assert error_info(caught.value).reason == "DISK_FULL"
        assert len([r for r in caplog.records if "is full" in r.getMessage()]) == 1

        # Space comes back: writes resume by themselves, and the readiness with them.
        watch = health.Watch(health_pb2.HealthCheckRequest(service=WRITES_HEALTH_NAME))
        assert (await watch.read()).status == NOT_SERVING
        filler.unlink()
        with anyio.fail_after(10):
            assert (await watch.read()).status == SERVING
        watch.cancel()
        resumed = [r for r in caplog.records if "writes resume:" in r.getMessage()]
        assert len(resumed) == 1
        for _ in range(20):
            await stub.SendMessage(message(len(acked)), timeout=10)
            acked.append(len(acked))
    await srv.stop()

    # Every acknowledged write is there after a restart, and nothing refused is.
    srv = await start_server(small_disk / "data")
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        texts: list[str] = []
        offset = 0
        while True:
            page = await stub.ReadEvents(
                api.ReadEventsRequest(ref=pb.EntityRef(type="t", id="e"), from_offset=offset, limit=1000)
            )
            texts.extend(e.message.text for e in page.events if e.type == "message")
            offset = page.next_offset
            if offset == page.head_offset:
                break
        assert [int(t.split()[0]) for t in texts] == acked
    await srv.stop()
