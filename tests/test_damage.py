"""A damaged store is refused at start (exit 65), a torn tail is not, and no txid is handed out twice.

Each test writes acknowledged messages to a real `electric server` process,
kills it with SIGKILL (an unclean stop: the WAL holds the last commits), then
damages the files the way a disk or an operator could: one flipped byte in
the middle of the WAL, a scrambled WAL header, a deleted WAL, a database
file truncated to half. SQLite alone opens every one of them without a word
and drops acknowledged writes; the server must refuse to start and say what
is damaged and what to do, `electric verify` must report it (exit 65, no
traceback), and `--accept-data-loss` must start anyway without reusing a
txid. A torn tail (a commit cut short by the crash) is accepted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest
from electric_server.core import entity_writes
from electric_server.store.base import EntityRecord, Mutation, NewEvent, Write, WriteContext, WriteOutcome
from electric_server.store.sqlite import SQLiteStore

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.cli import exit_codes

pytestmark = pytest.mark.anyio

REF = pb.EntityRef(type="t", id="e")
ELECTRIC = [sys.executable, "-m", "electric_sdk.cli.main"]


def electric(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ELECTRIC, *args], capture_output=True, text=True, timeout=60, check=False)


async def write_messages(
    address: str, count: int, size: int, first: int = 0, ref: pb.EntityRef = REF
) -> dict[str, int]:
    """Acknowledged messages (to a new entity if ``first`` is 0): their text's number → their txid."""
    acked: dict[str, int] = {}
    text = "x" * size
    async with grpc.aio.insecure_channel(address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        if first == 0:
            await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref))
        for n in range(first, first + count):
            response = await stub.SendMessage(api.SendMessageRequest(ref=ref, text=f"{n} {text}"))
            acked[str(n)] = response.txid
    return acked


async def read_messages(address: str) -> dict[str, int]:
    """Every message in the stream (none if the entity is gone): its text's number → its txid."""
    found: dict[str, int] = {}
    async with grpc.aio.insecure_channel(address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        offset = 0
        while True:
            try:
                page = await stub.ReadEvents(api.ReadEventsRequest(ref=REF, from_offset=offset, limit=1000))
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                return found
            for event in page.events:
                if event.type == "message":
                    found[event.message.text.split()[0]] = event.headers.txid
            offset = page.next_offset
            if offset >= page.head_offset:
                return found


def killed(server_process: Callable[..., Any], data: Path) -> Any:
    """A server process on ``data``, to be killed with SIGKILL once written to."""
    return server_process(data)


def kill_9(srv: Any) -> None:
    srv.send(signal.SIGKILL)
    assert srv.wait() == -signal.SIGKILL


def wal_layout(wal: Path) -> tuple[int, int]:
    """(page size, whole frames) of a WAL, from its header (sqlite.org/fileformat2.html)."""
    page_size = struct.unpack(">I", wal.read_bytes()[8:12])[0]
    return page_size, (wal.stat().st_size - 32) // (24 + page_size)


def flip_byte(path: Path, offset: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x55]))


def note(ref: tuple[str, str]) -> Write:
    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        assert current is not None
        return Mutation([NewEvent("note", f"note_{ctx.txid}", pb.OPERATION_INSERT, b"n")], current)

    return Write(ref, decide)


spawn_x = entity_writes.spawn(("t", "x"), 30_000, 60_000)


def start_refused(data: Path) -> subprocess.CompletedProcess[str]:
    """`electric server` on ``data``, expected to refuse to start (it would listen otherwise)."""
    try:
        return subprocess.run(
            [*ELECTRIC, "server", "--listen", "127.0.0.1:0", "--data", str(data)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the server started on a damaged store:\n{exc.stdout!r}") from exc


def assert_refused(data: Path, names: str) -> None:
    result = start_refused(data)
    assert result.returncode == exit_codes.DATA_DAMAGED, result
    assert "Traceback" not in result.stderr
    assert re.search(rf"electric server: the store in .* is damaged:\n  - .*{names}", result.stderr), (
        result.stderr
    )
    assert "--accept-data-loss" in result.stderr  # what to do
    assert "restore a backup" in result.stderr


def assert_verify_damaged(data: Path, names: str) -> dict[str, Any]:
    text = electric("verify", "--data", str(data))
    assert text.returncode == exit_codes.DATA_DAMAGED, text
    assert "Traceback" not in text.stdout + text.stderr
    assert re.search(rf"^damaged: .*{names}", text.stdout, re.MULTILINE), text.stdout
    assert re.search(
        r"^verified \d+ entit(?:y|ies), \d+ events?: the store is damaged", text.stdout, re.MULTILINE
    )
    report = electric("verify", "--data", str(data), "--json")
    assert report.returncode == exit_codes.DATA_DAMAGED, report
    parsed: dict[str, Any] = json.loads(report.stdout)
    assert parsed["clean"] is False
    assert parsed["damage"]
    return parsed


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return tmp_path / "data"


async def crashed_store(
    server_process: Callable[..., Any], data: Path, count: int, size: int
) -> dict[str, int]:
    """Acknowledged messages written to a server process, then killed with SIGKILL."""
    srv = server_process(data)
    acked = await write_messages(srv.address, count, size)
    kill_9(srv)
    assert (data / "electric.db-wal").stat().st_size > 0
    return acked


async def accept_and_check_txids(
    server_process: Callable[..., Any], data: Path, acked: dict[str, int]
) -> None:
    """`--accept-data-loss` starts, and no acknowledged txid is handed out again."""
    srv = server_process(data, "--accept-data-loss")
    assert any("--accept-data-loss" in line for line in srv.lines), "".join(srv.lines)  # what was dropped
    found = await read_messages(srv.address)
    assert found.items() <= acked.items()  # nothing made up: what survived is what was acknowledged
    fresh = await write_messages(srv.address, 5, 10, ref=pb.EntityRef(type="t", id="after"))
    assert min(fresh.values()) > max(acked.values()), "a txid already acknowledged was handed out again"
    srv.send(signal.SIGTERM)
    assert srv.wait() == 0
    assert electric("verify", "--data", str(data)).returncode == exit_codes.OK  # whole again


async def test_a_flipped_byte_in_the_middle_of_the_wal_is_refused(
    server_process: Callable[..., Any], data: Path
) -> None:
    acked = await crashed_store(server_process, data, count=150, size=300)  # ~600 frames: no checkpoint
    wal = data / "electric.db-wal"
    page_size, frames = wal_layout(wal)
    assert frames > 100
    middle = 32 + (frames // 2) * (24 + page_size)
    flip_byte(wal, middle + 24 + page_size // 2)  # inside the page of the middle frame
    parsed = assert_verify_damaged(data, r"electric\.db-wal: frame \d+ of \d+ fails its checksum")
    assert parsed["entities"] == 1  # what SQLite could read is counted
    assert_refused(data, r"electric\.db-wal: frame \d+ of \d+ fails its checksum, yet \d+ later commit")
    await accept_and_check_txids(server_process, data, acked)
    assert any(name.startswith("electric.db-wal.damaged-") for name in os.listdir(data)), "the WAL is kept"


async def test_a_scrambled_wal_header_is_refused(server_process: Callable[..., Any], data: Path) -> None:
    acked = await crashed_store(server_process, data, count=50, size=300)
    wal = data / "electric.db-wal"
    with wal.open("r+b") as f:
        f.seek(12)
        f.write(os.urandom(8))  # the checkpoint sequence and the first salt
    assert_verify_damaged(data, r"electric\.db-wal: the header's checksum fails")
    assert_refused(data, r"electric\.db-wal: the header's checksum fails")
    await accept_and_check_txids(server_process, data, acked)


async def test_a_wal_deleted_after_an_unclean_stop_is_refused(
    server_process: Callable[..., Any], data: Path
) -> None:
    acked = await crashed_store(server_process, data, count=50, size=300)
    (data / "electric.db-wal").unlink()
    assert_verify_damaged(data, r"electric\.db-wal is missing after an unclean shutdown")
    assert_refused(data, r"electric\.db-wal is missing after an unclean shutdown")
    try:  # `electric dev` runs the same server
        dev = electric("dev", "--listen", "127.0.0.1:0", "--data", str(data))
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("`electric dev` started on a damaged store") from exc
    assert dev.returncode == exit_codes.DATA_DAMAGED, dev
    assert "electric dev: the store in" in dev.stderr
    await accept_and_check_txids(server_process, data, acked)


async def test_a_database_truncated_to_half_is_refused(
    server_process: Callable[..., Any], data: Path
) -> None:
    # ~2,000 frames of 3 KB messages: checkpointed into the database more than once.
    await crashed_store(server_process, data, count=400, size=3000)
    db = data / "electric.db"
    size = db.stat().st_size
    assert size > 1024 * 1024
    with db.open("r+b") as f:
        f.truncate(size // 2)
    assert_verify_damaged(data, r"electric\.db holds \d+ of its \d+ pages")
    assert_refused(data, r"electric\.db holds \d+ of its \d+ pages")


async def test_a_torn_tail_is_accepted_and_told_from_damage(
    server_process: Callable[..., Any], data: Path
) -> None:
    """A commit cut short by the crash (frames after the last commit that do not verify)
    loses nothing acknowledged: the server starts and has every write. The same WAL with
    a byte flipped before its last commit is damage."""
    acked = await crashed_store(server_process, data, count=100, size=300)
    wal = data / "electric.db-wal"
    page_size, frames = wal_layout(wal)
    salts = wal.read_bytes()[16:24]
    torn = struct.pack(">II", 2, 3) + salts + os.urandom(8)  # a commit frame's header, its checksum wrong
    with wal.open("ab") as f:
        f.write(torn + os.urandom(page_size) + torn + os.urandom(page_size // 2))  # cut mid-frame
    verified = electric("verify", "--data", str(data), "--json")
    assert verified.returncode == exit_codes.OK, verified
    assert json.loads(verified.stdout)["damage"] == []
    srv = server_process(data)
    assert await read_messages(srv.address) == acked
    acked |= await write_messages(srv.address, 20, 300, first=len(acked))
    kill_9(srv)

    page_size, frames = wal_layout(wal)
    flip_byte(wal, 32 + (frames // 2) * (24 + page_size) + 24 + 7)
    assert_refused(data, r"electric\.db-wal: frame \d+ of \d+ fails its checksum")


async def test_a_clean_stop_leaves_nothing_to_refuse(server_process: Callable[..., Any], data: Path) -> None:
    """The clean shutdown is recorded: the WAL folded into the database may be gone, and txids
    continue without a gap. After a kill, they continue above the reservation."""
    srv = server_process(data)
    acked = await write_messages(srv.address, 20, 100)
    srv.send(signal.SIGTERM)
    assert srv.wait() == 0
    state = json.loads((data / "electric.state").read_text())
    assert state["state"] == "clean"
    assert state["txids_reserved_below"] > max(acked.values())
    (data / "electric.db-wal").unlink(missing_ok=True)
    srv = server_process(data)
    fresh = await write_messages(srv.address, 1, 10, first=len(acked))
    assert min(fresh.values()) == max(acked.values()) + 1  # no gap after a clean stop
    assert json.loads((data / "electric.state").read_text())["state"] == "running"
    kill_9(srv)
    reserved = json.loads((data / "electric.state").read_text())["txids_reserved_below"]
    srv = server_process(data)
    after_crash = await write_messages(srv.address, 1, 10, first=len(acked) + 1)
    assert min(after_crash.values()) == reserved  # above everything that may have been handed out
    srv.send(signal.SIGTERM)
    assert srv.wait() == 0


def test_verify_on_missing_and_unreadable_files_never_shows_a_traceback(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "electric.db").write_bytes(b"not a database at all" * 100)
    result = electric("verify", "--data", str(data))
    assert result.returncode == exit_codes.DATA_DAMAGED, result
    assert "Traceback" not in result.stdout + result.stderr
    assert "electric.db is not an SQLite database" in result.stdout
    shutil.rmtree(data)
    data.mkdir()
    (data / "electric.db").write_bytes(b"")
    (data / "electric.state").write_text("{garbage")
    result = electric("verify", "--data", str(data))
    assert "Traceback" not in result.stdout + result.stderr
    assert result.returncode == exit_codes.DATA_DAMAGED, result
    assert "electric.state is not a state file" in result.stdout


async def test_damage_found_beside_a_live_server_is_not_a_race(
    server_process: Callable[..., Any], data: Path
) -> None:
    """`electric verify` beside a server under load: its WAL restarts and grows while verify
    reads it, and nothing of that is taken for damage."""
    srv = server_process(data)
    async with anyio.create_task_group() as tg:
        tg.start_soon(write_messages, srv.address, 600, 3000)
        for _ in range(5):
            result = await anyio.to_thread.run_sync(lambda: electric("verify", "--data", str(data), "--json"))
            assert result.returncode in (exit_codes.OK, exit_codes.ERROR), result  # not damaged
            assert json.loads(result.stdout)["damage"] == []
    srv.send(signal.SIGTERM)
    assert srv.wait() == 0


async def test_txids_are_reserved_in_blocks_and_a_crash_never_reuses_one(tmp_path: Path) -> None:
    """Past a block of 10,000 txids the store reserves the next before handing one out; a copy
    of its files taken while it runs (as a crash leaves them, WAL and all) continues above the
    reservation, and so does one whose WAL was lost, with --accept-data-loss."""
    db = tmp_path / "live" / "electric.db"
    store = SQLiteStore(db)
    await store.open()
    try:
        ref = ("t", "e")
        await store.write(Write(ref, entity_writes.spawn(ref, 30_000, 60_000)))
        last = 0
        for _ in range(45):  # 11,520 txids in batches of 256: past the first block
            for outcome in await store.write_many([note(ref) for _ in range(256)]):
                assert isinstance(outcome, WriteOutcome)
                assert outcome.commit is not None
                last = outcome.commit.txid
        reserved = json.loads(db.with_suffix(".state").read_text())["txids_reserved_below"]
        assert last < reserved <= last + 10_000
        assert reserved > 10_001  # the open's reservation was followed by another
        for name in ("crashed", "lost"):
            shutil.copytree(db.parent, tmp_path / name)  # a crash: the state says running
    finally:
        await store.close()
    (tmp_path / "lost" / "electric.db-wal").unlink()
    for name, accept in (("crashed", False), ("lost", True)):
        copy = SQLiteStore(tmp_path / name / "electric.db", accept_data_loss=accept)
        await copy.open()
        try:
            outcome = await copy.write(note(("t", "e")) if name == "crashed" else Write(("t", "x"), spawn_x))
            assert outcome.commit is not None
            assert outcome.commit.txid == reserved, name
        finally:
            await copy.close()
