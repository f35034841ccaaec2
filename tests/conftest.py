"""Shared fixtures: a real electric server on loopback with a real SQLite file.

Async tests use anyio's pytest plugin on asyncio (``pytestmark = pytest.mark.anyio``).

- ``server``: an in-process ``ElectricServer`` on a free port, data in tmp_path.
- ``stub``: a grpc.aio EntityService stub connected to it.
- ``door`` / ``http``: a server with its HTTP door on a free port, and an httpx
  client of that door.
- ``start_server``: start more in-process servers (custom config, same data dir).
- ``server_process``: ``electric server`` as a real OS process, for crash
  (kill -9) and signal tests; it waits for the "listening" line on stdout.
- ``db_rows``: every row of a server's SQLite file, to prove a refused call
  wrote nothing.
- ``electric`` / ``client``: a ``TestServer`` on its own thread (its lease TTL and
  heartbeat from ``leases``: short, for the runtime's tests, unless a directory
  overrides it) and an ``AsyncClient`` of it.
- ``live`` / ``sdk``: a ``TestServer`` for a whole module (the CLI's tests run
  commands against it) and a sync ``Client`` of it.
- ``postgres_url``: a fresh PostgreSQL database of the test's own (postgres_dbs.py).
- ``database_url``: the store the servers above use: None (the data
  directory's SQLite) unless the test is marked ``both_stores``, which runs
  it once on each store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import httpx
import postgres_dbs
import pytest
from anyio._backends import _asyncio as anyio_asyncio
from electric_server.app import ElectricServer, ServerConfig

from electric_sdk import AsyncClient, Client
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk.testing import TestServer


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _stale_grpc_completion(context: dict[str, Any]) -> bool:
    """grpc.aio's one completion queue serves every event loop a process has used, and each
    test runs on a new loop. A call an earlier test left behind that completes now is handed
    to its own loop, closed with that test, from a callback of this one: "Event loop is
    closed", raised in grpc's ``PollerCompletionQueue._handle_events``. Nobody can observe that
    call any more (its loop is gone), so it is no failure of the test that happens to be running
    (grpc/grpc#25364 is the same queue shared by several loops)."""
    exc = context.get("exception")
    return (
        isinstance(exc, RuntimeError)
        and str(exc) == "Event loop is closed"
        and "PollerCompletionQueue" in repr(context.get("handle"))
    )


def _ignore_stale_grpc_completions() -> None:
    """anyio's test runner turns every exception a loop callback raises into the test's failure;
    let the stale grpc completions above through as a log line instead."""
    runner = getattr(anyio_asyncio, "TestRunner", None)
    original = getattr(runner, "_exception_handler", None)
    if runner is None or original is None:  # another anyio: its runner reports them as it does
        return

    def handler(self: Any, loop: Any, context: dict[str, Any]) -> None:
        if _stale_grpc_completion(context):
            logging.getLogger("tests").warning("a stale grpc completion of an earlier test's loop")
            return
        original(self, loop, context)

    runner._exception_handler = handler


_ignore_stale_grpc_completions()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "database_url" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_stores"):
        metafunc.parametrize("database_url", ["sqlite", "postgres"], indirect=True)


@pytest.fixture(scope="session")
def postgres_databases() -> Iterator[postgres_dbs.Databases]:
    databases = postgres_dbs.Databases()
    try:
        databases.open()
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        postgres_dbs.unavailable(f"{type(exc).__name__}: {exc}")
    yield databases
    databases.close()


@pytest.fixture
def postgres_url(postgres_databases: postgres_dbs.Databases) -> Iterator[str]:
    """A database of its own for the test, dropped (WITH (FORCE)) at teardown. A test that also
    starts servers on it names this fixture before ``start_server``: fixtures end in the reverse
    order, so its servers stop before their database goes (not a fault the test is about)."""
    url = postgres_databases.clone()
    yield url
    postgres_databases.drop(url)


@pytest.fixture
async def stores(postgres_url: str) -> AsyncIterator[tuple[Any, Any]]:
    """Two PostgresStores on one database: two processes, nothing in memory in common."""
    from electric_server.store.postgres import PostgresStore

    a, b = PostgresStore(postgres_url), PostgresStore(postgres_url)
    await a.open()
    await b.open()
    yield a, b
    await a.close()
    await b.close()


@pytest.fixture
async def admin(postgres_url: str) -> AsyncIterator[Any]:
    """The test's own connection to the database: to hold row locks and end the store's connections."""
    conn = await asyncpg.connect(postgres_url)
    yield conn
    await conn.close()


@pytest.fixture
def database_url(request: pytest.FixtureRequest) -> str | None:
    if getattr(request, "param", "sqlite") == "sqlite":
        return None
    url: str = request.getfixturevalue("postgres_url")
    return url


@dataclass(frozen=True)
class Leases:
    """The ``electric`` server's lease TTL and heartbeat interval."""

    ttl_ms: int
    heartbeat_ms: int


@pytest.fixture
def leases() -> Leases:
    """Short leases, for the runtime's tests of a lapsing lease. A directory whose tests are not
    about lapsing overrides this with longer ones: on a loaded machine a worker's heartbeats can
    come late enough for a 0.6 s lease to lapse mid-test."""
    return Leases(ttl_ms=600, heartbeat_ms=100)


@pytest.fixture
def electric(tmp_path: Path, database_url: str | None, leases: Leases) -> Iterator[TestServer]:
    with TestServer(
        tmp_path / "electric",
        lease_ttl_ms=leases.ttl_ms,
        heartbeat_interval_ms=leases.heartbeat_ms,
        database_url=database_url,
    ) as server:
        yield server


@pytest.fixture
async def client(electric: TestServer) -> AsyncIterator[AsyncClient]:
    async with electric.async_client() as c:
        yield c


@pytest.fixture(scope="module")
def live() -> Iterator[TestServer]:
    with TestServer() as server:
        yield server


@pytest.fixture(scope="module")
def sdk(live: TestServer) -> Client:
    return live.client()


StartServer = Callable[..., Awaitable[ElectricServer]]


@pytest.fixture
async def start_server(tmp_path: Path, database_url: str | None) -> AsyncIterator[StartServer]:
    """Start in-process servers (on the test's ``database_url``); each is stopped at teardown if still running."""
    started: list[ElectricServer] = []

    async def start(data_dir: Path | None = None, **config: Any) -> ElectricServer:
        cfg = ServerConfig(
            listen=config.pop("listen", "127.0.0.1:0"),
            data_dir=data_dir or tmp_path / "data",
            drain_grace_s=config.pop("drain_grace_s", 1.0),
            database_url=config.pop("database_url", database_url),
            **config,
        )
        srv = ElectricServer(cfg)
        await srv.start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        await srv.stop(0)


@pytest.fixture
async def server(start_server: StartServer) -> ElectricServer:
    return await start_server()


@pytest.fixture
async def channel(server: ElectricServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(server.address) as ch:
        yield ch


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> api_grpc.EntityServiceStub:
    return api_grpc.EntityServiceStub(channel)


@pytest.fixture
async def door(start_server: StartServer) -> ElectricServer:
    # NORMAL: no fsync per commit, so tests of hundreds of writes stay quick.
    return await start_server(http="127.0.0.1:0", synchronous="NORMAL")


@pytest.fixture
async def http(door: ElectricServer) -> AsyncIterator[httpx.AsyncClient]:
    assert door.http is not None
    async with httpx.AsyncClient(base_url=door.http.address, timeout=30) as c:
        yield c


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    address: str
    data_dir: Path
    lines: list[str] = field(default_factory=list)

    def send(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout)


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Run `electric server` as a real process; returns once it listens. ``data=False``: no
    --data (the server picks its store itself), run in ``cwd`` with ``env``."""
    procs: list[subprocess.Popen[str]] = []

    def start(
        data_dir: Path | None = None,
        *extra: str,
        port: int = 0,
        data: bool = True,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> ServerProcess:
        where = data_dir or tmp_path / "data"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "electric_sdk.cli.main",
                "server",
                "--listen",
                f"127.0.0.1:{port}",
                *(["--data", str(where)] if data else []),
                "--drain-grace",
                "2s",
                *extra,
            ],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            match = re.search(r"electric server listening on (\S+)", line)
            if match and not line.startswith("20"):  # the plain stdout line, not the log line
                return ServerProcess(proc, match.group(1), where, lines)
        raise AssertionError("server exited before listening:\n" + "".join(lines))

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        if proc.stdout:
            proc.stdout.close()


DbRows = dict[str, list[tuple[Any, ...]]]


def read_database(path: Path) -> DbRows:
    """Every row of every table, through a separate read-only SQLite connection.

    Comparing two of these proves that a refused call wrote nothing at all:
    no entity, event, idempotency record or txid counter changed.
    """
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        tables = [
            str(row[0])
            for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        ]
        return {table: conn.execute(f'SELECT * FROM "{table}"').fetchall() for table in tables}


@pytest.fixture
def db_rows() -> Callable[[ElectricServer], DbRows]:
    """``db_rows(server)``: the server's whole database, to compare before/after a call."""

    def read(srv: ElectricServer) -> DbRows:
        rows = read_database(srv.config.database)
        assert {"entities", "events"} <= rows.keys(), f"unexpected schema: {sorted(rows)}"
        return rows

    return read


SeedState = Callable[..., Awaitable[Any]]


@pytest.fixture
def seed_state() -> SeedState:
    """Move an entity to a state through the store's own write API (no runtime needed).

    ``await seed_state(store, ("type", "id"), State.RUNNING, cause="started")`` appends one
    ``state`` event (previous state → ``state``, with ``cause``; ``deadline_ms`` for `stopping`)
    and writes the entity record in the same transaction, exactly as the server's own writes do.
    Returns the committed ``EntityRecord``. Use real runtime causes ("started", "idle_timeout")
    where a test later replays the stream with ``electric verify``.
    """
    from electric_server.store.base import EntityRecord, Mutation, NewEvent, Store, Write, WriteContext
    from google.protobuf import timestamp_pb2

    from electric_sdk._proto.electric.v1 import types_pb2 as pb
    from electric_sdk.lifecycle import State

    async def seed(
        store: Store,
        ref: tuple[str, str],
        state: State,
        *,
        cause: str = "started",
        deadline_ms: int | None = None,
    ) -> EntityRecord:
        def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
            assert current is not None, f"seed_state: no entity {ref}"
            value = pb.StateValue(
                state=pb.State.Value(f"STATE_{state.name}"),
                previous_state=pb.State.Value(f"STATE_{current.state.name}"),
                cause=cause,
            )
            if deadline_ms is not None:
                value.deadline.CopyFrom(
                    timestamp_pb2.Timestamp(seconds=deadline_ms // 1000, nanos=deadline_ms % 1000 * 1_000_000)
                )
            body = pb.Event(state=value).SerializeToString(deterministic=True)
            event = NewEvent("state", f"seed_{ctx.txid}", pb.OPERATION_INSERT, body)
            record = current.replace(state=state, stopping_deadline_ms=deadline_ms, closed=state.terminal)
            return Mutation([event], record)

        outcome = await store.write(Write(ref, decide))
        assert outcome.commit is not None
        assert outcome.commit.after is not None
        after: EntityRecord = outcome.commit.after
        return after

    return seed
