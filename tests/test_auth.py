"""Bearer tokens, scopes, type restrictions, TLS and the listen-address guard (ARCHITECTURE §7).

Every denial is a specific status + ErrorInfo reason and writes nothing.
Configuration errors make `electric server` exit 2 with a message, before
anything is started or written.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import grpc
import httpx
import pytest
from electric_server.app import ElectricServer
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb

if TYPE_CHECKING:
    from conftest import DbRows, StartServer

    from electric_sdk._proto.electric.v1.entity_service_pb2_grpc import EntityServiceAsyncStub as Stub

pytestmark = pytest.mark.anyio

Code = grpc.StatusCode
Metadata = list[tuple[str, str]]

A1 = pb.EntityRef(type="agent", id="a1")
O1 = pb.EntityRef(type="other", id="o1")
NEW = pb.EntityRef(type="agent", id="new")
TOKENS = {
    "admin": ("admin-token-0001", "root", ["admin"]),
    "reader": ("reader-token-01", "rita", ["read"]),
    "signaller": ("signal-token-01", "sam", ["signal"]),
    "sender": ("sender-token-01", "sue", ["send"]),
    "worker": ("runtime-token-1", "wally", ["runtime"]),
    "typed": ("typed-token-001", "tess", ["read", "signal", "send"]),
}
TOKENS_TOML = "\n".join(
    f'[[tokens]]\ntoken = "{token}"\nprincipal = "{principal}"\nscopes = {scopes!r}\n'
    + ('types = ["agent"]\n' if name == "typed" else "")
    for name, (token, principal, scopes) in TOKENS.items()
).replace("'", '"')


def auth(name: str) -> Metadata:
    return [("authorization", f"Bearer {TOKENS[name][0]}")]


STREAMS = {"WatchEvents", "WatchEntities"}


async def invoke(stub: Stub, method: str, request: Message, metadata: Metadata) -> object:
    """Call an EntityService method; for a stream, its first item."""
    rpc = getattr(stub, method)
    if method not in STREAMS:
        response: object = await rpc(request, metadata=metadata)
        return response
    stream = rpc(request, metadata=metadata)
    try:
        item: object = await stream.read()
        return item
    finally:
        stream.cancel()


# Each method with its scope group and a request that succeeds with an admin token.
METHODS: dict[str, tuple[str, Message]] = {
    "GetEntity": ("read", api.GetEntityRequest(ref=A1)),
    "ListEntities": ("read", api.ListEntitiesRequest()),
    "ReadEvents": ("read", api.ReadEventsRequest(ref=A1)),
    "WatchEvents": ("read", api.WatchEventsRequest(ref=A1)),
    "WatchEntities": ("read", api.WatchEntitiesRequest()),
    "ListVersions": ("read", api.ListVersionsRequest(type="agent")),
    "SignalEntity": ("signal", api.SignalEntityRequest(ref=A1, signal=pb.SIGNAL_SIGSTOP)),
    "SignalEntities": (
        "signal",
        api.SignalEntitiesRequest(selector=api.EntitySelector(type="agent"), signal=pb.SIGNAL_SIGHUP),
    ),
    "DeleteEntity": ("signal", api.DeleteEntityRequest(ref=A1)),
    "SpawnEntity": ("send", api.SpawnEntityRequest(ref=NEW)),
    "SendMessage": ("send", api.SendMessageRequest(ref=A1, text="hi")),
    "ForkEntity": ("send", api.ForkEntityRequest(origin=A1, id="a1-fork")),
}


def error_reason(err: grpc.aio.AioRpcError) -> str:
    assert err.code() is not Code.UNKNOWN, err.details()
    status = rpc_status.from_call(err)
    assert status is not None, f"no google.rpc.Status on {err.code()}: {err.details()}"
    (detail,) = status.details
    info = error_details_pb2.ErrorInfo()
    assert detail.Unpack(info)
    assert info.domain == "electric.v1"
    return str(info.reason)


async def denied(call: Awaitable[object]) -> tuple[Code, str]:
    with anyio.fail_after(10), pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), error_reason(info.value)


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(TOKENS_TOML)
    path.chmod(0o600)  # a tokens file others may read is refused
    return path


@pytest.fixture
async def secured(start_server: StartServer, tokens_file: Path) -> AsyncIterator[tuple[ElectricServer, Stub]]:
    """A server with tokens; agent/a1 and other/o1 spawned by the admin."""
    srv = await start_server(tokens_file=tokens_file)
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        for r in (A1, O1):
            await stub.SpawnEntity(api.SpawnEntityRequest(ref=r), metadata=auth("admin"))
        yield srv, stub


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize(
    "metadata",
    [
        [],
        [("authorization", "Bearer wrong-token-0001")],
        [("authorization", f"Basic {TOKENS['admin'][0]}")],
        [("authorization", "Bearer ")],
        [("x-token", TOKENS["admin"][0])],
    ],
    ids=["none", "wrong", "basic-scheme", "empty-bearer", "other-header"],
)
async def test_unauthenticated(
    secured: tuple[ElectricServer, Stub],
    db_rows: Callable[[ElectricServer], DbRows],
    method: str,
    metadata: list[tuple[str, str]],
) -> None:
    srv, stub = secured
    before = db_rows(srv)
    call = invoke(stub, method, METHODS[method][1], metadata)
    assert await denied(call) == (Code.UNAUTHENTICATED, "UNAUTHENTICATED")
    assert db_rows(srv) == before


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("token", ["admin", "reader", "signaller", "sender", "worker"])
async def test_scope_matrix(
    secured: tuple[ElectricServer, Stub],
    db_rows: Callable[[ElectricServer], DbRows],
    method: str,
    token: str,
) -> None:
    srv, stub = secured
    scope, request = METHODS[method]
    scopes = TOKENS[token][2]
    before = db_rows(srv)
    call = invoke(stub, method, request, auth(token))
    if scope in scopes or "admin" in scopes:
        with anyio.fail_after(10):
            await call
    else:
        assert await denied(call) == (Code.PERMISSION_DENIED, "MISSING_SCOPE")
        assert db_rows(srv) == before


def _kill_selector(**kw: Any) -> tuple[str, Message]:
    return "SignalEntities", api.SignalEntitiesRequest(
        selector=api.EntitySelector(**kw), signal=pb.SIGNAL_SIGKILL
    )


# The "typed" token may only name type "agent".
TYPED_ALLOWED: dict[str, tuple[str, Message]] = {
    **{method: (method, request) for method, (_, request) in METHODS.items() if "Entities" not in method},
    "SignalEntities-type": ("SignalEntities", METHODS["SignalEntities"][1]),
    "SignalEntities-refs": _kill_selector(refs=[A1]),
    "ListEntities-type": ("ListEntities", api.ListEntitiesRequest(type="agent")),
    "WatchEntities-type": ("WatchEntities", api.WatchEntitiesRequest(type="agent")),
}
TYPED_DENIED: dict[str, tuple[str, Message]] = {
    "GetEntity": ("GetEntity", api.GetEntityRequest(ref=O1)),
    "ReadEvents": ("ReadEvents", api.ReadEventsRequest(ref=O1)),
    "WatchEvents": ("WatchEvents", api.WatchEventsRequest(ref=O1)),
    "SignalEntity": ("SignalEntity", api.SignalEntityRequest(ref=O1, signal=pb.SIGNAL_SIGKILL)),
    "ForkEntity": ("ForkEntity", api.ForkEntityRequest(origin=O1, id="o1-fork")),
    "RetryRun": ("RetryRun", api.RetryRunRequest(ref=O1, run="msg_1")),
    "DeleteEntity": ("DeleteEntity", api.DeleteEntityRequest(ref=O1)),
    "SendMessage": ("SendMessage", api.SendMessageRequest(ref=O1, text="hi")),
    "SpawnEntity": ("SpawnEntity", api.SpawnEntityRequest(ref=pb.EntityRef(type="other", id="new"))),
    "ListEntities-all-types": ("ListEntities", api.ListEntitiesRequest()),
    "ListEntities-other": ("ListEntities", api.ListEntitiesRequest(type="other")),
    "ListEntities-states-only": ("ListEntities", api.ListEntitiesRequest(states=[pb.STATE_SPAWNING])),
    "WatchEntities-all-types": ("WatchEntities", api.WatchEntitiesRequest()),
    "WatchEntities-other": ("WatchEntities", api.WatchEntitiesRequest(type="other")),
    "selector-mixed-refs": _kill_selector(refs=[A1, O1]),
    "selector-other-type": _kill_selector(type="other"),
    "selector-states-only": _kill_selector(states=[pb.STATE_SPAWNING]),
}


@pytest.mark.parametrize("case", list(TYPED_ALLOWED))
async def test_type_restricted_token_allowed_type(secured: tuple[ElectricServer, Stub], case: str) -> None:
    _, stub = secured
    with anyio.fail_after(10):
        result = await invoke(stub, *TYPED_ALLOWED[case], auth("typed"))
    if isinstance(result, api.ListEntitiesResponse):
        assert [e.ref.type for e in result.entities] == ["agent"]
    if isinstance(result, api.WatchEntitiesResponse):
        assert [e.ref.type for e in result.snapshot.entities] == ["agent"]


@pytest.mark.parametrize("case", list(TYPED_DENIED))
async def test_type_restricted_token_other_type_denied(
    secured: tuple[ElectricServer, Stub], db_rows: Callable[[ElectricServer], DbRows], case: str
) -> None:
    srv, stub = secured
    before = db_rows(srv)
    call = invoke(stub, *TYPED_DENIED[case], auth("typed"))
    assert await denied(call) == (Code.PERMISSION_DENIED, "TYPE_NOT_ALLOWED")
    assert db_rows(srv) == before
    a1 = await stub.GetEntity(api.GetEntityRequest(ref=A1), metadata=auth("admin"))
    assert a1.entity.state == pb.STATE_SPAWNING  # a mixed selector signalled nobody


async def last_values(stub: Stub, metadata: Metadata) -> tuple[pb.SignalValue, pb.MessageValue]:
    page = await stub.ReadEvents(api.ReadEventsRequest(ref=A1), metadata=metadata)
    signals = [e.signal for e in page.events if e.type == "signal"]
    messages = [e.message for e in page.events if e.type == "message"]
    return signals[-1], messages[-1]


async def test_principal_is_the_sender(secured: tuple[ElectricServer, Stub]) -> None:
    _, stub = secured
    await stub.SignalEntity(
        api.SignalEntityRequest(ref=A1, signal=pb.SIGNAL_SIGUSR), metadata=auth("signaller")
    )
    await stub.SendMessage(api.SendMessageRequest(ref=A1, text="hi"), metadata=auth("sender"))
    sig, msg = await last_values(stub, auth("reader"))
    assert (sig.signal, sig.sender, msg.sender) == (pb.SIGNAL_SIGUSR, "sam", "sue")
    await stub.SignalEntities(
        api.SignalEntitiesRequest(selector=api.EntitySelector(refs=[A1]), signal=pb.SIGNAL_SIGSTOP),
        metadata=auth("typed"),
    )
    await stub.SendMessage(api.SendMessageRequest(ref=A1, text="hi"), metadata=auth("admin"))
    sig, msg = await last_values(stub, auth("reader"))
    assert (sig.signal, sig.sender, msg.sender) == (pb.SIGNAL_SIGSTOP, "tess", "root")


async def test_a_signal_answered_at_a_stage_needs_read_too(secured: tuple[ElectricServer, Stub]) -> None:
    """The stages are read from the entity's stream: `signal` alone may not wait (nothing is
    written); `read` and `signal` together may."""
    _, stub = secured
    head = (await stub.ReadEvents(api.ReadEventsRequest(ref=A1), metadata=auth("admin"))).head_offset
    waited = api.SignalEntityRequest(ref=A1, signal=pb.SIGNAL_SIGSTOP, wait="accepted")
    assert await denied(stub.SignalEntity(waited, metadata=auth("signaller"))) == (
        Code.PERMISSION_DENIED,
        "MISSING_SCOPE",
    )
    after = (await stub.ReadEvents(api.ReadEventsRequest(ref=A1), metadata=auth("admin"))).head_offset
    assert after == head
    answer = await stub.SignalEntity(waited, metadata=auth("typed"))
    assert [(s.stage, s.reached) for s in answer.stages] == [("accepted", True)]


async def test_sender_is_anonymous_without_tokens(stub: Stub) -> None:
    await stub.SpawnEntity(api.SpawnEntityRequest(ref=A1))
    await stub.SignalEntity(api.SignalEntityRequest(ref=A1, signal=pb.SIGNAL_SIGSTOP))
    await stub.SendMessage(api.SendMessageRequest(ref=A1, text="hi"))
    sig, msg = await last_values(stub, [])
    assert (sig.sender, msg.sender) == ("anonymous", "anonymous")


async def test_health_and_reflection_need_no_token(secured: tuple[ElectricServer, Stub]) -> None:
    srv, _ = secured
    async with grpc.aio.insecure_channel(srv.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(health_pb2.HealthCheckRequest(service="electric.v1.EntityService"))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = reflection.ServerReflectionInfo()
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        answer = await call.read()
        await call.done_writing()
        names = {s.name for s in answer.list_services_response.service}
        assert "electric.v1.EntityService" in names


# -- configuration: exit 2 before anything starts --------------------------------------------


def electric_server(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "electric_sdk.cli.main", "server", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


ENTRY = '[[tokens]]\ntoken = "long-enough-1"\nprincipal = "p"\n'
BAD_TOKEN_FILES: dict[str, tuple[str | None, str]] = {
    "missing-file": (None, "cannot read tokens file"),
    "bad-toml": ("[[tokens]\ntoken = ", "cannot read tokens file"),
    "no-tokens": ("# nothing\n", "expected one or more [[tokens]]"),
    "not-tables": ("tokens = [1, 2]\n", "expected one or more [[tokens]]"),
    "missing-scopes": (ENTRY, "`scopes` must be a non-empty list"),
    "empty-scopes": (ENTRY + "scopes = []\n", "`scopes` must be a non-empty list"),
    "unknown-scope": (ENTRY + 'scopes = ["root"]\n', "`scopes` must be a non-empty list"),
    "nested-scopes": (ENTRY + 'scopes = [["read"]]\n', "`scopes` must be a non-empty list"),
    "short-token": ('[[tokens]]\ntoken = "short"\nprincipal = "p"\nscopes = ["read"]\n', "at least 8"),
    "no-principal": ('[[tokens]]\ntoken = "long-enough-1"\nscopes = ["read"]\n', "`principal`"),
    "types-not-list": (ENTRY + 'scopes = ["read"]\ntypes = "agent"\n', "`types` must be a list"),
    "duplicate": ((ENTRY + 'scopes = ["read"]\n') * 2, "#2: duplicate token"),
    "typo-types": (
        ENTRY + 'scopes = ["read"]\ntype = ["agent"]\n',
        "unknown key `type` (did you mean `types`?)",
    ),
    "unknown-key": (ENTRY + 'scopes = ["read"]\nowner = "ops"\n', "unknown key `owner`"),
    "top-level-key": ("version = 2\n" + ENTRY + 'scopes = ["read"]\n', "unknown key `version`"),
    "expires-text": (
        ENTRY + 'scopes = ["read"]\nexpires = "tomorrow"\n',
        "`expires` must be a TOML date-time",
    ),
    "expires-local": (ENTRY + 'scopes = ["read"]\nexpires = 2027-01-01T00:00:00\n', "with its offset"),
}


@pytest.mark.parametrize("case", list(BAD_TOKEN_FILES))
def test_bad_tokens_file_exits_2(tmp_path: Path, case: str) -> None:
    content, message = BAD_TOKEN_FILES[case]
    tokens = tmp_path / "tokens.toml"
    if content is not None:
        tokens.write_text(content)
        tokens.chmod(0o600)
    data = tmp_path / "data"
    result = electric_server("--listen", "127.0.0.1:0", "--data", str(data), "--tokens", str(tokens))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("electric server: ")
    assert message in result.stderr
    assert str(tokens) in result.stderr
    assert "Traceback" not in result.stderr
    assert not data.exists()


def test_non_loopback_without_tokens_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    result = electric_server("--listen", "0.0.0.0:0", "--data", str(data))
    assert result.returncode == 2
    assert "non-loopback" in result.stderr
    assert "--insecure" in result.stderr
    assert not data.exists()


@pytest.mark.parametrize("extra", [["--insecure"], ["--tokens"]], ids=["insecure", "tokens"])
def test_non_loopback_allowed_when_forced_or_authenticated(
    tmp_path: Path, tokens_file: Path, extra: list[str]
) -> None:
    if extra == ["--tokens"]:
        extra = ["--tokens", str(tokens_file)]
    args = ["server", "--listen", "0.0.0.0:0", "--data", str(tmp_path / "data"), "--drain-grace", "1s"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "electric_sdk.cli.main", *args, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert re.fullmatch(r"electric server listening on 0\.0\.0\.0:[1-9]\d*\n", first), first
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()


# -- TLS ----------------------------------------------------------------------------------------


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl binary is not installed; cannot make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    request = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"]
    san = ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"]
    subprocess.run(
        [openssl, *request, *san, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


async def test_tls(start_server: StartServer, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    srv = await start_server(tls_cert=cert, tls_key=key)
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    async with grpc.aio.secure_channel(srv.address, credentials) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        spawned = await stub.SpawnEntity(api.SpawnEntityRequest(ref=A1), timeout=10)
        got = await stub.GetEntity(api.GetEntityRequest(ref=A1), timeout=10)
        assert got.entity == spawned.entity
    async with grpc.aio.insecure_channel(srv.address) as plain:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await api_grpc.EntityServiceStub(plain).GetEntity(api.GetEntityRequest(ref=A1), timeout=10)
        assert info.value.code() is Code.UNAVAILABLE


async def test_tls_with_tokens(
    start_server: StartServer, certificate: tuple[Path, Path], tokens_file: Path
) -> None:
    cert, key = certificate
    srv = await start_server(tls_cert=cert, tls_key=key, tokens_file=tokens_file)
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    async with grpc.aio.secure_channel(srv.address, credentials) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        assert await denied(stub.GetEntity(api.GetEntityRequest(ref=A1))) == (
            Code.UNAUTHENTICATED,
            "UNAUTHENTICATED",
        )
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=A1), metadata=auth("sender"))
        got = await stub.GetEntity(api.GetEntityRequest(ref=A1), metadata=auth("reader"))
        assert got.entity.state == pb.STATE_SPAWNING


async def test_bearer_scheme_is_case_insensitive(secured: tuple[ElectricServer, Stub]) -> None:
    _, stub = secured
    for scheme in ("bearer", "BEARER"):
        metadata = [("authorization", f"{scheme} {TOKENS['admin'][0]}")]
        response = await stub.GetEntity(api.GetEntityRequest(ref=A1), metadata=metadata)
        assert response.entity.ref == A1


async def test_an_expired_token_is_refused_by_both_doors(start_server: StartServer, tmp_path: Path) -> None:
    tokens = tmp_path / "expiring.toml"
    tokens.write_text(
        '[[tokens]]\ntoken = "old-token-123"\nprincipal = "old"\nscopes = ["read"]\nexpires = 2020-01-01T00:00:00Z\n'
        '[[tokens]]\ntoken = "new-token-123"\nprincipal = "new"\nscopes = ["read"]\nexpires = 2999-01-01\n'
    )
    tokens.chmod(0o600)
    srv = await start_server(tokens_file=tokens, http="127.0.0.1:0")
    async with grpc.aio.insecure_channel(srv.address) as channel:
        entities = api_grpc.EntityServiceStub(channel)
        old = [("authorization", "Bearer old-token-123")]
        assert await denied(entities.ListEntities(api.ListEntitiesRequest(), metadata=old)) == (
            Code.UNAUTHENTICATED,
            "UNAUTHENTICATED",
        )
        new = [("authorization", "Bearer new-token-123")]
        await entities.ListEntities(api.ListEntitiesRequest(), metadata=new)
    assert srv.http is not None
    async with httpx.AsyncClient(base_url=srv.http.address) as http:
        assert (
            await http.get("/entities", headers={"authorization": "Bearer old-token-123"})
        ).status_code == 401
        assert (
            await http.get("/entities", headers={"authorization": "Bearer new-token-123"})
        ).status_code == 200


async def test_two_authorization_headers_are_refused_alike_by_both_doors(
    start_server: StartServer, tokens_file: Path
) -> None:
    srv = await start_server(tokens_file=tokens_file, http="127.0.0.1:0")
    admin, reader = f"Bearer {TOKENS['admin'][0]}", f"Bearer {TOKENS['reader'][0]}"
    for pair in ((admin, reader), (reader, admin), (admin, admin)):
        async with grpc.aio.insecure_channel(srv.address) as channel:
            entities = api_grpc.EntityServiceStub(channel)
            metadata = [("authorization", pair[0]), ("authorization", pair[1])]
            call = entities.ListEntities(api.ListEntitiesRequest(), metadata=metadata)
            assert await denied(call) == (Code.UNAUTHENTICATED, "DUPLICATE_AUTHORIZATION")
        assert srv.http is not None
        async with httpx.AsyncClient(base_url=srv.http.address) as http:
            for path in ("/entities", "/metrics"):
                answer = await http.get(
                    path, headers=[("authorization", pair[0]), ("authorization", pair[1])]
                )
                assert answer.status_code == 401, path
                assert answer.json()["error"]["code"] == "DUPLICATE_AUTHORIZATION", path
