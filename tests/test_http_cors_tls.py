"""The HTTP door's CORS allowlist, its TLS, and who may listen beyond loopback.

CORS is off unless ``--cors-origin`` names origins: then a browser's preflight
from one of them is answered (Authorization and Idempotency-Key allowed), the
stream headers are exposed to its scripts, and any other origin gets no
``Access-Control-Allow-Origin``. With ``--tls-cert``/``--tls-key`` the door is
HTTPS with the gRPC door's certificate, verified here by httpx against a
self-signed certificate made for the test.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from electric_server import ConfigError
from electric_server.app import ElectricServer, ServerConfig
from test_auth import TOKENS_TOML, certificate  # noqa: F401  # the fixture: a self-signed cert

if TYPE_CHECKING:
    from conftest import StartServer

pytestmark = pytest.mark.anyio

ALLOWED = "https://a.example"
PREFLIGHT = {
    "origin": ALLOWED,
    "access-control-request-method": "POST",
    "access-control-request-headers": "authorization, idempotency-key, content-type",
}


def _listed(value: str | None) -> set[str]:
    return {v.strip().lower() for v in (value or "").split(",") if v.strip()}


async def test_cors_is_off_by_default(http: httpx.AsyncClient) -> None:
    preflight = await http.options("/agent/a1/signal", headers=PREFLIGHT)
    assert preflight.status_code == 405  # no CORS: OPTIONS is a method no route has
    assert "access-control-allow-origin" not in preflight.headers
    answer = await http.get("/entities", headers={"origin": ALLOWED})
    assert answer.status_code == 200
    assert "access-control-allow-origin" not in answer.headers


async def test_cors_allowlist_answers_preflights_and_exposes_stream_headers(
    start_server: StartServer,
) -> None:
    server = await start_server(http="127.0.0.1:0", cors_origins=(ALLOWED, "http://localhost:5173"))
    assert server.http is not None
    async with httpx.AsyncClient(base_url=server.http.address) as http:
        preflight = await http.options("/agent/a1/signal", headers=PREFLIGHT)
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == ALLOWED
        assert {"authorization", "idempotency-key", "content-type"} <= _listed(
            preflight.headers["access-control-allow-headers"]
        )
        assert "POST" in preflight.headers["access-control-allow-methods"]

        spawned = await http.put("/agent/a1", headers={"origin": ALLOWED})
        assert spawned.status_code == 201
        assert spawned.headers["access-control-allow-origin"] == ALLOWED
        exposed = _listed(spawned.headers["access-control-expose-headers"])
        assert {"stream-next-offset", "stream-up-to-date", "etag"} <= exposed

        other = {**PREFLIGHT, "origin": "https://b.example"}
        refused = await http.options("/agent/a1/signal", headers=other)
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "CORS_REFUSED"  # the door's error body
        assert "origin" in refused.json()["error"]["message"]
        assert "access-control-allow-origin" not in refused.headers
        read = await http.get("/agent/a1", headers={"origin": "https://b.example"})
        assert read.status_code == 200  # served (CORS is the browser's to enforce), but not allowed
        assert "access-control-allow-origin" not in read.headers


@pytest.mark.parametrize(
    ("origins", "http", "words"),
    [
        (("https://a.example/",), "127.0.0.1:0", "--cors-origin must be an origin"),
        (("*",), "127.0.0.1:0", "--cors-origin must be an origin"),
        (("https://A.example",), "127.0.0.1:0", "lower case"),
        (("a.example",), "127.0.0.1:0", "SCHEME://HOST"),
        ((ALLOWED,), None, "--cors-origin needs --http"),
    ],
)
def test_bad_cors_origins_refuse_to_start(
    tmp_path: Path, origins: tuple[str, ...], http: str | None, words: str
) -> None:
    with pytest.raises(ConfigError, match=words.replace("*", r"\*")):
        ElectricServer(ServerConfig(listen="127.0.0.1:0", http=http, cors_origins=origins, data_dir=tmp_path))


@pytest.mark.parametrize("command", ["server", "dev"])
def test_cli_takes_cors_origin(tmp_path: Path, command: str) -> None:
    """`electric server` and `electric dev` pass --cors-origin to the server (a bad one: exit 2)."""
    origins = ["--cors-origin", ALLOWED, "--cors-origin", "https://b.example/path"]
    where = ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data", str(tmp_path / "d")]
    command = [sys.executable, "-m", "electric_sdk.cli.main", command, *where, *origins]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "'https://b.example/path'" in done.stderr


# -- TLS --------------------------------------------------------------------------------------------


async def test_https_with_the_grpc_certificate(
    start_server: StartServer,
    certificate: tuple[Path, Path],  # noqa: F811
) -> None:
    cert, key = certificate
    server = await start_server(http="127.0.0.1:0", tls_cert=cert, tls_key=key)
    assert server.http is not None
    assert server.http.address.startswith("https://127.0.0.1:")
    trusted = ssl.create_default_context(cafile=str(cert))
    async with httpx.AsyncClient(base_url=server.http.address, verify=trusted) as https:
        assert (await https.put("/agent/a1")).status_code == 201
        got = await https.get("/agent/a1")
        assert got.json()["url"] == "/agent/a1"
    async with httpx.AsyncClient(verify=ssl.create_default_context()) as untrusting:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await untrusting.get(f"{server.http.address}/healthz")
    plain_address = server.http.address.replace("https://", "http://")
    async with httpx.AsyncClient() as plain:
        with pytest.raises(httpx.HTTPError):  # no HTTP without TLS on that port
            await plain.get(f"{plain_address}/healthz")


async def test_non_loopback_http_with_insecure_or_tokens(start_server: StartServer, tmp_path: Path) -> None:
    """A non-loopback --http is refused without tokens (test_http), and served with --insecure or
    with --tokens."""
    insecure = await start_server(tmp_path / "insecure", http="0.0.0.0:0", insecure=True)
    assert insecure.http is not None
    async with httpx.AsyncClient() as client:
        got = await client.get(f"http://127.0.0.1:{insecure.http.port}/healthz")
        assert got.status_code == 200
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS_TOML)
    tokens.chmod(0o600)
    secured = await start_server(tmp_path / "secured", http="0.0.0.0:0", tokens_file=tokens)
    assert secured.http is not None
    async with httpx.AsyncClient() as client:
        refused = await client.get(f"http://127.0.0.1:{secured.http.port}/entities")
        assert refused.status_code == 401
