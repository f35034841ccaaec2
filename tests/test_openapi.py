"""The HTTP door's OpenAPI document: valid, committed as generated, served, and true to the door.

The document is generated from ``routes.ROUTES``, the table the door builds
its routes from; these tests hold the three together (the table, the committed
``docs/openapi.json`` with docs/http.md's error table, and what a running
server routes). tests/test_schemathesis.py fuzzes the server from the document.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import jsonschema
import pytest
from electric_server.app import ElectricServer
from electric_server.core.errors import HTTP_STATUS
from electric_server.http.door import HttpDoor
from electric_server.http.openapi import ERROR_CODES, document, error_table, render
from electric_server.http.routes import ROUTES, served_paths
from electric_server.http.streams import EntityStreams
from openapi_spec_validator import validate
from starlette.routing import Route
from test_auth import TOKENS, TOKENS_TOML

if TYPE_CHECKING:
    from conftest import StartServer

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.anyio


def test_document_is_valid_openapi_3_1() -> None:
    doc = document()
    assert doc["openapi"].startswith("3.1")
    validate(doc)  # raises OpenAPIValidationError, naming what is wrong


def test_committed_document_and_error_table_are_fresh() -> None:
    """docs/openapi.json and docs/http.md's error table are what the route table generates."""
    committed = (ROOT / "docs" / "openapi.json").read_text(encoding="utf-8")
    assert committed == render(), "docs/openapi.json is stale: run `make openapi`"
    assert error_table() in (ROOT / "docs" / "http.md").read_text(encoding="utf-8"), (
        "docs/http.md's error table is stale: run `make openapi`"
    )
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "genopenapi.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_every_http_status_has_its_codes_and_the_codes_exist() -> None:
    """A status errors.HTTP_STATUS maps to is documented; every documented code is raised somewhere."""
    assert {status for status in HTTP_STATUS.values()} == set(ERROR_CODES)
    sources = "".join(
        p.read_text(encoding="utf-8")
        for p in [
            *(ROOT / "server" / "electric_server").rglob("*.py"),
            ROOT / "electric_sdk" / "lifecycle.py",
        ]
        if p.name != "openapi.py"
    )
    for codes in ERROR_CODES.values():
        for code in codes:
            assert f'"{code}"' in sources, f"{code} is documented but no server code raises it"


async def test_every_route_of_the_door_is_in_the_document(door: ElectricServer) -> None:
    """What the running door routes is what the document says, and the reverse (the routes the
    table gives http/streams.py included: the server gives its door the live reads)."""
    assert door.http is not None
    routed = {
        (route.path, method)
        for route in door.http.routes
        if isinstance(route, Route) and "{rest:path}" not in route.path
        for method in route.methods or ()
        if method != "HEAD"
    }
    documented = {(path, method.upper()) for path, ops in document()["paths"].items() for method in ops}
    elsewhere = {
        (path, route.method)
        for route in ROUTES
        if not route.served_by_door
        for path, _operation in served_paths(route)
    }
    assert routed == documented
    assert elsewhere, "the table describes the streaming routes served by http_streams"


async def test_openapi_json_is_served_and_needs_read_with_tokens(
    http: httpx.AsyncClient, start_server: StartServer, tmp_path: Path
) -> None:
    answer = await http.get("/openapi.json")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == json.loads(render())
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS_TOML)
    tokens.chmod(0o600)
    secured = await start_server(tmp_path / "secured", http="127.0.0.1:0", tokens_file=tokens)
    assert secured.http is not None
    async with httpx.AsyncClient(base_url=secured.http.address) as client:
        assert (await client.get("/openapi.json")).status_code == 401
        for name, status in (("sender", 403), ("reader", 200), ("typed", 200), ("admin", 200)):
            headers = {"authorization": f"Bearer {TOKENS[name][0]}"}
            got = await client.get("/openapi.json", headers=headers)
            assert got.status_code == status, (name, got.text)
        assert (await client.get("/healthz")).status_code == 200  # the probes stay open


def test_docs_show_curl_for_every_route() -> None:
    """docs/http.md has a curl command for each route this door serves (in its short form)."""
    page = (ROOT / "docs" / "http.md").read_text(encoding="utf-8")
    calls = set()
    for command in re.findall(r"^curl [^\n]*", page, flags=re.MULTILINE):
        method = re.search(r"-X (\w+)", command)
        path = re.search(r"\$H(/[^\s\"'?]*)", command)
        if path:
            calls.add((method.group(1) if method else "GET", path.group(1)))
    for route in ROUTES:
        if not route.served_by_door:
            continue
        pattern = re.compile(re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(route.path)) + "$")
        shown = [path for method, path in calls if method == route.method and pattern.match(path)]
        assert shown, f"docs/http.md shows no curl for {route.method} {route.path}"


async def test_undocumented_methods_are_405_naming_the_documented_ones(http: httpx.AsyncClient) -> None:
    """Every path the door serves answers a method the document does not list with 405 and an
    ``Allow`` of exactly the documented methods (one route per path, the /_electric aliases too)."""
    served = {route.operation for route in ROUTES if route.served_by_door}
    for path, operations in document()["paths"].items():
        documented = {
            method.upper()
            for method, op in operations.items()
            if op["operationId"].removesuffix("Electric") in served
        }
        if not documented:
            continue
        url = path.replace("{type}", "agent").replace("{id}", "a1")
        for method in {"GET", "POST", "PUT", "DELETE", "PATCH"} - documented:
            answer = await http.request(method, url)
            assert answer.status_code == 405, (method, url, answer.text)
            assert answer.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
            allowed = {m.strip() for m in answer.headers["allow"].split(",")} - {"HEAD", "OPTIONS"}
            assert allowed == documented, (method, url, answer.headers["allow"])


async def test_a_whole_number_written_with_a_fraction_is_an_integer(http: httpx.AsyncClient) -> None:
    """The document's ``integer`` is JSON Schema's, which takes 5000.0; so does the door."""
    spawned = await http.put("/agent/a1", json={"profile": {"grace_period_ms": 5000.0}})
    assert spawned.status_code == 201, spawned.text
    assert spawned.json()["profile"]["grace_period_ms"] == 5000
    fraction = await http.put("/agent/a2", json={"profile": {"grace_period_ms": 5000.5}})
    assert fraction.status_code == 400
    assert fraction.json()["error"]["code"] == "INVALID_FIELD"


async def test_the_live_reads_mount_when_the_door_is_given_the_streams(door: ElectricServer) -> None:
    """The table's live reads (http/streams.py's handlers) are served once the door is given the
    streams; without them the stream route is not there and ``live`` is an unknown parameter."""
    assert door.http is not None
    assert {route.operation for route in ROUTES if not route.served_by_door} == {"readStream"}
    handed_over = {(route.operation, p.name) for route in ROUTES for p in route.query if p.handler}
    # sendMessage's and signalEntity's waits are served by every door (http/waits.py,
    # http/signal_waits.py): they need no live reads.
    assert handed_over == {
        ("listEntities", "live"),
        ("sendMessage", "wait"),
        ("sendMessage", "timeout"),
        ("signalEntity", "wait"),
        ("signalEntity", "timeout"),
    }
    service, readiness = door.http.service, door.http.readiness
    # Draining from the start: the SSE watch then answers at once that the server is going away.
    config = door.config
    streams = EntityStreams(
        service,
        lambda: True,
        heartbeat_s=config.sse_heartbeat_ms / 1000,
        long_poll_s=config.http_long_poll_ms / 1000,
    )
    served = HttpDoor(service, None, readiness, "127.0.0.1:0", streams=streams)
    transport = httpx.ASGITransport(app=served.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://door") as http:
        for path in ("/agent/nobody/stream", "/_electric/entities/agent/nobody/stream"):
            stream = await http.get(path, params={"offset": "-1"})
            assert stream.status_code == 404, stream.text
            assert stream.json()["error"]["code"] == "ENTITY_NOT_FOUND"  # the read's own answer
        assert (await http.post("/agent/a1/stream")).status_code == 405  # writes are refused
        live = await http.get("/entities", params={"live": "sse"})
        assert live.status_code == 503, live.text
        assert live.json()["error"]["code"] == "SERVER_DRAINING"
        listed = await http.get("/entities")
        assert listed.json()["entities"] == []
    bare = HttpDoor(service, None, readiness, "127.0.0.1:0")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=bare.app), base_url="http://door"
    ) as plain:
        refused = await plain.get("/entities", params={"live": "sse"})
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "UNKNOWN_FIELD"
        missing = await plain.get("/agent/a1/stream")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "ROUTE_NOT_FOUND"


async def test_waiting_for_a_run_over_http_needs_read_as_well_as_send(
    start_server: StartServer, tmp_path: Path
) -> None:
    """``?wait=run`` answers with the run's output: a sender without ``read`` is refused before
    anything is sent; one with both waits (here 1 ms: no worker hosts the type)."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS_TOML)
    tokens.chmod(0o600)
    secured = await start_server(tmp_path / "secured", http="127.0.0.1:0", tokens_file=tokens)
    assert secured.http is not None
    typed = {"authorization": f"Bearer {TOKENS['typed'][0]}"}
    sender = {"authorization": f"Bearer {TOKENS['sender'][0]}"}
    async with httpx.AsyncClient(base_url=secured.http.address) as client:
        assert (await client.put("/agent/w1", headers=typed)).status_code == 201
        head = (await client.get("/agent/w1", headers=typed)).json()["head_offset"]
        wait = {"wait": "run", "timeout": "1ms"}
        refused = await client.post("/agent/w1/messages", params=wait, json={"text": "x"}, headers=sender)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "MISSING_SCOPE"
        assert (await client.get("/agent/w1", headers=typed)).json()["head_offset"] == head
        waited = await client.post("/agent/w1/messages", params=wait, json={"text": "x"}, headers=typed)
        assert waited.status_code == 200, waited.text
        assert waited.json()["run"] | {"message_key": ""} == {
            "message_key": "",
            "status": "queued",
            "ended": False,
            "started": False,
            "attempt": 0,
            "output": None,
            "error": None,
            "entity_state": "spawning",
        }


def test_a_version_choice_the_document_allows_is_one_the_service_takes() -> None:
    """SetVersion's rules the fuzz cannot reach (no worker announces a type there): a ramp is a
    version and its 1-100 share together, or neither (INVALID_RAMP); a version is a label
    (INVALID_CODE_VERSION)."""
    schemas = document()["components"]["schemas"]
    validator = jsonschema.Draft202012Validator(schemas["SetVersionRequest"])
    for body, allowed in (
        ({}, True),
        ({"code_version": "1.9.0", "ramp_version": "", "ramp_percent": None}, True),
        ({"ramp_version": "2.0.1", "ramp_percent": 10}, True),
        ({"ramp_version": "2.0.1"}, False),
        ({"ramp_version": "2.0.1", "ramp_percent": 0}, False),
        ({"ramp_percent": 5}, False),
        ({"code_version": "1.9\x01"}, False),
        ({"code_version": "v" * 129}, False),
    ):
        assert validator.is_valid(body) is allowed, body
