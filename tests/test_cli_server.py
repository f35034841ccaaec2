"""`electric server` and `electric verify` as real processes: help, usage errors, verify.

Exit codes (electric_sdk/cli/main.py): 0 ok, 1 a problem found, 2 bad usage or
configuration (nothing started or written).
"""

from __future__ import annotations

import contextlib
import gc
import json
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import grpc
import pytest
from electric_server.app import ElectricServer

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb

if TYPE_CHECKING:
    from conftest import StartServer

ELECTRIC = [sys.executable, "-m", "electric_sdk.cli.main"]


def electric(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ELECTRIC, *args], capture_output=True, text=True, timeout=60, check=False)


async def electric_async(*args: str) -> subprocess.CompletedProcess[bytes]:
    return await anyio.run_process([*ELECTRIC, *args], check=False)


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("server", ["--listen", "--data", "--tokens", "--tls-cert", "--tls-key", "--insecure"]),
        ("verify", ["--data", "--json"]),
    ],
)
def test_help(command: str, expected: list[str]) -> None:
    result = electric(command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: electric {command}")
    for option in expected:
        assert option in result.stdout


def test_no_command_is_usage_error() -> None:
    result = electric()
    assert result.returncode == 2
    assert "usage: electric" in result.stderr


@pytest.mark.parametrize("folder", ["empty", "missing"])
def test_verify_without_database_exits_2(tmp_path: Path, folder: str) -> None:
    data = tmp_path / folder
    if folder == "empty":
        data.mkdir()
    result = electric("verify", "--data", str(data))
    assert result.returncode == 2
    assert result.stderr.strip() == f"electric verify: no electric database at {data / 'electric.db'}"
    assert result.stdout == ""
    assert not (data / "electric.db").exists()


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


BAD_SERVER_ARGS = {
    "listen-nonsense": (["--listen", "nonsense"], "--listen must be HOST:PORT, got 'nonsense'"),
    "listen-no-port": (["--listen", "127.0.0.1"], "--listen must be HOST:PORT"),
    "listen-bad-port": (["--listen", "127.0.0.1:http"], "--listen must be HOST:PORT"),
    "tls-cert-alone": (["--tls-cert", "cert.pem"], "--tls-cert and --tls-key go together"),
    "tls-key-alone": (["--tls-key", "key.pem"], "--tls-cert and --tls-key go together"),
    "tls-files-missing": (["--tls-cert", "/nope/c.pem", "--tls-key", "/nope/k.pem"], "/nope/k.pem"),
    "drain-grace": (["--drain-grace", "soon"], "invalid duration 'soon'"),
    "commit-delay": (["--commit-delay", "soon"], "invalid duration 'soon'"),
    "commit-delay-too-long": (["--commit-delay", "1s"], "the commit delay must be 0-100 ms, not 1000 ms"),
    "settle-zero": (["--settle", "0"], "--settle must be 1ms to 60s, not 0ms"),
    "settle-too-long": (["--settle", "2m"], "--settle must be 1ms to 60s, not 120000ms"),
}


@pytest.mark.parametrize("case", list(BAD_SERVER_ARGS))
def test_server_bad_configuration_exits_2(tmp_path: Path, case: str) -> None:
    args, message = BAD_SERVER_ARGS[case]
    data = tmp_path / "data"
    result = electric("server", "--listen", "127.0.0.1:0", "--data", str(data), *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("electric server: ")
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not data.exists()


def test_server_bad_choice_is_argparse_usage_error(tmp_path: Path) -> None:
    result = electric("server", "--data", str(tmp_path / "d"), "--synchronous", "SOMETIMES")
    assert result.returncode == 2
    assert "invalid choice: 'SOMETIMES'" in result.stderr


def test_server_port_in_use_exits_2(tmp_path: Path, busy_port: int) -> None:
    result = electric("server", "--listen", f"127.0.0.1:{busy_port}", "--data", str(tmp_path / "data"))
    assert result.returncode == 2, result.stderr
    assert f"electric server: cannot listen on 127.0.0.1:{busy_port}" in result.stderr
    assert "Traceback" not in result.stderr
    assert "listening" not in result.stdout


def test_server_invalid_tls_files_exit_2(tmp_path: Path) -> None:
    pem = tmp_path / "garbage.pem"
    pem.write_text("not a certificate\n")
    tls = ["--tls-cert", str(pem), "--tls-key", str(pem)]
    result = electric("server", "--listen", "127.0.0.1:0", "--data", str(tmp_path / "data"), *tls)
    assert result.returncode == 2, result.stderr
    assert "invalid TLS certificate or key" in result.stderr
    assert "Traceback" not in result.stderr


# -- verify on data written by a real server ----------------------------------------------------


def ref(id_: str) -> pb.EntityRef:
    return pb.EntityRef(type="agent", id=id_)


async def populate(srv: ElectricServer) -> None:
    """Three entities, one killed, one with a message: 6 events."""
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        for i in range(3):
            await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref(f"a{i}")))
        await stub.SignalEntity(api.SignalEntityRequest(ref=ref("a0"), signal=pb.SIGNAL_SIGKILL))
        await stub.SendMessage(api.SendMessageRequest(ref=ref("a1"), text="hi"))


@pytest.fixture
async def stopped_data(start_server: StartServer, tmp_path: Path) -> Path:
    data = tmp_path / "written"
    srv = await start_server(data)
    await populate(srv)
    await srv.stop(0)
    return data


@pytest.mark.anyio
async def test_verify_data_written_by_server(stopped_data: Path) -> None:
    result = await electric_async("verify", "--data", str(stopped_data))
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == "verified 3 entities, 6 events: clean\n"


@pytest.mark.anyio
async def test_verify_json_is_compact_like_the_rest(stopped_data: Path) -> None:
    result = await electric_async("verify", "--data", str(stopped_data), "--json")
    assert result.returncode == 0, result.stderr
    text = result.stdout.decode()
    report = json.loads(text)
    assert (report["entities"], report["events"], report["clean"]) == (3, 6, True)
    assert text == json.dumps(report, separators=(",", ":")) + "\n"


@pytest.mark.anyio
async def test_verify_a_data_directory_whose_name_looks_like_a_uri(
    start_server: StartServer, tmp_path: Path
) -> None:
    """The read-only store is opened by URI: '?', '#' and '%' in the path must stay part of it."""
    data = tmp_path / "odd?name#with%25"
    srv = await start_server(data)
    await populate(srv)
    await srv.stop(0)
    result = await electric_async("verify", "--data", str(data))
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == "verified 3 entities, 6 events: clean\n"


@pytest.mark.anyio
async def test_verify_json(stopped_data: Path) -> None:
    result = await electric_async("verify", "--data", str(stopped_data), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report == {"entities": 3, "events": 6, "clean": True, "damage": [], "mismatches": {}}


@pytest.mark.anyio
async def test_verify_beside_a_live_server(server: ElectricServer) -> None:
    await populate(server)
    result = await electric_async("verify", "--data", str(server.config.data_dir))
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().startswith("verified 3 entities, 6 events: clean")


@pytest.mark.anyio
async def test_verify_reports_a_tampered_entity(stopped_data: Path) -> None:
    with contextlib.closing(sqlite3.connect(stopped_data / "electric.db")) as conn, conn:
        conn.execute("UPDATE entities SET state = 'running' WHERE id = 'a2'")
    result = await electric_async("verify", "--data", str(stopped_data))
    assert result.returncode == 1
    lines = result.stdout.decode().splitlines()
    assert lines[-1] == "verified 3 entities, 6 events: 1 entity differs"
    assert all(line.startswith("/agent/a2: ") for line in lines[:-1])
    assert any("running" in line and "spawning" in line for line in lines[:-1])


def test_tune_gc_sets_the_server_process_collector() -> None:
    from electric_server.app import GC_YOUNG_THRESHOLD, tune_gc

    saved = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, saved[1], saved[2])
        assert gc.get_freeze_count() > 0  # start-up objects are out of the collector's way
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)
