"""The A2A face (docs/a2a.md) driven by the official JavaScript client, @a2a-js/sdk 1.3.0
(tests/a2a_js/client.mjs): card discovery with a token (and refused without one), a streamed
send, a cancel mid-run and the cancel of the ended task. A real server and worker; the entity's
stream says what the client's calls did."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from electric_sdk import AsyncClient
from electric_sdk.testing import TestServer

from .rt_support import running_worker
from .test_a2a import ALL, TOKENS, _app

HERE = Path(__file__).resolve().parent.parent / "a2a_js"
NODE, NPM = shutil.which("node"), shutil.which("npm")

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        (NODE is None or NPM is None) and os.environ.get("CI") != "true",
        reason="Node.js/npm not found (@a2a-js/sdk runs on Node)",
    ),
]


@pytest.fixture(scope="module")
def a2a_js() -> Path:
    """@a2a-js/sdk, from tests/a2a_js/package-lock.json."""
    assert NODE is not None, "node not found: CI must run the JavaScript client"
    assert NPM is not None, "npm not found: CI must run the JavaScript client"
    if not (HERE / "node_modules" / "@a2a-js" / "sdk").is_dir():
        subprocess.run(
            [NPM, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=HERE, check=True, timeout=300
        )
    return HERE / "client.mjs"


@pytest.fixture
def a2a_server(tmp_path: Path) -> Iterator[TestServer]:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    with TestServer(tmp_path / "electric", http="127.0.0.1:0", a2a=True, tokens_file=tokens) as server:
        yield server


@pytest.fixture
async def native(a2a_server: TestServer) -> AsyncIterator[AsyncClient]:
    async with a2a_server.async_client(token=ALL) as c:
        yield c


async def test_the_javascript_client_sends_streams_and_cancels(
    a2a_js: Path, a2a_server: TestServer, native: AsyncClient
) -> None:
    assert NODE is not None
    # With a trailing slash: the JavaScript client resolves the card path relative to it.
    url = a2a_server.http_address + "/_electric/a2a/types/agent/"
    async with running_worker(_app(), a2a_server.address, token=ALL):
        with anyio.fail_after(120):
            done = await anyio.run_process([NODE, str(a2a_js), url, ALL, "js1"], check=False)
    assert done.returncode == 0, done.stderr.decode()
    seen = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert "401" in seen["refused"]
    assert seen["states"][0] == 1  # TASK_STATE_SUBMITTED
    assert seen["states"][-1] == 3  # TASK_STATE_COMPLETED
    assert seen["artifact"] == "echo: hi"
    assert seen["canceled"] == 5  # TASK_STATE_CANCELED
    assert seen["again"] != "answered"  # TaskNotCancelable
    events = (await native.events("agent/js1", 0, 200)).events
    (sigint,) = [e for e in events if e.type == "signal" and e.operation == "insert"]
    assert sigint.value["sender"] == "a2a-caller"
    assert sigint.value["message_key"]
    aborted = [e for e in events if e.type == "run" and e.value["status"] == "aborted"]
    assert [e.value["message_key"] for e in aborted] == [sigint.value["message_key"]]
