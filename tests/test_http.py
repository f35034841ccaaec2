"""The HTTP/JSON door (issue 21): every route through a real server and a real HTTP client.

The door calls the same EntityService as gRPC, so the tests hold it to the gRPC
door's answers: a signal through either lands alike, one idempotency key
replays across both, the auth matrix is the same, and a refused call writes
nothing (the whole database is compared before and after).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import anyio
import grpc
import httpx
import pytest
from conftest import read_database
from electric_server import ConfigError
from electric_server.app import ElectricServer, ServerConfig
from electric_server.core.errors import HTTP_STATUS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_auth import TOKENS, TOKENS_TOML  # the same principals as the gRPC auth tests

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.enums import SIGNAL_TO_PB
from electric_sdk.lifecycle import Signal, State
from electric_sdk.models import Entity, Event, SignalResult
from electric_sdk.testing import TestServer

if TYPE_CHECKING:
    from conftest import DbRows, SeedState, ServerProcess, StartServer

    from electric_sdk._proto.electric.v1.entity_service_pb2_grpc import EntityServiceAsyncStub as Stub

pytestmark = pytest.mark.anyio

JSON = {"content-type": "application/json"}


@pytest.fixture
async def grpc_stub(door: ElectricServer) -> AsyncIterator[Stub]:
    async with grpc.aio.insecure_channel(door.address) as ch:
        yield api_grpc.EntityServiceStub(ch)  # type: ignore[misc]


def error_of(response: httpx.Response) -> tuple[int, str]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "details"}, body
    return response.status_code, body["error"]["code"]


# -- every route ----------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["", "/_electric/entities"])
async def test_every_route(http: httpx.AsyncClient, grpc_stub: Stub, prefix: str) -> None:
    one = f"{prefix}/agent/a1"
    spawned = await http.put(one, json={"profile": {"grace_period_ms": 5000}})
    assert spawned.status_code == 201, spawned.text
    got = await http.get(one)
    assert got.status_code == 200
    # One renderer: the door's JSON is the SDK's to_json() of the gRPC answer.
    through_grpc = await grpc_stub.GetEntity(api.GetEntityRequest(ref=pb.EntityRef(type="agent", id="a1")))
    assert got.json() == Entity.from_pb(through_grpc.entity).to_json()
    assert got.json()["profile"]["grace_period_ms"] == 5000

    signalled = await http.post(
        f"{one}/signal", json={"signal": "SIGUSR", "reason": "r", "payload": {"x": [1]}}
    )
    assert signalled.status_code == 200, signalled.text
    body = signalled.json()
    assert {"url", "signal", "previous_state", "new_state", "created_at", "txid"} <= set(body)
    assert (body["url"], body["signal"], body["previous_state"], body["new_state"]) == (
        "/agent/a1",
        "SIGUSR",
        "spawning",
        "spawning",
    )
    assert isinstance(body["created_at"], int)
    assert isinstance(body["txid"], str)

    sent = await http.post(f"{one}/messages", json={"text": "hello", "data": {"k": 1}})
    assert sent.status_code == 200
    assert sent.json()["url"] == "/agent/a1"
    assert sent.json()["state"] == "spawning"

    page = await http.get(f"{one}/events", params={"offset": 1, "limit": 1})
    assert page.status_code == 200
    events = page.json()["events"]
    assert [e["offset"] for e in events] == [1]
    assert page.json()["next_offset"] == 2
    assert set(events[0]) == {"type", "key", "value", "headers", "offset"}
    assert set(events[0]["headers"]) == {"operation", "timestamp", "txid"}
    read = await grpc_stub.ReadEvents(
        api.ReadEventsRequest(ref=pb.EntityRef(type="agent", id="a1"), from_offset=1, limit=1)
    )
    assert events == [Event.from_pb(e).to_json() for e in read.events]
    assert events[0]["value"]["payload"] == {"x": [1]}

    listed = await http.get(PREFIX_LIST[prefix], params={"type": "agent", "state": ["spawning", "running"]})
    assert [e["url"] for e in listed.json()["entities"]] == ["/agent/a1"]
    assert listed.json()["next_page_token"] == ""

    many = await http.post(
        f"{prefix}/signal", json={"selector": {"refs": ["/agent/a1", "/agent/nope"]}, "signal": "SIGTERM"}
    )
    assert many.status_code == 200, many.text
    counts = many.json()
    assert (counts["signalled"] + counts["ignored"], counts["skipped"], counts["not_found"]) == (1, 0, 1)

    deleted = await http.delete(one)
    assert deleted.status_code == 200
    assert deleted.json()["signal"] == "SIGKILL"
    assert deleted.json()["new_state"] == "killed"
    assert deleted.headers["deprecation"] == "true"
    assert "migration-delete.md" in deleted.headers["link"]
    assert 'rel="deprecation"' in deleted.headers["link"]


PREFIX_LIST = {"": "/entities", "/_electric/entities": "/_electric/entities"}


async def test_health_readiness_and_stop(door: ElectricServer, http: httpx.AsyncClient) -> None:
    assert (await http.get("/healthz")).json() == {"status": "alive"}
    assert (await http.get("/readyz")).json() == {"status": "ready"}
    assert door.readiness() is None  # what /readyz answers from
    await door.stop()
    draining = door.readiness()
    assert draining is not None
    assert draining.reason == "SERVER_DRAINING"  # what /readyz says from the drain's first step
    async with httpx.AsyncClient(base_url=str(http.base_url)) as fresh:
        with pytest.raises(httpx.ConnectError):  # the door stopped with the server
            await fresh.get("/healthz")


# -- parity with gRPC ---------------------------------------------------------------------------------


def _landed(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What a signal appended, without what differs between two entities (keys, times, txids)."""
    return [
        (
            e["type"],
            e["headers"]["operation"],
            "deadline" in e["value"],
            _without(e["value"], "signal_key", "deadline"),
        )
        for e in rows
    ]


def _without(value: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in value.items() if k not in keys}


async def test_signals_land_alike_through_both_doors(
    door: ElectricServer, http: httpx.AsyncClient, grpc_stub: Stub, seed_state: SeedState
) -> None:
    """Each of the 7 signals in each state: judged alike, the same events appended (all 49
    cases at once, so their writes share commits)."""

    async def case(state: State, sig: Signal) -> None:
        refs = {
            name: pb.EntityRef(type="parity", id=f"{name}-{state.value}-{sig.name}")
            for name in ("http", "grpc")
        }
        heads = {}
        for name, ref in refs.items():
            await grpc_stub.SpawnEntity(api.SpawnEntityRequest(ref=ref))
            if state is not State.SPAWNING:
                deadline = 2**40 if state is State.STOPPING else None
                await seed_state(door.store, (ref.type, ref.id), state, deadline_ms=deadline)
            heads[name] = (await grpc_stub.GetEntity(api.GetEntityRequest(ref=ref))).entity.head_offset
        body: dict[str, Any] = {"signal": sig.value, "reason": "parity"}
        request = api.SignalEntityRequest(ref=refs["grpc"], signal=SIGNAL_TO_PB[sig], reason="parity")
        if sig is Signal.SIGUSR:
            body["payload"] = {"n": 1}
            request.payload.struct_value.update({"n": 1})
        through_http = await http.post(f"/parity/{refs['http'].id}/signal", json=body)
        try:
            grpc_outcome: tuple[int, Any] = (
                200,
                SignalResult.from_pb(await grpc_stub.SignalEntity(request)).to_json(),
            )
        except grpc.aio.AioRpcError as exc:
            grpc_outcome = (HTTP_STATUS[(exc.code(), None)], exc.details())
        if through_http.status_code == 200:
            assert grpc_outcome[0] == 200, (state, sig, grpc_outcome)
            strip = ("url", "created_at", "txid", "key")
            assert _without(through_http.json(), *strip) == _without(grpc_outcome[1], *strip), (state, sig)
        else:
            assert error_of(through_http) == (409, "INVALID_SIGNAL"), (state, sig)
            assert grpc_outcome == (409, through_http.json()["error"]["message"]), (state, sig)
        landed = {}
        for name, ref in refs.items():
            page = await http.get(f"/parity/{ref.id}/events", params={"offset": heads[name]})
            landed[name] = _landed(page.json()["events"])
        assert landed["http"] == landed["grpc"], (state, sig)
        assert bool(landed["http"]) == (through_http.status_code == 200), (state, sig)
        judged.append((state, sig))

    judged: list[tuple[State, Signal]] = []
    async with anyio.create_task_group() as tg:
        for state in State:
            for sig in Signal:
                tg.start_soon(case, state, sig)
    assert len(judged) == len(State) * len(Signal) == 49


# -- errors -------------------------------------------------------------------------------------------------

DEEP = '{"signal": "SIGUSR", "payload": ' + "[" * 40 + "]" * 40 + "}"
ERROR_CASES: list[tuple[str, str, str, dict[str, Any], int, str]] = [
    # id, method, path, request kwargs, status, code
    (
        "malformed",
        "POST",
        "/agent/a1/signal",
        {"content": b"{nope", "headers": JSON},
        400,
        "MALFORMED_REQUEST",
    ),
    (
        "nan",
        "POST",
        "/agent/a1/signal",
        {"content": b'{"signal": "SIGUSR", "payload": NaN}', "headers": JSON},
        400,
        "MALFORMED_REQUEST",
    ),
    (
        "infinity",
        "POST",
        "/agent/a1/signal",
        {"content": b'{"signal": "SIGUSR", "payload": -Infinity}', "headers": JSON},
        400,
        "MALFORMED_REQUEST",
    ),
    (
        "duplicate key",
        "POST",
        "/agent/a1/signal",
        {"content": b'{"signal": "SIGTERM", "signal": "SIGKILL"}', "headers": JSON},
        400,
        "MALFORMED_REQUEST",
    ),
    (
        "not an object",
        "POST",
        "/agent/a1/signal",
        {"content": b"[]", "headers": JSON},
        400,
        "MALFORMED_REQUEST",
    ),
    (
        "not utf-8",
        "POST",
        "/agent/a1/signal",
        {"content": b'{"signal": "\xff"}', "headers": JSON},
        400,
        "MALFORMED_REQUEST",
    ),
    (
        "lone surrogate",
        "POST",
        "/agent/a1/signal",
        {"content": b'{"signal": "SIGUSR", "reason": "\\ud800"}', "headers": JSON},
        400,
        "MALFORMED_REQUEST",
    ),
    (
        "endless integer",
        "POST",
        "/agent/a1/signal",
        {"content": b'{"signal": "SIGUSR", "payload": ' + b"1" * 5000 + b"}", "headers": JSON},
        400,
        "MALFORMED_REQUEST",
    ),
    (
        "overflowing float",
        "POST",
        "/agent/a1/signal",
        {"content": b'{"signal": "SIGUSR", "payload": 1e400}', "headers": JSON},
        400,
        "MALFORMED_REQUEST",
    ),
    ("surrogate in path", "GET", "/agent/%ED%A0%80", {}, 400, "INVALID_NAME"),
    ("not utf-8 path", "GET", "/agent/%FF", {}, 400, "INVALID_NAME"),
    (
        "too deep",
        "POST",
        "/agent/a1/signal",
        {"content": DEEP.encode(), "headers": JSON},
        400,
        "PAYLOAD_TOO_DEEP",
    ),
    (
        "far too deep",
        "POST",
        "/agent/a1/signal",
        {"content": b"[" * 100_000, "headers": JSON},
        400,
        "PAYLOAD_TOO_DEEP",
    ),
    (
        "content type",
        "POST",
        "/agent/a1/signal",
        {"content": b'{"signal": "SIGTERM"}', "headers": {"content-type": "text/plain"}},
        415,
        "UNSUPPORTED_MEDIA_TYPE",
    ),
    (
        "no content type",
        "POST",
        "/agent/a1/signal",
        {"content": b'{"signal": "SIGTERM"}'},
        415,
        "UNSUPPORTED_MEDIA_TYPE",
    ),
    (
        "body too large",
        "POST",
        "/agent/a1/messages",
        {"json": {"text": "x" * (5 << 20)}},
        413,
        "BODY_TOO_LARGE",
    ),
    (
        "unknown field",
        "POST",
        "/agent/a1/signal",
        {"json": {"signal": "SIGTERM", "reasn": "typo"}},
        400,
        "UNKNOWN_FIELD",
    ),
    ("unknown query", "GET", "/entities", {"params": {"typ": "agent"}}, 400, "UNKNOWN_FIELD"),
    ("wrong type", "POST", "/agent/a1/signal", {"json": {"signal": 15}}, 400, "INVALID_FIELD"),
    ("unknown signal", "POST", "/agent/a1/signal", {"json": {"signal": "SIGFOO"}}, 400, "UNKNOWN_SIGNAL"),
    ("no signal", "POST", "/agent/a1/signal", {"json": {}}, 400, "UNKNOWN_SIGNAL"),
    (
        "payload not allowed",
        "POST",
        "/agent/a1/signal",
        {"json": {"signal": "SIGTERM", "payload": 1}},
        400,
        "PAYLOAD_NOT_ALLOWED",
    ),
    (
        "interrupt not allowed",
        "POST",
        "/agent/a1/signal",
        {"json": {"signal": "SIGUSR", "interrupt": True}},
        400,
        "INTERRUPT_NOT_ALLOWED",
    ),
    (
        "interrupt not a boolean",
        "POST",
        "/agent/a1/signal",
        {"json": {"signal": "SIGTERM", "interrupt": "yes"}},
        400,
        "INVALID_FIELD",
    ),
    (
        "payload too large",
        "POST",
        "/agent/a1/signal",
        {"json": {"signal": "SIGUSR", "payload": "x" * 70_000}},
        413,
        "PAYLOAD_TOO_LARGE",
    ),
    ("bad name", "POST", "/agent/a%20b/signal", {"json": {"signal": "SIGTERM"}}, 400, "INVALID_NAME"),
    ("dot name", "GET", "/agent/%2E%2E", {}, 400, "INVALID_NAME"),
    ("reserved type", "PUT", "/_agent/a1", {}, 400, "RESERVED_NAME"),
    (
        "bad duration",
        "PUT",
        "/agent/new",
        {"json": {"profile": {"grace_period_ms": 0}}},
        400,
        "INVALID_DURATION",
    ),
    ("bad profile", "PUT", "/agent/new", {"json": {"profile": {"grace": 5}}}, 400, "UNKNOWN_FIELD"),
    ("exists", "PUT", "/agent/a1", {}, 409, "ENTITY_EXISTS"),
    ("not found", "GET", "/agent/nobody", {}, 404, "ENTITY_NOT_FOUND"),
    (
        "not found signal",
        "POST",
        "/agent/nobody/signal",
        {"json": {"signal": "SIGTERM"}},
        404,
        "ENTITY_NOT_FOUND",
    ),
    ("empty message", "POST", "/agent/a1/messages", {"json": {}}, 400, "EMPTY_MESSAGE"),
    ("bad offset", "GET", "/agent/a1/events", {"params": {"offset": "-1"}}, 400, "INVALID_FIELD"),
    ("unicode digit", "GET", "/agent/a1/events", {"params": {"offset": "²"}}, 400, "INVALID_FIELD"),
    ("endless digits", "GET", "/agent/a1/events", {"params": {"limit": "9" * 5000}}, 400, "INVALID_FIELD"),
    (
        "offset out of range",
        "GET",
        "/agent/a1/events",
        {"params": {"offset": str(2**63)}},
        400,
        "VALUE_OUT_OF_RANGE",
    ),
    ("page too large", "GET", "/entities", {"params": {"page_size": "5000"}}, 400, "PAGE_TOO_LARGE"),
    ("bad state", "GET", "/entities", {"params": {"state": "asleep"}}, 400, "UNKNOWN_STATE"),
    ("bad page token", "GET", "/entities", {"params": {"page_token": "nope"}}, 400, "INVALID_PAGE_TOKEN"),
    (
        "empty selector",
        "POST",
        "/signal",
        {"json": {"selector": {}, "signal": "SIGTERM"}},
        400,
        "INVALID_SELECTOR",
    ),
    (
        "bad ref",
        "POST",
        "/signal",
        {"json": {"selector": {"refs": ["agent"]}, "signal": "SIGTERM"}},
        400,
        "INVALID_NAME",
    ),
    (
        "bad idempotency key",
        "POST",
        "/agent/a1/signal",
        {"json": {"signal": "SIGUSR"}, "headers": {"idempotency-key": "has space"}},
        400,
        "INVALID_IDEMPOTENCY_KEY",
    ),
    ("no route", "GET", "/agent/a1/nothing", {}, 404, "ROUTE_NOT_FOUND"),
    ("reserved path", "GET", "/_electric/other", {}, 404, "ROUTE_NOT_FOUND"),
    ("no method", "PATCH", "/agent/a1", {}, 405, "METHOD_NOT_ALLOWED"),
]


async def test_error_bodies_and_nothing_written(
    door: ElectricServer, http: httpx.AsyncClient, db_rows: Callable[[ElectricServer], DbRows]
) -> None:
    assert (await http.put("/agent/a1")).status_code == 201
    before = db_rows(door)
    for case, method, path, kwargs, status, code in ERROR_CASES:
        response = await http.request(method, path, **kwargs)
        assert error_of(response) == (status, code), (case, response.text[:300])
    assert db_rows(door) == before


async def test_delete_twice(
    door: ElectricServer, http: httpx.AsyncClient, db_rows: Callable[[ElectricServer], DbRows]
) -> None:
    await http.put("/agent/a1")
    first = await http.delete("/agent/a1")
    assert first.status_code == 200
    assert first.json()["previous_state"] == "spawning"
    page = (await http.get("/agent/a1/events")).json()["events"]
    assert page[-2]["value"]["reason"] == "legacy delete"
    before = db_rows(door)
    second = await http.delete("/agent/a1")
    assert error_of(second) == (409, "INVALID_SIGNAL")
    assert second.headers["deprecation"] == "true"
    assert db_rows(door) == before


async def test_idempotency_key_replays_across_doors(http: httpx.AsyncClient, grpc_stub: Stub) -> None:
    await http.put("/agent/a1")
    ref = pb.EntityRef(type="agent", id="a1")
    # HTTP first, then the same call through gRPC: the first answer, nothing appended.
    first = await http.post(
        "/agent/a1/signal",
        json={"signal": "SIGUSR", "reason": "once", "payload": {"n": 1}},
        headers={"idempotency-key": "key-1"},
    )
    request = api.SignalEntityRequest(
        ref=ref, signal=pb.SIGNAL_SIGUSR, reason="once", idempotency_key="key-1"
    )
    request.payload.struct_value.update({"n": 1})
    again = SignalResult.from_pb(await grpc_stub.SignalEntity(request)).to_json()
    assert again == first.json()
    # gRPC first, then HTTP.
    request = api.SignalEntityRequest(
        ref=ref, signal=pb.SIGNAL_SIGUSR, reason="twice", idempotency_key="key-2"
    )
    original = SignalResult.from_pb(await grpc_stub.SignalEntity(request)).to_json()
    replay = await http.post(
        "/agent/a1/signal", json={"signal": "SIGUSR", "reason": "twice"}, headers={"idempotency-key": "key-2"}
    )
    assert replay.json() == original
    events = (await http.get("/agent/a1/events")).json()["events"]
    assert [e["value"]["reason"] for e in events if e["type"] == "signal"] == ["once", "twice"]
    # The same key with another request is refused, as through gRPC.
    reused = await http.post(
        "/agent/a1/signal", json={"signal": "SIGUSR", "reason": "other"}, headers={"idempotency-key": "key-2"}
    )
    assert error_of(reused) == (400, "IDEMPOTENCY_KEY_REUSED")
    # A retried DELETE gets its first answer too, not INVALID_SIGNAL.
    killed = await http.delete("/agent/a1", headers={"idempotency-key": "key-3"})
    assert (await http.delete("/agent/a1", headers={"idempotency-key": "key-3"})).json() == killed.json()


# -- auth -------------------------------------------------------------------------------------------------

# route, scope, the entity types it names ([] = every type)
AUTH_ROUTES: list[tuple[str, str, dict[str, Any], str, list[str]]] = [
    ("GET", "/agent/a1", {}, "read", ["agent"]),
    ("GET", "/other/o1", {}, "read", ["other"]),
    ("GET", "/entities", {}, "read", []),
    ("GET", "/entities", {"params": {"type": "agent"}}, "read", ["agent"]),
    ("GET", "/agent/a1/events", {}, "read", ["agent"]),
    ("GET", "/agent/a1/state", {}, "read", ["agent"]),
    ("GET", "/other/o1/state", {}, "read", ["other"]),
    ("POST", "/agent/a1/signal", {"json": {"signal": "SIGUSR"}}, "signal", ["agent"]),
    ("POST", "/other/o1/signal", {"json": {"signal": "SIGUSR"}}, "signal", ["other"]),
    ("POST", "/signal", {"json": {"selector": {"type": "agent"}, "signal": "SIGUSR"}}, "signal", ["agent"]),
    ("POST", "/signal", {"json": {"selector": {"states": ["spawning"]}, "signal": "SIGUSR"}}, "signal", []),
    ("PUT", "/agent/new", {}, "send", ["agent"]),
    ("PUT", "/other/new", {}, "send", ["other"]),
    ("POST", "/agent/a1/messages", {"json": {"text": "hi"}}, "send", ["agent"]),
    ("DELETE", "/other/o1", {}, "signal", ["other"]),
]


@pytest.fixture
async def secured(start_server: StartServer, tmp_path: Path) -> ElectricServer:
    path = tmp_path / "tokens.toml"
    path.write_text(TOKENS_TOML)
    path.chmod(0o600)
    return await start_server(http="127.0.0.1:0", tokens_file=path, synchronous="NORMAL")


def _expected(name: str | None, scope: str, types: list[str]) -> tuple[int, str] | None:
    if name is None or name == "bogus":
        return 401, "UNAUTHENTICATED"
    scopes = TOKENS[name][2]
    if "admin" not in scopes and scope not in scopes:
        return 403, "MISSING_SCOPE"
    if name == "typed" and (not types or set(types) - {"agent"}):
        return 403, "TYPE_NOT_ALLOWED"
    return None


async def test_auth_matrix(secured: ElectricServer, db_rows: Callable[[ElectricServer], DbRows]) -> None:
    assert secured.http is not None
    admin = {"authorization": f"Bearer {TOKENS['admin'][0]}"}
    async with httpx.AsyncClient(base_url=secured.http.address) as http:
        for path in ("/agent/a1", "/other/o1"):
            assert (await http.put(path, headers=admin)).status_code == 201
        assert (await http.get("/healthz")).status_code == 200  # open, as gRPC health is
        assert (await http.get("/readyz")).status_code == 200
        let_through = 0
        for name in [None, "bogus", *TOKENS]:
            headers = (
                {}
                if name is None
                else {"authorization": f"Bearer {TOKENS.get(name, ('wrong-token-000',))[0]}"}
            )
            before = db_rows(secured)
            for method, path, kwargs, scope, types in AUTH_ROUTES:
                kw = {**kwargs, "headers": {**headers, **kwargs.get("headers", {})}}
                response = await http.request(method, path, **kw)
                expected = _expected(name, scope, types)
                if expected is None:  # let through: whatever the service answers, it is no refusal of auth
                    assert response.status_code not in {401, 403}, (name, method, path, response.text)
                    before = db_rows(secured)
                    continue
                assert error_of(response) == expected, (name, method, path)
                if expected[0] == 401:
                    assert response.headers["www-authenticate"] == "Bearer"
                if db_rows(secured) != before:
                    let_through += 1
        assert let_through == 0
        # The token's principal is the signal's sender.
        sam = {"authorization": f"Bearer {TOKENS['signaller'][0]}"}
        assert (
            await http.post("/agent/a1/signal", json={"signal": "SIGUSR"}, headers=sam)
        ).status_code == 200
        events = (await http.get("/agent/a1/events", params={"limit": 1000}, headers=admin)).json()["events"]
        assert events[-1]["value"]["sender"] == "sam"


async def test_non_loopback_http_needs_tokens(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--http"):
        ElectricServer(ServerConfig(listen="127.0.0.1:0", http="0.0.0.0:0", data_dir=tmp_path))


async def test_http_port_in_use_refuses_to_start(
    door: ElectricServer, start_server: StartServer, tmp_path: Path
) -> None:
    assert door.http is not None
    with pytest.raises(ConfigError, match="for HTTP"):
        await start_server(tmp_path / "other", http=f"127.0.0.1:{door.http.port}")


# -- the CLI and curl -------------------------------------------------------------------------------------


def test_cli_serves_http_and_curl_signals(server_process: Callable[..., ServerProcess]) -> None:
    """`electric server --http` prints its address; curl spawns and signals; SIGTERM drains both."""
    proc = server_process(None, "--http", "127.0.0.1:0")
    assert proc.proc.stdout is not None
    line = proc.proc.stdout.readline()
    match = re.fullmatch(r"electric http listening on (http://127\.0\.0\.1:\d+)\n", line)
    assert match, line
    base = match.group(1)
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")

    def run_curl(*args: str) -> Any:
        done = subprocess.run(
            [curl, "-sS", "--max-time", "20", *args], capture_output=True, text=True, check=True
        )
        return json.loads(done.stdout)

    assert run_curl("-X", "PUT", f"{base}/agent/a1")["state"] == "spawning"
    answer = run_curl(
        "-X",
        "POST",
        f"{base}/agent/a1/signal",
        "-H",
        "content-type: application/json",
        "-d",
        '{"signal": "SIGTERM", "reason": "from curl"}',
    )
    assert (answer["signal"], answer["previous_state"], answer["new_state"]) == (
        "SIGTERM",
        "spawning",
        "spawning",  # no worker holds it: SIGTERM waits for one (outcome "ignored")
    )
    proc.send(signal.SIGTERM)
    assert proc.wait() == 0


def test_cli_refuses_non_loopback_http_without_tokens(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "electric_sdk.cli.main",
            "server",
            "--listen",
            "127.0.0.1:0",
            "--http",
            "0.0.0.0:0",
            "--data",
            str(tmp_path / "d"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "--http" in done.stderr


# -- fuzz -------------------------------------------------------------------------------------------------

NAMES = st.one_of(
    st.sampled_from(["agent", "a1", "other", "_x", ".", "..", "-", "a" * 129]),
    st.text(min_size=1, max_size=12).map(lambda t: t.replace("/", "_").replace("?", "_").replace("#", "_")),
)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
FIELDS = ["signal", "reason", "payload", "message_key", "selector", "profile", "text", "data", "bogus"]
BODIES = st.one_of(
    st.dictionaries(
        st.sampled_from(FIELDS), st.one_of(JSON_VALUES, st.sampled_from(["SIGTERM", "SIGUSR", "SIGKILL"]))
    ).map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=64),
    st.none(),
)
ROUTES = [
    ("PUT", "/{t}/{i}"),
    ("GET", "/{t}/{i}"),
    ("DELETE", "/{t}/{i}"),
    ("POST", "/{t}/{i}/signal"),
    ("POST", "/{t}/{i}/messages"),
    ("GET", "/{t}/{i}/events"),
    ("POST", "/signal"),
    ("GET", "/entities"),
    ("POST", "/_electric/entities/{t}/{i}/signal"),
]


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[tuple[TestServer, httpx.Client]]:
    with (
        TestServer(http="127.0.0.1:0", synchronous="NORMAL") as server,
        httpx.Client(base_url=server.http_address) as c,
    ):
        c.put("/agent/a1")
        yield server, c


@settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    route=st.sampled_from(ROUTES),
    type_=NAMES,
    id_=NAMES,
    content=BODIES,
    content_type=st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", None]),
    query=st.dictionaries(
        st.sampled_from(["type", "state", "offset", "limit", "page_token", "x"]),
        st.text(max_size=6),
        max_size=2,
    ),
)
def test_fuzz_never_500_and_refusals_write_nothing(
    fuzzed: tuple[TestServer, httpx.Client],
    route: tuple[str, str],
    type_: str,
    id_: str,
    content: bytes | None,
    content_type: str | None,
    query: dict[str, str],
) -> None:
    server, http = fuzzed
    method, template = route
    path = template.format(t=quote(type_, safe=""), i=quote(id_, safe=""))
    headers = {"content-type": content_type} if content_type else {}
    before = read_database(server.data_dir / "electric.db")
    response = http.request(method, path, content=content, headers=headers, params=query)
    assert response.status_code < 500, (method, path, content, response.text)
    if response.status_code >= 400:
        error_of(response)
        assert read_database(server.data_dir / "electric.db") == before, (method, path, content)


async def test_a_client_hanging_up_mid_body_is_one_quiet_line(
    door: ElectricServer, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that sends half its body and hangs up is its own doing: no traceback, no ERROR,
    and one INFO line however many do it (docs/server.md: no input yields a traceback)."""
    caplog.set_level(logging.INFO)
    assert door.http is not None
    host, port = door.http.address.removeprefix("http://").rsplit(":", 1)
    assert (await http.put("/agent/hangup")).status_code == 201
    for _ in range(50):
        _reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /agent/hangup/signal HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"signal": "SIG'
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()
    with anyio.fail_after(10):
        while not [r for r in caplog.records if "hung up" in r.getMessage()]:  # noqa: ASYNC110
            await anyio.sleep(0.01)  # a short pause between checks of a bounded wait (a log line)
    assert (await http.get("/agent/hangup")).status_code == 200  # it serves on
    assert len([r for r in caplog.records if "hung up" in r.getMessage()]) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    events = (await http.get("/agent/hangup/events")).json()["events"]
    assert [e["type"] for e in events] == ["state"]  # nothing written


async def test_a_malformed_chunked_body_refused_unread_logs_no_traceback(
    start_server: StartServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With --tokens a caller without one is refused before its body is read; when that body
    breaks HTTP/1.1's chunked framing, uvicorn answers 400 itself and h11 refuses the route's
    401 behind it. The client's fault: no traceback, no ERROR, a throttled line at most."""
    caplog.set_level(logging.INFO)
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS_TOML)
    tokens.chmod(0o600)
    server = await start_server(tmp_path / "secured", http="127.0.0.1:0", tokens_file=tokens)
    assert server.http is not None
    assert server.http._server is not None
    host, port = server.http.address.removeprefix("http://").rsplit(":", 1)
    for _ in range(20):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /agent/a1/signal HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Transfer-Encoding: chunked\r\n\r\nzz\r\n{"signal": "SIGTERM"}\r\n0\r\n\r\n'
        )
        answer = await reader.read()  # to the end: uvicorn closes after its 400
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        writer.close()
        await writer.wait_closed()
    state = server.http._server.server_state
    with anyio.fail_after(10):
        while state.tasks or not [r for r in caplog.records if "broke HTTP/1.1" in r.getMessage()]:  # noqa: ASYNC110
            await anyio.sleep(0.01)  # a short pause between checks of a bounded wait (every answer done)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert len([r for r in caplog.records if "broke HTTP/1.1" in r.getMessage()]) == 1
    assert len([r for r in caplog.records if "Invalid HTTP request" in r.getMessage()]) == 1
    async with httpx.AsyncClient(base_url=server.http.address) as client:
        headers = {"authorization": f"Bearer {TOKENS['admin'][0]}"}
        assert (await client.put("/agent/a1", headers=headers)).status_code == 201  # it serves on


async def test_what_the_openapi_document_bounds_the_door_refuses(
    door: ElectricServer, http: httpx.AsyncClient
) -> None:
    """The document's limits are the door's (docs/http.md, "What the document promises"): an
    Idempotency-Key outside 1-128 printable ASCII (an empty or blank one is no "no key"), a
    text or reason past the document's maxLength in characters, a null data or payload, an
    empty message_key; each refused with its reason, writing nothing."""
    assert (await http.put("/agent/lim")).status_code == 201
    before = read_database(door.config.data_dir / "electric.db")
    sigterm = {"signal": "SIGTERM"}
    for key in (b"", b"a b", "é".encode(), b"k" * 129):
        for method, path, body in (
            ("PUT", "/agent/lim2", None),
            ("DELETE", "/agent/lim", None),
            ("POST", "/agent/lim/signal", sigterm),
            ("POST", "/signal", {"selector": {"type": "agent"}, **sigterm}),
            ("POST", "/agent/lim/messages", {"text": "hi"}),
        ):
            refused = await http.request(method, path, json=body, headers={b"idempotency-key": key})
            assert error_of(refused) == (400, "INVALID_IDEMPOTENCY_KEY"), (key, method, path, refused.text)
    for path, body, expected in (
        ("/agent/lim/messages", {"text": "x" * 16385}, (413, "MESSAGE_TOO_LARGE")),
        ("/agent/lim/messages", {"text": "hi", "data": None}, (400, "INVALID_FIELD")),
        ("/agent/lim/signal", {"signal": "SIGTERM", "reason": "r" * 257}, (400, "REASON_TOO_LONG")),
        ("/agent/lim/signal", {"signal": "SIGUSR", "payload": None}, (400, "INVALID_FIELD")),
        # A key given is a key: an empty one is no "no key", with any signal.
        ("/agent/lim/signal", {"signal": "SIGINT", "message_key": ""}, (400, "INVALID_NAME")),
        ("/agent/lim/signal", {"signal": "SIGUSR", "message_key": ""}, (400, "INVALID_NAME")),
        ("/agent/lim/fork", {"id": "f", "reason": "r" * 257}, (400, "REASON_TOO_LONG")),
    ):
        assert error_of(await http.post(path, json=body)) == expected, (path, body)
    for params in ({"wait": ""}, {"timeout": "soon"}, {"timeout": ""}):
        refused = await http.post("/agent/lim/messages", params=params, json={"text": "hi"})
        assert refused.status_code == 400, (params, refused.text)
    assert read_database(door.config.data_dir / "electric.db") == before
    # At the limits, taken; a timeout without wait is checked and unused (no run in the answer).
    taken = await http.post("/agent/lim/messages", params={"timeout": "2h"}, json={"text": "é" * 16384})
    assert taken.status_code == 200, taken.text
    assert "run" not in taken.json()
    signalled = await http.post("/agent/lim/signal", json={"signal": "SIGHUP", "reason": "é" * 256})
    assert signalled.status_code == 200, signalled.text
