"""A disk that fails a sync stops the server: every write refused, one log line, exit 74.

The failing disk is real: an ext4 file system on a loop device whose sparse
backing file lives on a small tmpfs. Once the tmpfs is full the device fails
its writes, and the next sync of a file with pages on them reports it, as a
dying disk would. Setting it up needs root (mount, losetup, mkfs.ext4): outside
CI the test is skipped where it cannot, never in CI.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest
from helpers import error_info

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.cli import exit_codes

pytestmark = pytest.mark.anyio


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False)


@pytest.fixture
def failing_disk(tmp_path: Path) -> Iterator[Path]:
    """A file system whose device fails writes once 3 MB of it were written (see the module docstring)."""
    backing, mountpoint = tmp_path / "backing", tmp_path / "disk"
    backing.mkdir()
    mountpoint.mkdir()
    undo: list[list[str]] = []
    why = ""
    try:
        missing = [tool for tool in ("mount", "losetup", "mkfs.ext4") if shutil.which(tool) is None]
        why = f"{', '.join(missing)} not found" if missing else _set_up(backing, mountpoint, undo)
        if why:
            why = f"cannot set up a failing disk (needs root and loop devices): {why}"
            if os.environ.get("CI") == "true":
                pytest.fail(why)
            pytest.skip(why)
        yield mountpoint
    finally:
        for command in reversed(undo):
            _run(*command)


def _set_up(backing: Path, mountpoint: Path, undo: list[list[str]]) -> str:
    steps = _run("mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(backing))
    if steps.returncode:
        return steps.stderr.strip()
    undo.append(["umount", "--lazy", str(backing)])
    image = backing / "disk.img"
    with image.open("wb") as f:
        f.truncate(256 * 1024 * 1024)  # sparse: the tmpfs holds only what was written
    loop = _run("losetup", "--find", "--show", str(image))
    if loop.returncode:
        return loop.stderr.strip()
    device = loop.stdout.strip()
    undo.append(["losetup", "--detach", device])
    # No journal and few inodes: the file system itself writes little to the device.
    mkfs = _run("mkfs.ext4", "-q", "-F", "-N", "256", "-O", "^has_journal,^resize_inode", device)
    if mkfs.returncode:
        return mkfs.stderr.strip()
    mounted = _run("mount", device, str(mountpoint))
    if mounted.returncode:
        return mounted.stderr.strip()
    undo.append(["umount", "--lazy", str(mountpoint)])
    return ""


async def test_a_failed_sync_refuses_every_write_and_the_server_exits_74(
    failing_disk: Path, server_process: Callable[..., Any]
) -> None:
    """(``failing_disk`` first: it is taken down after the server process.)"""
    srv = server_process(failing_disk / "data")
    text = os.urandom(1500).hex()
    acked = 0
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        ref = pb.EntityRef(type="t", id="e")
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref))
        with anyio.fail_after(60):
            while True:
                try:
                    await stub.SendMessage(api.SendMessageRequest(ref=ref, text=text), timeout=10)
                except grpc.aio.AioRpcError as exc:
                    refused = exc
                    break
                acked += 1
    assert acked > 10
    assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused
    assert error_info(refused).reason == "STORAGE_FAILED"
    assert await anyio.to_thread.run_sync(srv.wait) == exit_codes.STORAGE_FAILED
    assert srv.proc.stdout is not None
    output = "".join(srv.lines) + await anyio.to_thread.run_sync(srv.proc.stdout.read)
    critical = re.findall(r"CRITICAL .*", output)
    assert len(critical) == 1, output  # logged once, saying what happened and what to do
    assert "acknowledges no more writes" in critical[0]
    assert re.search(r"during (a WAL sync|a checkpoint)", critical[0]), critical[0]
    assert str(failing_disk / "data") in critical[0]
    assert re.search(r"^electric server: the storage of .* failed", output, re.MULTILINE), output
    assert "Traceback" not in output
