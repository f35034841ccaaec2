"""`electric export` / `electric import`: a SQLite store moved to PostgreSQL and back, exactly, and
what they refuse (a live server's data, a target that is not empty, a file cut short)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import grpc
import pytest
from electric_server.app import ElectricServer
from electric_server.store.base import Mutation, Store, TypeProfile, Write
from electric_server.store.postgres import PostgresStore
from electric_server.store.sqlite import SQLiteStore
from electric_server.tools.datadir import database_path
from google.protobuf import struct_pb2
from test_store_postgres import electric

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import State

if TYPE_CHECKING:
    from conftest import SeedState, StartServer

pytestmark = pytest.mark.anyio

ENTITIES = 60


async def fill(server: ElectricServer, seed_state: SeedState) -> list[tuple[str, str, str]]:
    """Entities in every state, with messages, signals and stored fields; returns the idempotency
    keys used, as (type, id, key)."""
    keys: list[tuple[str, str, str]] = []
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        for i in range(ENTITIES):
            ref = pb.EntityRef(type="agent" if i % 2 else "chat", id=f"e{i:03}")
            key = (ref.type, ref.id)
            profile = pb.Profile(grace_period={"seconds": 3600}) if i % 6 == 4 else None
            await stub.SpawnEntity(
                api.SpawnEntityRequest(ref=ref, profile=profile, idempotency_key=f"spawn-{i}")
            )
            await stub.SendMessage(
                api.SendMessageRequest(ref=ref, text=f"hello {i}", idempotency_key=f"m-{i}")
            )
            keys += [(*key, f"spawn-{i}"), (*key, f"m-{i}")]
            if i % 6 in (1, 2, 3, 4):
                await seed_state(server.store, key, State.RUNNING, cause="started")
            if i % 6 == 2:
                await seed_state(server.store, key, State.IDLE, cause="idle_timeout")

            async def signal(
                sig: int, payload: Any = None, *, ref: pb.EntityRef = ref, n: int = i, keys: list[Any] = keys
            ) -> None:
                name = f"sig-{n}-{sig}"
                request = api.SignalEntityRequest(ref=ref, signal=sig, reason="test", idempotency_key=name)
                if payload is not None:
                    request.payload.CopyFrom(struct_pb2.Value(string_value=payload))
                await stub.SignalEntity(request)
                keys.append((ref.type, ref.id, name))

            if i % 6 == 3:
                await signal(pb.SIGNAL_SIGSTOP)
            if i % 6 == 4:
                await signal(pb.SIGNAL_SIGTERM)  # stopping, with an hour's deadline
                if i % 12 == 10:
                    await seed_state(server.store, key, State.STOPPED, cause="cleanup_complete")
            if i % 6 == 5:
                await signal(pb.SIGNAL_SIGKILL)
            if i % 6 == 1:
                await signal(pb.SIGNAL_SIGUSR, "focus")
                await server.store.write(Write(key, _runtime_fields))
    await server.store.store_type_profile(TypeProfile("agent", "v1", 1, 5000, None))
    # Every field of a profile moves, its versioning and its children's policy too.
    await server.store.store_type_profile(
        TypeProfile("agent", "v2", 2, None, 7000, "pinned", 60_000, "detach")
    )
    async with grpc.aio.insecure_channel(server.address) as channel:
        # A child moves with its parent named (the cascade reaches it after an import too).
        child = api.SpawnEntityRequest(
            ref=pb.EntityRef(type="agent", id="child"), parent=pb.EntityRef(type="agent", id="e001")
        )
        await api_grpc.EntityServiceStub(channel).SpawnEntity(child)
    return keys


def _runtime_fields(current: Any, ctx: Any) -> Mutation:
    """What a runtime's bookkeeping leaves on a record: an epoch, a cursor, cancelled messages."""
    return Mutation(
        [],
        current.replace(
            lease_epoch=4, message_cursor=1, cursor_attempt=2, cancelled_messages=(3, 5), reload_pending=True
        ),
    )


async def contents(store: Store, keys: list[tuple[str, str, str]]) -> dict[str, Any]:
    """Everything the store holds that an export moves, read through the store's own API."""
    entities = await store.list_entities(None, [], None, 10_000)
    return {
        "entities": entities,
        "events": {e.ref: await store.read_events(e.ref, 0, 10_000) for e in entities},
        "keys": {k: await store.idempotent_response((k[0], k[1]), k[2]) for k in keys},
        "profiles": sorted(await store.type_profiles()),
        "head_txid": await store.head_txid(),
    }


async def read(store: Store, keys: list[tuple[str, str, str]]) -> dict[str, Any]:
    await store.open()
    try:
        return await contents(store, keys)
    finally:
        await store.close()


async def test_a_store_moves_to_postgresql_and_back_exactly(
    tmp_path: Path, postgres_url: str, start_server: StartServer, seed_state: SeedState
) -> None:
    server = await start_server(tmp_path / "sqlite")
    keys = await fill(server, seed_state)
    await server.stop(0)
    original = await read(SQLiteStore(database_path(tmp_path / "sqlite")), keys)
    assert {e.state for e in original["entities"]} == set(State)
    assert all(v is not None for v in original["keys"].values())

    exported = electric("export", str(tmp_path / "one.jsonl"), "--data", str(tmp_path / "sqlite"))
    assert exported.returncode == 0, exported.stderr
    assert "electric export: done:" in exported.stderr  # progress, on stderr
    counts = f"{len(original['entities'])} entities"
    assert counts in exported.stderr, exported.stderr
    assert "idempotency keys" in exported.stderr, exported.stderr
    assert exported.stdout.startswith(f"exported {len(original['profiles'])} type profile"), exported.stdout
    assert counts in exported.stdout, exported.stdout
    imported = electric("import", str(tmp_path / "one.jsonl"), "--database", postgres_url)
    assert imported.returncode == 0, imported.stderr
    verified = electric("verify", "--database", postgres_url)
    assert verified.returncode == 0, verified.stdout
    assert verified.stdout.endswith(": clean\n"), verified.stdout
    on_postgres = await read(PostgresStore(postgres_url), keys)
    assert on_postgres["head_txid"] >= original["head_txid"]
    assert {**on_postgres, "head_txid": 0} == {**original, "head_txid": 0}

    back = electric("export", str(tmp_path / "two.jsonl"), "--database", postgres_url)
    assert back.returncode == 0, back.stderr
    again = electric("import", str(tmp_path / "two.jsonl"), "--data", str(tmp_path / "again"))
    assert again.returncode == 0, again.stderr
    verified = electric("verify", "--data", str(tmp_path / "again"))
    assert verified.returncode == 0, verified.stdout
    assert verified.stdout.endswith(": clean\n"), verified.stdout
    assert await read(SQLiteStore(database_path(tmp_path / "again")), keys) == {
        **original,
        "head_txid": on_postgres["head_txid"],
    }
    one, two = ((tmp_path / f).read_text().splitlines() for f in ("one.jsonl", "two.jsonl"))
    assert one[1:] == two[1:], "the same records, in the same order, both ways"
    assert json.loads(one[0])["source"] == "sqlite"
    assert json.loads(two[0])["source"] == "postgresql"


@pytest.mark.parametrize("target", ["sqlite", "postgres"])
async def test_new_txids_continue_above_the_imported_ones(
    tmp_path: Path, postgres_url: str, start_server: StartServer, seed_state: SeedState, target: str
) -> None:
    server = await start_server(tmp_path / "sqlite")
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        for i in range(5):
            await stub.SpawnEntity(api.SpawnEntityRequest(ref=pb.EntityRef(type="t", id=f"{i}")))
    head = await server.store.head_txid()
    await server.stop(0)
    assert electric("export", str(tmp_path / "x.jsonl"), "--data", str(tmp_path / "sqlite")).returncode == 0
    where = ["--database", postgres_url] if target == "postgres" else ["--data", str(tmp_path / "new")]
    assert electric("import", str(tmp_path / "x.jsonl"), *where).returncode == 0
    moved = await start_server(tmp_path / "new", database_url=postgres_url if target == "postgres" else None)
    async with grpc.aio.insecure_channel(moved.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=pb.EntityRef(type="t", id="after")))
        events = await stub.ReadEvents(api.ReadEventsRequest(ref=pb.EntityRef(type="t", id="after")))
    assert events.events[0].headers.txid > head


async def test_export_refuses_a_live_servers_data(
    tmp_path: Path, postgres_url: str, start_server: StartServer
) -> None:
    await start_server(tmp_path / "live")
    refused = electric("export", str(tmp_path / "x.jsonl"), "--data", str(tmp_path / "live"))
    assert refused.returncode == 2
    assert "in use by another process (electric server" in refused.stderr
    await start_server(tmp_path / "pg", database_url=postgres_url)
    (tmp_path / "x.jsonl").write_text(  # an empty store's export
        '{"electric_export": 1, "source": "sqlite", "exported_at_ms": 0, "head_txid": 0}\n'
        '{"end": {"type_profiles": 0, "entities": 0, "events": 0, "idempotency": 0}}\n'
    )
    for command in (["export", str(tmp_path / "y.jsonl")], ["import", str(tmp_path / "x.jsonl")]):
        refused = electric(*command, "--database", postgres_url)
        assert refused.returncode == 2, refused.stderr
        assert "is in use" in refused.stderr, refused.stderr
        assert "offline" in refused.stderr, refused.stderr
    assert not (tmp_path / "y.jsonl").exists()


async def test_import_refuses_a_target_that_is_not_empty_or_a_file_cut_short(
    tmp_path: Path, postgres_url: str, start_server: StartServer
) -> None:
    server = await start_server(tmp_path / "sqlite")
    async with grpc.aio.insecure_channel(server.address) as channel:
        await api_grpc.EntityServiceStub(channel).SpawnEntity(
            api.SpawnEntityRequest(ref=pb.EntityRef(type="t", id="1"))
        )
    await server.stop(0)
    assert electric("export", str(tmp_path / "x.jsonl"), "--data", str(tmp_path / "sqlite")).returncode == 0

    refused = electric("import", str(tmp_path / "x.jsonl"), "--data", str(tmp_path / "sqlite"))
    assert refused.returncode == 2, refused.stderr
    assert "it is not empty" in refused.stderr, refused.stderr
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's own")
    refused = electric("import", str(tmp_path / "x.jsonl"), "--data", str(tmp_path / "mine"))
    assert "it is not empty (it holds notes.txt)" in refused.stderr, refused.stderr
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"], "no LOCK left there"

    lines = (tmp_path / "x.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "short.jsonl").write_text("".join(lines[:-1]))
    refused = electric("import", str(tmp_path / "short.jsonl"), "--database", postgres_url)
    assert refused.returncode == 2, refused.stderr
    assert "cut short" in refused.stderr, refused.stderr
    conn = await asyncpg.connect(postgres_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM entities") == 0, "nothing was imported"
        await conn.execute("INSERT INTO type_profiles VALUES ('t', 'v', 1, NULL, NULL)")
    finally:
        await conn.close()
    refused = electric("import", str(tmp_path / "x.jsonl"), "--database", postgres_url)
    assert refused.returncode == 2
    assert "it is not empty (its type_profiles hold rows)" in refused.stderr


@pytest.mark.parametrize(
    ("first_line", "says"),
    [
        (
            '{"electric_export": 2, "source": "sqlite", "exported_at_ms": 0, "head_txid": 0}',
            "this electric reads format 1",
        ),
        ('{"hello": 1}', "not an electric export"),
        ('{"electric_export": 1, "exported_at_ms": 0}', "line 1: the header lacks source, head_txid"),
        (
            '{"electric_export": 1, "source": "sqlite", "exported_at_ms": 0, "head_txid": "x"}',
            "line 1: a malformed header: its head_txid is 'x', not a 64-bit whole number",
        ),
        ('\udcff{"electric_export": 1}', "line 1 is not UTF-8 text"),
    ],
    ids=["format-2", "not-an-export", "header-short", "header-text-txid", "binary"],
)
def test_import_refuses_a_file_it_cannot_read_and_writes_nothing(
    tmp_path: Path, first_line: str, says: str
) -> None:
    # A lone surrogate stands for a byte that is not UTF-8 (written back as that byte).
    (tmp_path / "x.jsonl").write_bytes((first_line + "\n").encode("utf-8", "surrogateescape"))
    refused = electric("import", str(tmp_path / "x.jsonl"), "--data", str(tmp_path / "new"))
    assert refused.returncode == 2
    assert says in refused.stderr, refused.stderr
    assert not database_path(tmp_path / "new").exists()


def _export_lines() -> list[Any]:
    """A small valid export (one entity, two events, a key), its lines as JSON values."""
    import io

    from electric_server.store.base import EntityRecord, StoredEvent
    from electric_server.tools import export_file

    out = io.StringIO()
    writer = export_file.Writer(out, export_file.Header("sqlite", 1, 2))
    writer.entity(EntityRecord("t", "e1", State.SPAWNING, 30_000, 60_000, 1, 1, 2, False, None, 2))
    writer.event("t", "e1", StoredEvent(0, "state", "state_1", 1, 1, 1, b"s"))
    writer.event("t", "e1", StoredEvent(1, "message", "msg_2", 1, 1, 2, b"m"))
    writer.idempotency(export_file.IdempotencyRow("t", "e1", "k", b"h", b"r", 1))
    writer.end()
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.mark.parametrize(
    ("line", "edit", "says"),
    [
        (2, lambda o: o["event"].__setitem__(3, "st\x00ate"), "line 3: a malformed event: its kind is"),
        (1, lambda o: o["entity"].__setitem__("head_offset", "2"), "its head_offset is '2', not a 64-bit"),
        (1, lambda o: o["entity"].__setitem__("closed", 0), "its closed is 0, not true or false"),
        (1, lambda o: o["entity"].__setitem__("id", "a/b"), "its id 'a/b' is not a name"),
        (2, lambda o: o["event"].__setitem__(2, True), "its offset is True"),
        (2, lambda o: o["event"].__setitem__(7, 2**63), "its txid is 9223372036854775808"),
        (4, lambda o: o["idempotency"].__setitem__(2, "k\x00"), "a malformed idempotency: its key"),
        (3, lambda o: o["event"].pop(4), "6 values, not the 7 of offset"),
        (1, lambda o: o.__setitem__("entity", 5), "a malformed entity: it is int 5, not an object"),
        (1, lambda o: o["entity"].pop("txid"), "a malformed entity: it lacks txid\n"),
        (1, lambda o: o["entity"].__setitem__("colour", "red"), "entity: an entity has no field 'colour'\n"),
    ],
    ids=[
        "nul-kind",
        "text-offset",
        "int-bool",
        "bad-name",
        "bool-offset",
        "txid-past-int64",
        "nul-key",
        "short",
        "entity-not-object",
        "entity-lacks-a-field",
        "entity-has-one-more",
    ],
)
@pytest.mark.parametrize("target", ["sqlite", "postgres"])
async def test_import_refuses_a_record_of_the_wrong_shape_on_both_stores(
    tmp_path: Path, postgres_url: str, target: str, line: int, edit: Any, says: str
) -> None:
    """A hand-edited or damaged record is refused by its line, the same way on both stores: SQLite
    would keep a text where a number goes, PostgreSQL's text holds no NUL."""
    lines = _export_lines()
    edit(lines[line])
    (tmp_path / "x.jsonl").write_text("".join(json.dumps(o) + "\n" for o in lines))
    where = ["--database", postgres_url] if target == "postgres" else ["--data", str(tmp_path / "new")]
    refused = electric("import", str(tmp_path / "x.jsonl"), *where)
    assert refused.returncode == 2, refused.stderr
    assert "nothing was imported" in refused.stderr
    assert says in refused.stderr, refused.stderr
    if target == "sqlite":
        assert not (tmp_path / "new").exists(), "the directory it made is gone again"
    else:
        conn = await asyncpg.connect(postgres_url)
        try:
            assert await conn.fetchval("SELECT count(*) FROM entities") == 0
        finally:
            await conn.close()


def test_import_reads_an_end_line_written_before_entities_was_spelled_so(tmp_path: Path) -> None:
    lines = _export_lines()
    end = lines[-1]["end"]
    assert "entities" in end
    end["entitys"] = end.pop("entities")  # what the export wrote until 2026-12-03
    (tmp_path / "x.jsonl").write_text("".join(json.dumps(o) + "\n" for o in lines))
    moved = electric("import", str(tmp_path / "x.jsonl"), "--data", str(tmp_path / "new"))
    assert moved.returncode == 0, moved.stderr
    assert "1 entity, 2 events" in moved.stdout + moved.stderr


async def test_export_to_a_missing_directory_or_a_full_disk_is_one_line_and_leaves_nothing(
    tmp_path: Path, start_server: StartServer
) -> None:
    """Where the file cannot be written, the export says so on one line, exit 2 (as `backup`
    does), and leaves no file, whole or partial: a missing directory is seen before the store is
    read, a full disk (a real one: a 64 KiB tmpfs) when it fills."""
    from test_disk_full import mount_tmpfs, unmount

    server = await start_server(tmp_path / "data")
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        for i in range(40):
            ref = pb.EntityRef(type="t", id=f"e{i}")
            await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref))
            await stub.SendMessage(api.SendMessageRequest(ref=ref, text="x" * 4000))
    await server.stop(0)
    missing = electric("export", str(tmp_path / "no" / "x.jsonl"), "--data", str(tmp_path / "data"))
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr == f"electric export: no directory {tmp_path / 'no'} to write x.jsonl in\n"
    disk = tmp_path / "disk"
    mount_tmpfs(disk, "64k")
    try:
        full = electric("export", str(disk / "x.jsonl"), "--data", str(tmp_path / "data"))
        assert full.returncode == 2, full.stderr
        assert (
            f"cannot write {disk / 'x.jsonl'}: No space left on device; nothing was exported" in full.stderr
        )
        assert "Traceback" not in full.stderr
        assert list(disk.iterdir()) == []
    finally:
        unmount(disk)
