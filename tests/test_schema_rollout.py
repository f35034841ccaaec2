"""A rolling deploy's schema change: version N+1 expands the schema (a nullable column) while a
server of version N runs on the database; both versions serve side by side; a server of version N
started afterwards refuses the newer schema, naming both versions (docs/scaling.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import postgres_dbs
import pytest
from electric_server.store.base import Ref
from electric_server.store.postgres import PostgresStore
from electric_server.store.postgres import schema as postgres_schema
from electric_server.store.postgres.schema import SCHEMA_VERSION
from test_store import check_stream, committed, note, spawn
from test_store_postgres import electric

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).parents[1]
# Version N+1, expand only: what N's statements never name, they never miss.
EXPAND = "ALTER TABLE entities ADD COLUMN owner text"


@pytest.fixture
def server_n(tmp_path: Path, postgres_url: str, server_process: Callable[..., Any]) -> str:
    """`electric server` of this code (version N) on the database, as a process; its address."""
    address: str = server_process(tmp_path / "n", "--database", postgres_url).address
    return address


async def serves(address: str, id: str) -> None:
    """A spawn, a signal and a read through the server at ``address``."""
    ref = pb.EntityRef(type="agent", id=id)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref))
        await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGSTOP, reason="r"))
        events = await stub.ReadEvents(api.ReadEventsRequest(ref=ref))
    assert [e.type for e in events.events] == ["state", "signal"]


async def test_versions_n_and_n_plus_1_serve_one_database_side_by_side(
    server_n: str, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await serves(server_n, "before")
    monkeypatch.setitem(postgres_schema.VERSIONS, SCHEMA_VERSION + 1, EXPAND)
    n_plus_1 = PostgresStore(postgres_url)  # a replica of N+1: opening applies its version
    await n_plus_1.open()
    try:
        admin = await asyncpg.connect(postgres_url)
        try:
            assert await admin.fetchval("SELECT max(version) FROM electric_schema") == SCHEMA_VERSION + 1
        finally:
            await admin.close()
        # N's pooled connections, with the statements they prepared before the change, go on: N
        # names its columns, so a column it does not know changes none of its statements' results.
        await serves(server_n, "during")
        ref: Ref = ("agent", "during")
        committed(await n_plus_1.write(note(ref, "from N+1")))  # N+1 writes N's rows
        committed(await n_plus_1.write(spawn(("agent", "by_n_plus_1"))))
        await check_stream(n_plus_1, ref)
        await serves(server_n, "after")
    finally:
        await n_plus_1.close()


def test_a_server_refuses_a_schema_newer_than_it_knows(tmp_path: Path, postgres_url: str) -> None:
    async def expand() -> None:
        admin = await asyncpg.connect(postgres_url)
        try:
            await admin.execute(EXPAND)
            await admin.execute("INSERT INTO electric_schema (version) VALUES ($1)", SCHEMA_VERSION + 1)
        finally:
            await admin.close()

    postgres_dbs.run(expand)
    result = electric(
        "server", "--listen", "127.0.0.1:0", "--data", str(tmp_path), "--database", postgres_url
    )
    assert result.returncode == 2, result.stderr
    assert (
        f"the database's schema is version {SCHEMA_VERSION + 1}, newer than this electric knows "
        f"({SCHEMA_VERSION})" in result.stderr
    )
