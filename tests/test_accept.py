"""Extra acceptors (server/electric_server/fastpaths/acceptors.py): calls they accept are served
like grpc's own — the same handlers, interceptors and statuses — and they end with
the server.

They rely on grpc.aio internals; the first test fails when an upgraded grpcio no
longer has them, so the server is never silently back on one acceptor per method.
With ``ELECTRIC_FORCE_FALLBACKS=acceptors`` (``make test`` runs this file so once)
the same calls must be served by grpc's own acceptor alone.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
from electric_server.fastpaths import forced
from electric_server.fastpaths.acceptors import FORCED, missing_internals
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb

if TYPE_CHECKING:
    from conftest import StartServer

pytestmark = pytest.mark.anyio

CALLS = 64
# The fallback forced: grpc's own acceptor takes every call, the extra ones take none.
FALLBACK = forced("acceptors")


def test_the_installed_grpcio_has_what_the_acceptors_use() -> None:
    assert missing_internals() is None


async def _spawn_all(
    address: str, prefix: str, metadata: tuple[tuple[str, str], ...] = ()
) -> list[api.SpawnEntityResponse | BaseException]:
    """CALLS concurrent SpawnEntity calls, every one awaited to its end: responses or errors."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        return await asyncio.gather(
            *(
                stub.SpawnEntity(
                    api.SpawnEntityRequest(ref=pb.EntityRef(type="agent", id=f"{prefix}{i}")),
                    metadata=metadata,
                    timeout=30,
                )
                for i in range(CALLS)
            ),
            return_exceptions=True,
        )


async def _spawn_concurrently(
    address: str, prefix: str, metadata: tuple[tuple[str, str], ...] = ()
) -> list[str]:
    """CALLS concurrent SpawnEntity calls that must all succeed; the ids spawned."""
    ids = []
    for reply in await _spawn_all(address, prefix, metadata):
        assert isinstance(reply, api.SpawnEntityResponse), reply
        ids.append(reply.entity.ref.id)
    return ids


async def test_calls_taken_by_the_extra_acceptors_are_served(start_server: StartServer) -> None:
    srv = await start_server(acceptors_per_method=8)
    assert srv.acceptors is not None
    assert srv.acceptors.reason == (FORCED if FALLBACK else None)
    ids = await _spawn_concurrently(srv.address, "a")
    assert sorted(ids) == sorted(f"a{i}" for i in range(CALLS))
    # grpc's own acceptor has one request out per method, these eight more:
    # under 64 concurrent calls most of them are accepted here.
    if FALLBACK:
        assert srv.acceptors.accepted == 0
        assert srv.acceptors.outstanding == 0
    else:
        assert srv.acceptors.accepted >= CALLS // 2
    record = await srv.store.get_entity(("agent", "a0"))
    assert record is not None


async def test_with_none_grpc_serves_alone(start_server: StartServer) -> None:
    srv = await start_server(acceptors_per_method=0)
    assert srv.acceptors is not None
    assert srv.acceptors.reason is not None
    ids = await _spawn_concurrently(srv.address, "b")
    assert len(ids) == CALLS
    assert srv.acceptors.accepted == 0
    assert srv.acceptors.outstanding == 0


async def test_the_auth_interceptor_guards_calls_the_extra_acceptors_take(
    start_server: StartServer, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[[tokens]]\ntoken = "good-token-0001"\nprincipal = "p"\nscopes = ["admin"]\n')
    tokens.chmod(0o600)  # a tokens file others may read is refused
    srv = await start_server(tokens_file=tokens, acceptors_per_method=8)
    assert srv.acceptors is not None
    wrong = (("authorization", "Bearer wrong-token-001"),)
    before = srv.acceptors.accepted
    results = await _spawn_all(srv.address, "c", wrong)
    assert srv.acceptors.accepted - before >= (0 if FALLBACK else CALLS // 2)
    # Every one of the 64 was refused, including those the extra acceptors took.
    for result in results:
        assert isinstance(result, grpc.aio.AioRpcError)
        assert result.code() == grpc.StatusCode.UNAUTHENTICATED
        status = rpc_status.from_call(result)  # type: ignore[arg-type]
        assert status is not None
        info = error_details_pb2.ErrorInfo()
        assert status.details[0].Unpack(info)
        assert info.reason == "UNAUTHENTICATED"
    ids = await _spawn_concurrently(srv.address, "d", (("authorization", "Bearer good-token-0001"),))
    assert len(ids) == CALLS
    listed = await srv.store.list_entities("agent", (), None, 1000)
    assert {r.id for r in listed} == {f"d{i}" for i in range(CALLS)}  # nothing from the refused calls


async def test_the_acceptors_end_with_the_server(start_server: StartServer) -> None:
    srv = await start_server(acceptors_per_method=8)
    acceptors = srv.acceptors
    assert acceptors is not None
    assert (acceptors.outstanding > 0) is not FALLBACK
    await _spawn_concurrently(srv.address, "e")
    await srv.stop(0)
    assert acceptors.outstanding == 0


@pytest.mark.parametrize("value", ["-1", "65", "many"])
def test_a_bad_acceptors_value_exits_2(tmp_path: Path, value: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "electric_sdk.cli.main",
            "server",
            "--data",
            str(tmp_path / "d"),
            "--acceptors",
            value,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--acceptors" in proc.stderr
    assert not (tmp_path / "d" / "electric.db").exists()
