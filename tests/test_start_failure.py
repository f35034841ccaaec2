"""A start that a component refuses leaves nothing behind: no task, no open file, no lock.

``ElectricServer.start`` enters its components in one exit stack; the one that refuses unwinds
exactly what started before it. Each case here makes one component refuse (the store on a
damaged file, the gRPC port taken, the database unreachable, the HTTP port taken), then checks
that no task of the server is left on the loop beside the test's own, that every file descriptor
the start opened is closed again, and that the data directory's lock is free.

One server starts and stops first, on the same loop: what a process opens once and keeps (grpc's
poller, the modules' files) is then open before the count, as it would be for any server.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from electric_server import ConfigError, DamagedStore, DatabaseUnavailable, StorageFault
from electric_server.app import ElectricServer, ServerConfig
from electric_server.tools.datadir import DataDirLock

pytestmark = pytest.mark.anyio


def open_files() -> dict[int, str]:
    """This process's open file descriptors, and what each is."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        with_target = Path("/proc/self/fd", name)
        try:
            found[int(name)] = os.readlink(with_target)
        except FileNotFoundError:  # the directory's own descriptor, closed by now
            continue
    return found


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else listens on (opened before the count: the test's own)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on: bound and let go, so the kernel gave it to nobody since."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def config(data_dir: Path, **overrides: Any) -> ServerConfig:
    return ServerConfig(**{"listen": "127.0.0.1:0", "data_dir": data_dir, "drain_grace_s": 0.5, **overrides})


async def refused_start(cfg: ServerConfig) -> BaseException:
    """Start a server that must refuse; its error, and no reference to the server left."""
    server = ElectricServer(cfg)
    try:
        await server.start()
    except (ConfigError, StorageFault) as exc:
        chain: list[BaseException | None] = [exc]
        seen: set[int] = set()
        while chain:  # their frames would keep the server alive, and grpc's with it
            link = chain.pop()
            if link is not None and id(link) not in seen:
                seen.add(id(link))
                link.__traceback__ = None
                chain += [link.__cause__, link.__context__]
        return exc
    await server.stop(0)
    raise AssertionError("the server started")


async def assert_leaves_nothing(cfg: ServerConfig, tmp_path: Path, refusal: type[BaseException]) -> str:
    """Start a good server and stop it, then count; start ``cfg``, which must refuse with
    ``refusal``; nothing it opened or started is left. Returns the refusal's message."""
    warm = ElectricServer(config(tmp_path / "warm", http="127.0.0.1:0"))
    await warm.start()
    await warm.stop(0)
    del warm
    gc.collect()
    tasks = asyncio.all_tasks()
    files = open_files()

    error = await refused_start(cfg)

    assert isinstance(error, refusal), repr(error)
    gc.collect()  # grpc's server keeps its descriptors until it is collected, started or not
    left = {task for task in asyncio.all_tasks() - tasks if not task.done()}
    assert not left, f"tasks left behind: {left}"
    opened = {fd: what for fd, what in open_files().items() if files.get(fd) != what}
    assert not opened, f"files left open: {opened}"
    DataDirLock.acquire(cfg.data_dir, "the test").release()  # free: no holder left
    return str(error)


async def test_a_store_that_refuses_leaves_nothing_behind(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "electric.db").write_bytes(b"not a database, whatever its name says " * 200)
    message = await assert_leaves_nothing(config(data, http="127.0.0.1:0"), tmp_path, DamagedStore)
    assert "electric.db" in message


async def test_a_taken_grpc_port_leaves_nothing_behind(tmp_path: Path, taken_port: int) -> None:
    cfg = config(tmp_path / "data", listen=f"127.0.0.1:{taken_port}", http="127.0.0.1:0")
    message = await assert_leaves_nothing(cfg, tmp_path, ConfigError)
    assert f"cannot listen on 127.0.0.1:{taken_port}" in message


async def test_an_unreachable_database_leaves_nothing_behind(tmp_path: Path, closed_port: int) -> None:
    pytest.importorskip("asyncpg")
    url = f"postgresql://postgres@127.0.0.1:{closed_port}/test"
    cfg = config(tmp_path / "data", database_url=url, http="127.0.0.1:0")
    message = await assert_leaves_nothing(cfg, tmp_path, DatabaseUnavailable)
    assert f"127.0.0.1:{closed_port}" in message


async def test_a_taken_http_port_leaves_nothing_behind(tmp_path: Path, taken_port: int) -> None:
    cfg = config(tmp_path / "data", http=f"127.0.0.1:{taken_port}")
    message = await assert_leaves_nothing(cfg, tmp_path, ConfigError)
    assert f"cannot listen on 127.0.0.1:{taken_port} for HTTP" in message
