"""No error ends the store's writer silently, and a disk that fails a sync stops the server with 74.

The failing disk is real: an ext4 file system on a loop device whose sparse
backing file lives on a small tmpfs. Once the tmpfs is full the device fails
its writes, and the next sync of a file with pages on them reports it, as a
dying disk would. Setting it up needs root (mount, losetup, mkfs.ext4): outside
CI the test is skipped where it cannot, never in CI.
"""

from __future__ import annotations

import asyncio
import logging
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
from electric_server import entity_writes
from electric_server.store.base import Commit, EntityRecord, Mutation, NewEvent, Ref, Write, WriteContext
from electric_server.store.sqlite import SQLiteStore
from helpers import error_info

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.cli import exit_codes

pytestmark = pytest.mark.anyio


def spawn(ref: Ref) -> Write:
    return Write(ref, entity_writes.spawn(ref, 30_000, 60_000))


def note(ref: Ref) -> Write:
    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        assert current is not None
        return Mutation([NewEvent("note", f"note_{ctx.txid}", pb.OPERATION_INSERT, b"n")], current)

    return Write(ref, decide)


async def test_a_subscriber_that_raises_stops_neither_the_writer_nor_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SQLiteStore(tmp_path / "electric.db")
    await store.open()
    try:
        seen: list[Ref] = []

        def broken(commit: Commit) -> None:
            raise ValueError("a bug in a subscriber")

        store.hub.subscribe_all(broken)
        store.hub.subscribe_all(lambda commit: seen.append(commit.ref))
        a, b = ("t", "a"), ("t", "b")
        for outcome in await asyncio.wait_for(
            store.write_many([spawn(a), spawn(b)]), 10
        ):  # the writer task's
            assert not isinstance(outcome, BaseException)
        failures = [r for r in caplog.records if "subscriber" in r.getMessage()]
        assert failures
        assert all(r.exc_info is not None for r in failures)  # with its traceback
        for outcome in await asyncio.wait_for(store.write_many([note(a), note(b)]), 10):
            assert not isinstance(outcome, BaseException)
        assert seen == [a, b, a, b]
    finally:
        await store.close()


async def test_an_unexpected_error_in_a_batch_fails_that_batch_loudly_and_the_writer_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SQLiteStore(tmp_path / "electric.db")
    await store.open()
    try:
        a = ("t", "a")

        def encode(commit: Commit) -> bytes:
            raise TypeError("a bug in a response's encoder")

        broken = Write(a, entity_writes.spawn(a, 30_000, 60_000), encode=encode)
        with pytest.raises(TypeError, match="encoder"):  # one batch, one transaction: all of it rolled back
            await asyncio.wait_for(store.write_many([broken, spawn(("t", "other"))]), 10)
        logged = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info is not None]
        assert len(logged) == 1
        assert "during a commit" in logged[0].getMessage()
        assert await store.get_entity(a) is None
        assert await store.get_entity(("t", "other")) is None
        for outcome in await asyncio.wait_for(store.write_many([spawn(a), note(a)]), 10):
            assert not isinstance(outcome, BaseException)
        assert (await store.get_entity(a)) is not None
    finally:
        await store.close()


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
