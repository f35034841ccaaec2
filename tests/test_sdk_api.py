"""The SDK's public surface, its models, and every error class from a real server."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

import electric_sdk
from electric_sdk import (
    AsyncClient,
    Client,
    ClientOptions,
    DeadlineExceeded,
    EntityExists,
    EntityNotFound,
    EntityRef,
    EntityTerminal,
    IdempotencyKeyReused,
    InvalidArgument,
    InvalidSignal,
    PermissionDenied,
    RetryPolicy,
    Signal,
    State,
    Unauthenticated,
    Unavailable,
    WrongEventLoop,
)
from electric_sdk.testing import TestServer

PUBLIC_API = [
    "AsyncClient",
    "Client",
    "ClientOptions",
    "CodeVersionInfo",
    "DeadlineExceeded",
    "ElectricError",
    "Entity",
    "EntityChange",
    "EntityExists",
    "EntityNotFound",
    "EntityRef",
    "EntityBusy",
    "EntityTerminal",
    "Event",
    "EventPage",
    "FailedPrecondition",
    "IdempotencyKeyReused",
    "InvalidArgument",
    "InvalidSignal",
    "LeaseHolder",
    "MessageReceipt",
    "RunNotEnded",
    "RunResult",
    "Outcome",
    "PermissionDenied",
    "RetryPolicy",
    "ServerError",
    "Signal",
    "SignalManyResult",
    "SignalResult",
    "State",
    "TypeVersions",
    "Unauthenticated",
    "Unavailable",
    "WatchLagging",
    "WorkerInfo",
    "WrongEventLoop",
    "__version__",
]


def test_public_api_is_pinned() -> None:
    assert sorted(electric_sdk.__all__) == sorted(PUBLIC_API)
    for name in PUBLIC_API:
        assert hasattr(electric_sdk, name), name


def test_no_generated_types_in_public_signatures() -> None:
    import inspect

    for cls in (Client, AsyncClient):
        for name, member in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_"):
                continue
            annotations = " ".join(str(v) for v in inspect.get_annotations(member).values())
            assert "pb2" not in annotations, (cls.__name__, name)
            assert "_proto" not in annotations, (cls.__name__, name)


@pytest.mark.parametrize(
    ("text", "signal"),
    [
        ("SIGTERM", Signal.SIGTERM),
        ("sigterm", Signal.SIGTERM),
        ("TERM", Signal.SIGTERM),
        ("usr", Signal.SIGUSR),
    ],
)
def test_signal_parsing(text: str, signal: Signal) -> None:
    assert Signal.parse(text) is signal


def test_bad_signal_and_ref_parsing() -> None:
    with pytest.raises(ValueError, match="unknown signal"):
        Signal.parse("SIGFOO")
    assert State.parse("RUNNING") is State.RUNNING
    assert EntityRef.parse("/my_agent/agent_1") == EntityRef("my_agent", "agent_1")
    assert EntityRef.parse("my_agent/agent_1").url == "/my_agent/agent_1"
    for bad in ("noslash", "a/b/c", "/a/", ""):
        with pytest.raises(ValueError, match="TYPE/ID"):
            EntityRef.parse(bad)


@pytest.fixture
def server(tmp_path: Path) -> TestServer:
    with TestServer(tmp_path / "data") as srv:
        yield srv  # type: ignore[misc]


def test_models_and_rfc_shapes(server: TestServer) -> None:
    client = server.client()
    entity = client.spawn("agent/m1", grace_period="250ms", idle_timeout=2)
    assert entity.state is State.SPAWNING
    assert entity.grace_period.total_seconds() == 0.25
    assert "<table>" in entity._repr_html_()
    result = client.usr("agent/m1", {"n": 1, "tags": ["a"]}, reason="poke")
    assert (result.previous_state, result.new_state) == (State.SPAWNING, State.SPAWNING)
    shape = result.to_json()
    assert set(shape) >= {"url", "signal", "previous_state", "new_state", "created_at", "txid"}
    assert shape["url"] == "/agent/m1"
    assert isinstance(shape["created_at"], int)
    events = client.events("agent/m1").events
    signal_event = events[-1].to_json()
    assert signal_event["type"] == "signal"
    assert signal_event["value"]["payload"] == {"n": 1, "tags": ["a"]}
    assert signal_event["value"]["reason"] == "poke"
    assert set(signal_event["headers"]) == {"operation", "timestamp", "txid"}
    assert signal_event["headers"]["timestamp"].endswith("Z")
    json.dumps(signal_event)  # plain JSON all the way down
    assert "<table>" in events[-1]._repr_html_()
    assert "<table>" in result._repr_html_()


def test_delete_warns_and_kills(server: TestServer) -> None:
    client = server.client()
    client.spawn("agent/d1")
    with pytest.warns(DeprecationWarning, match="kill"):
        result = client.delete("agent/d1")
    assert result.new_state is State.KILLED
    signal_event = client.events("agent/d1").events[-2]
    assert signal_event.value["signal"] == "SIGKILL"
    assert signal_event.value["reason"] == "legacy delete"


def test_every_error_class_from_a_real_server(server: TestServer) -> None:
    client = server.client()
    client.spawn("agent/e1")
    with pytest.raises(EntityExists) as exists:
        client.spawn("agent/e1")
    assert exists.value.code == "ENTITY_EXISTS"
    with pytest.raises(EntityNotFound):
        client.get("agent/missing")
    with pytest.raises(InvalidArgument) as bad_name:
        client.spawn("bad name/x")
    assert bad_name.value.code == "INVALID_NAME"
    assert bad_name.value.status == "INVALID_ARGUMENT"
    client.signal("agent/e1", "SIGUSR", idempotency_key="k-1")
    with pytest.raises(IdempotencyKeyReused):
        client.signal("agent/e1", "SIGHUP", idempotency_key="k-1")
    client.kill("agent/e1")
    with pytest.raises(InvalidSignal) as invalid:
        client.kill("agent/e1")
    assert invalid.value.to_json() == {
        "error": {"code": "INVALID_SIGNAL", "message": "Cannot signal a killed entity"}
    }
    with pytest.raises(EntityTerminal):
        client.send("agent/e1", "hello")


def test_deadline_exceeded_against_a_silent_peer() -> None:
    """A peer that accepts TCP and never answers: every call has a deadline."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        policy = RetryPolicy(attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02)
        with Client(address, timeout_s=0.3, retry=policy) as client, pytest.raises(DeadlineExceeded):
            client.get("agent/x")


def test_unavailable_after_bounded_retries() -> None:
    policy = RetryPolicy(attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02, total_s=5)
    with Client("127.0.0.1:1", timeout_s=0.5, retry=policy) as client, pytest.raises(Unavailable):
        client.get("agent/x")


def test_auth_errors(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[[tokens]]\ntoken = "reader-token-1"\nprincipal = "reader"\nscopes = ["read"]\n'
        '[[tokens]]\ntoken = "admin-token-1"\nprincipal = "root"\nscopes = ["admin"]\n'
    )
    tokens.chmod(0o600)  # a tokens file others may read is refused
    with TestServer(tmp_path / "data", tokens_file=tokens) as srv:
        srv.client(token="admin-token-1").spawn("agent/a1")
        with pytest.raises(Unauthenticated):
            srv.client(token="wrong-token-1").get("agent/a1")
        with pytest.raises(PermissionDenied) as denied:
            srv.client(token="reader-token-1").kill("agent/a1")
        assert denied.value.code == "MISSING_SCOPE"
        result = srv.client(options=ClientOptions(address=srv.address, token="admin-token-1")).kill(
            "agent/a1"
        )
        assert result.new_state is State.KILLED
        assert srv.client(token="admin-token-1").events("agent/a1").events[-2].value["sender"] == "root"


def test_sync_client_inside_a_running_event_loop(server: TestServer) -> None:
    """As in Jupyter: the calling thread's loop is running, and busy."""
    client = server.client()

    async def cell() -> State:
        client.spawn("agent/j1")
        client.pause("agent/j1")  # ignored in spawning, recorded all the same
        watched = [e.type for e in _take(client.watch("agent/j1"), 2)]
        assert watched == ["state", "signal"]
        return client.kill("agent/j1").new_state

    assert asyncio.run(cell()) is State.KILLED


def _take(iterator: object, n: int) -> list[electric_sdk.Event]:
    out = []
    for item in iterator:  # type: ignore[attr-defined]
        out.append(item)
        if len(out) == n:
            break
    return out


def test_async_client_belongs_to_its_loop(server: TestServer) -> None:
    created: dict[str, AsyncClient] = {}

    async def make() -> None:
        created["client"] = AsyncClient(server.address)  # binds to loop_a, which is running here

    async def use_elsewhere() -> None:
        with pytest.raises(WrongEventLoop, match="another event loop"):
            await created["client"].get("agent/x")

    loop_a = asyncio.new_event_loop()
    try:
        loop_a.run_until_complete(make())
        thread_error: list[BaseException] = []

        def other_thread() -> None:
            try:
                asyncio.run(use_elsewhere())
            except BaseException as exc:
                thread_error.append(exc)

        t = threading.Thread(target=other_thread)
        t.start()
        t.join(10)
        assert not thread_error, thread_error
        loop_a.run_until_complete(created["client"].close())
    finally:
        loop_a.close()


def test_wait_for_state_and_signal_many(server: TestServer) -> None:
    client = server.client()
    for i in range(3):
        client.spawn(f"fleet/f{i}")
    client.kill("fleet/f2")
    result = client.signal_many("SIGKILL", type="fleet", reason="teardown")
    assert (result.signalled, result.ignored, result.skipped, result.not_found) == (2, 0, 1, 0)
    assert client.wait_for_state("fleet/f0", [State.KILLED], timeout=5).state is State.KILLED
    client.spawn("fleet/f3")
    with pytest.raises(DeadlineExceeded):
        client.wait_for_state("fleet/f3", "running", timeout=0.2)
    states = {e.ref.id: e.state for e in client.list(type="fleet")}
    assert states == {"f0": State.KILLED, "f1": State.KILLED, "f2": State.KILLED, "f3": State.SPAWNING}
    assert [e.ref.id for e in client.list(states=["spawning"])] == ["f3"]


def test_a_lagging_watch_is_ended_and_the_sdk_resubscribes(tmp_path: Path) -> None:
    """More changes in one commit batch than a watcher may queue: the server ends the
    watch with WATCH_LAGGING; the SDK maps it, and its watch resubscribes to a fresh snapshot."""
    import anyio
    import grpc

    from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
    from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
    from electric_sdk.errors import WatchLagging, from_rpc_error

    with TestServer(tmp_path / "data", watch_queue_limit=3) as srv:
        client = srv.client()
        for i in range(12):
            client.spawn(f"burst/b{i}")

        async def raw_watch() -> BaseException:
            async with grpc.aio.insecure_channel(srv.address) as channel:
                call = api_grpc.EntityServiceStub(channel).WatchEntities(api.WatchEntitiesRequest())
                try:
                    with anyio.fail_after(20):
                        async for item in call:
                            if item.HasField("snapshot_complete"):
                                # One SignalEntities call: 12 state changes in one commit batch.
                                await anyio.to_thread.run_sync(
                                    lambda: client.signal_many("SIGKILL", type="burst")
                                )
                except grpc.aio.AioRpcError as exc:
                    return from_rpc_error(exc)
            raise AssertionError("the watch ended without an error")

        error = asyncio.run(raw_watch())
        assert isinstance(error, WatchLagging)
        assert error.code == "WATCH_LAGGING"

        changes = client.watch_entities(type="burst")
        states = [next(changes).entity.state for _ in range(12)]
        assert states == [State.KILLED] * 12  # a fresh snapshot after the lag
