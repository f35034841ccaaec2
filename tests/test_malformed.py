"""Hostile request bodies get a clear answer, before anything is decoded or written (issue 18).

- Undecodable bytes to every method: ``INVALID_ARGUMENT``/``MALFORMED_REQUEST``
  (never ``UNKNOWN``), or ``UNAUTHENTICATED`` without a valid token, decided on
  the metadata before the body is decoded; at most one log line per reason for
  a burst of them, and no traceback.
- JSON nested deeper than 32 levels: ``PAYLOAD_TOO_DEEP``, whether protobuf can
  still decode it or refuses to; 32 levels are accepted.
- Offsets and epochs past SQLite's signed 64 bits: ``VALUE_OUT_OF_RANGE``, not
  ``INTERNAL``.
- A runtime stream's undecodable frame ends the session with ``MALFORMED_REQUEST``.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import grpc
import pytest
from conftest import StartServer
from electric_server.app import ElectricServer
from electric_server.core import errors as server_errors
from electric_server.fastpaths import acceptors
from google.protobuf import struct_pb2
from grpc._cython import cygrpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import error_info

from electric_sdk import errors
from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.runtime_session import SESSION_ACCEPTED
from electric_sdk.testing import TestServer

if TYPE_CHECKING:
    from conftest import DbRows

pytestmark = pytest.mark.anyio

Code = grpc.StatusCode
ENTITY = "/electric.v1.EntityService/"
CONNECT = "/electric.v1.RuntimeService/Connect"
UNARY = ["SpawnEntity", "GetEntity", "ListEntities", "SignalEntity", "SignalEntities", "SendMessage"]
UNARY += ["DeleteEntity", "ReadEvents"]
STREAMING = ["WatchEvents", "WatchEntities"]
# A body that is no protobuf, and a GetEntityRequest whose ref.type is not UTF-8.
GARBAGE = {"ff": b"\xff", "bad-utf8": b"\x0a\x03\x0a\x01\xff"}
A1 = pb.EntityRef(type="agent", id="a1")
ADMIN = "admin-token-0001"
TOKENS_TOML = f'[[tokens]]\ntoken = "{ADMIN}"\nprincipal = "root"\nscopes = ["admin"]\n'


async def send_raw(channel: grpc.aio.Channel, path: str, body: bytes, metadata: Any) -> None:
    """Send raw bytes to a method (to a stream, as its only frame) and read to the end."""
    if path.endswith(tuple(STREAMING)):
        async for _ in channel.unary_stream(path)(body, metadata=metadata):
            pass
    elif path == CONNECT:
        call = channel.stream_stream(path)(metadata=metadata)
        # Write only once accepted: grpc.aio's client reports a write racing a refusal as
        # INTERNAL (see docs/server.md); a refused stream ends without the marker.
        if (await call.initial_metadata()).get(SESSION_ACCEPTED[0]) == SESSION_ACCEPTED[1]:
            await call.write(body)
        async for _ in call:
            pass
    else:
        await channel.unary_unary(path)(body, metadata=metadata)


async def call_raw(
    channel: grpc.aio.Channel, method: str, body: bytes, metadata: Any = ()
) -> grpc.aio.AioRpcError:
    """The error a method answers raw bytes with."""
    path = method if method.startswith("/") else CONNECT if method == "Connect" else ENTITY + method
    with anyio.fail_after(10), pytest.raises(grpc.aio.AioRpcError) as caught:
        await send_raw(channel, path, body, metadata)
    return caught.value


@pytest.fixture
def refusal_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> pytest.LogCaptureFixture:
    """A fresh rate limit (no earlier test's line counts against this one) and the log captured."""
    fresh = getattr(server_errors, "RefusalLog", None)  # (absent before issue 18: the test still runs)
    if fresh is not None:
        monkeypatch.setattr(server_errors, "refusals", fresh(interval_s=60))
    caplog.set_level(logging.INFO)
    return caplog


def quiet(caplog: pytest.LogCaptureFixture) -> dict[str, int]:
    """No traceback, nothing at ERROR; the refusal lines per reason."""
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text
    lines: dict[str, int] = {}
    for record in caplog.records:
        if record.getMessage().startswith("refused "):
            reason = record.args[3] if isinstance(record.args, tuple) else "?"
            lines[str(reason)] = lines.get(str(reason), 0) + 1
    return lines


@pytest.mark.parametrize("body", list(GARBAGE), ids=list(GARBAGE))
async def test_undecodable_requests_are_malformed_and_logged_once(
    server: ElectricServer,
    channel: grpc.aio.Channel,
    db_rows: Callable[[ElectricServer], DbRows],
    refusal_log: pytest.LogCaptureFixture,
    body: str,
) -> None:
    await api_grpc.EntityServiceStub(channel).SpawnEntity(api.SpawnEntityRequest(ref=A1))
    before = db_rows(server)
    for method in [*UNARY, *STREAMING, "Connect"] * 5:
        err = await call_raw(channel, method, GARBAGE[body])
        assert (err.code(), error_info(err).reason) == (Code.INVALID_ARGUMENT, "MALFORMED_REQUEST"), method
    assert db_rows(server) == before
    assert quiet(refusal_log) == {"MALFORMED_REQUEST": 1}
    # Health is guarded the same way, and still serves.
    err = await call_raw(channel, "/grpc.health.v1.Health/Check", GARBAGE[body])
    assert err.code() is Code.INVALID_ARGUMENT
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_without_a_valid_token_the_body_is_never_decoded(
    start_server: StartServer,
    tmp_path: Path,
    db_rows: Callable[[ElectricServer], DbRows],
    refusal_log: pytest.LogCaptureFixture,
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS_TOML)
    tokens.chmod(0o600)
    srv = await start_server(tokens_file=tokens)
    before = db_rows(srv)
    wrong = [("authorization", "Bearer not-a-token-01")]
    right = [("authorization", f"Bearer {ADMIN}")]
    async with grpc.aio.insecure_channel(srv.address) as channel:
        for method in [*UNARY, *STREAMING, "Connect"]:
            for body in GARBAGE.values():
                for metadata in ([], wrong):
                    err = await call_raw(channel, method, body, metadata)
                    assert (err.code(), error_info(err).reason) == (Code.UNAUTHENTICATED, "UNAUTHENTICATED")
                err = await call_raw(channel, method, body, right)
                assert (err.code(), error_info(err).reason) == (Code.INVALID_ARGUMENT, "MALFORMED_REQUEST")
        # Health and reflection need no token, and still answer.
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert db_rows(srv) == before
    assert quiet(refusal_log) == {"UNAUTHENTICATED": 1, "MALFORMED_REQUEST": 1}


def nested(depth: int) -> struct_pb2.Value:
    """A JSON list nested ``depth`` arrays deep around a number."""
    value = struct_pb2.Value(number_value=1)
    for _ in range(depth):
        outer = struct_pb2.Value()
        outer.list_value.values.add().CopyFrom(value)
        value = outer
    return value


def nested_object(depth: int) -> struct_pb2.Value:
    value = struct_pb2.Value(string_value="x")
    for _ in range(depth):
        outer = struct_pb2.Value()
        outer.struct_value.fields["k"].CopyFrom(value)
        value = outer
    return value


# 33 levels decode and are refused by the check; 50 are past what protobuf decodes.
DEEP = {"33-lists": nested(33), "33-objects": nested_object(33), "50-lists": nested(50)}


@pytest.mark.parametrize("depth", list(DEEP), ids=list(DEEP))
async def test_json_nested_deeper_than_32_levels_is_refused(
    server: ElectricServer, stub: Any, db_rows: Callable[[ElectricServer], DbRows], depth: str
) -> None:
    await stub.SpawnEntity(api.SpawnEntityRequest(ref=A1))
    before = db_rows(server)
    calls = [
        stub.SignalEntity(api.SignalEntityRequest(ref=A1, signal=pb.SIGNAL_SIGUSR, payload=DEEP[depth])),
        stub.SendMessage(api.SendMessageRequest(ref=A1, data=DEEP[depth])),
        stub.SignalEntities(
            api.SignalEntitiesRequest(
                selector=api.EntitySelector(type="agent"), signal=pb.SIGNAL_SIGUSR, payload=DEEP[depth]
            )
        ),
    ]
    for call in calls:
        with anyio.fail_after(10), pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        assert (caught.value.code(), error_info(caught.value).reason) == (
            Code.INVALID_ARGUMENT,
            "PAYLOAD_TOO_DEEP",
        )
    assert db_rows(server) == before


def field(number: int, body: bytes) -> bytes:
    """A length-delimited protobuf field (lengths here stay below 2^14: a two-byte varint at most)."""
    size = len(body)
    varint = bytes([size]) if size < 0x80 else bytes([size & 0x7F | 0x80, size >> 7])
    return bytes([number << 3 | 2]) + varint + body


async def test_json_too_deep_for_protobuf_itself_is_too_deep(
    server: ElectricServer, channel: grpc.aio.Channel, db_rows: Callable[[ElectricServer], DbRows]
) -> None:
    """A payload 1,000 lists deep (a few kilobytes) cannot even be built by this client's protobuf."""
    value = b"\x11" + struct.pack("<d", 1.0)  # Value.number_value 1.0
    for _ in range(1000):
        value = field(6, field(1, value))  # Value.list_value { values: value }
    body = field(1, A1.SerializeToString()) + b"\x10\x07" + field(4, value)  # ref, SIGUSR, payload
    before = db_rows(server)
    err = await call_raw(channel, "SignalEntity", body)
    assert (err.code(), error_info(err).reason) == (Code.INVALID_ARGUMENT, "PAYLOAD_TOO_DEEP")
    assert db_rows(server) == before


async def test_json_nested_32_levels_is_accepted(stub: Any) -> None:
    await stub.SpawnEntity(api.SpawnEntityRequest(ref=A1))
    for value in (nested(32), nested_object(32)):
        await stub.SignalEntity(api.SignalEntityRequest(ref=A1, signal=pb.SIGNAL_SIGUSR, payload=value))
        await stub.SendMessage(api.SendMessageRequest(ref=A1, data=value))
        events = (await stub.ReadEvents(api.ReadEventsRequest(ref=A1, limit=1000))).events
        assert events[-2].signal.payload == value
        assert events[-1].message.data == value


def test_the_sdk_refuses_deep_json_and_huge_offsets_before_sending(tmp_path: Path) -> None:
    deep: Any = 1
    for _ in range(33):
        deep = [deep]
    with TestServer(tmp_path / "data") as srv:
        client = srv.client()
        client.spawn("agent/a1")
        with pytest.raises(errors.InvalidArgument) as caught:
            client.signal("agent/a1", "SIGUSR", payload=deep)
        assert caught.value.code == "PAYLOAD_TOO_DEEP"
        with pytest.raises(errors.InvalidArgument) as caught:
            client.send("agent/a1", data={"k": deep})
        assert caught.value.code == "PAYLOAD_TOO_DEEP"
        with pytest.raises(errors.InvalidArgument) as caught:
            client.events("agent/a1", from_offset=2**63)
        assert caught.value.code == "VALUE_OUT_OF_RANGE"
        assert [e.offset for e in client.events("agent/a1").events] == [0]


@pytest.mark.parametrize("offset", [2**63, 2**64 - 1], ids=["2^63", "2^64-1"])
async def test_offsets_past_signed_64_bits_are_out_of_range(
    server: ElectricServer, stub: Any, db_rows: Callable[[ElectricServer], DbRows], offset: int
) -> None:
    await stub.SpawnEntity(api.SpawnEntityRequest(ref=A1))
    before = db_rows(server)
    with anyio.fail_after(10), pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ReadEvents(api.ReadEventsRequest(ref=A1, from_offset=offset))
    assert (caught.value.code(), error_info(caught.value).reason) == (
        Code.INVALID_ARGUMENT,
        "VALUE_OUT_OF_RANGE",
    )
    with anyio.fail_after(10), pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in stub.WatchEvents(api.WatchEventsRequest(ref=A1, from_offset=offset)):
            pass
    assert (caught.value.code(), error_info(caught.value).reason) == (
        Code.INVALID_ARGUMENT,
        "VALUE_OUT_OF_RANGE",
    )
    assert db_rows(server) == before
    # The largest offset there can be is a read past the end, not an error.
    page = await stub.ReadEvents(api.ReadEventsRequest(ref=A1, from_offset=2**63 - 1))
    assert (list(page.events), page.head_offset) == ([], 1)


class Session:
    """A runtime stream driven by hand: raw frames in, as the test sends them."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.frames: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.call = channel.stream_stream(CONNECT)(self._requests())  # raw frames, no serializer

    async def _requests(self) -> AsyncIterator[bytes]:
        while (frame := await self.frames.get()) is not None:
            yield frame


def hello(worker: str = "w1") -> bytes:
    return rt.ConnectRequest(
        hello=rt.Hello(worker_id=worker, types=[rt.HostedType(type="agent")])
    ).SerializeToString()


BAD_FRAMES: dict[str, tuple[list[bytes], str]] = {
    "garbage-first": ([b"\xff"], "MALFORMED_REQUEST"),
    "garbage-after-hello": ([hello(), b"\xff"], "MALFORMED_REQUEST"),
    "bad-utf8-after-hello": ([hello(), b"\x22\x05\x12\x03\x0a\x01\xff"], "MALFORMED_REQUEST"),
    "deep-custom-data": (
        [
            hello(),
            rt.ConnectRequest(
                write=rt.RuntimeWrite(ref=A1, epoch=1, custom=rt.CustomEvent(type="note", data=nested(33)))
            ).SerializeToString(),
        ],
        "PAYLOAD_TOO_DEEP",
    ),
    "offset-2^63": (
        [
            hello(),
            rt.ConnectRequest(
                write=rt.RuntimeWrite(
                    ref=A1, epoch=1, run=pb.RunValue(status=pb.RUN_STATUS_STARTED, message_offset=2**63)
                )
            ).SerializeToString(),
        ],
        "VALUE_OUT_OF_RANGE",
    ),
    "epoch-2^64-1": (
        [hello(), rt.ConnectRequest(release=rt.Release(ref=A1, epoch=2**64 - 1)).SerializeToString()],
        "VALUE_OUT_OF_RANGE",
    ),
}


@pytest.mark.parametrize("case", list(BAD_FRAMES))
async def test_a_bad_runtime_frame_ends_the_session_with_its_reason(
    server: ElectricServer, stub: Any, db_rows: Callable[[ElectricServer], DbRows], case: str
) -> None:
    frames, reason = BAD_FRAMES[case]
    await stub.SpawnEntity(api.SpawnEntityRequest(ref=pb.EntityRef(type="other", id="o1")))
    before = db_rows(server)
    async with grpc.aio.insecure_channel(server.address) as channel:
        session = Session(channel)
        for frame in frames:
            session.frames.put_nowait(frame)
        with anyio.fail_after(10), pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in session.call:
                pass
        session.frames.put_nowait(None)
    assert (caught.value.code(), error_info(caught.value).reason) == (Code.INVALID_ARGUMENT, reason)
    after = db_rows(server)
    # The hello ahead of the bad frame is a good one: its types' profile announcement is kept.
    after["type_profiles"] = before["type_profiles"]
    assert after == before


async def test_writes_to_clients_that_had_gone_are_one_line_not_tracebacks(
    server: ElectricServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """grpc.aio logs a write that failed because the client had hung up (a race any client can
    cause by abandoning a stream) as an ERROR with a traceback; the server condenses those."""
    monkeypatch.setattr(acceptors.abandoned_writes, "last", None)
    monkeypatch.setattr(acceptors.abandoned_writes, "count", 0)
    core = logging.getLogger(cygrpc.__name__)
    caplog.set_level(logging.INFO)
    for _ in range(20):
        try:
            raise cygrpc.ExecuteBatchError('Failed "execute_batch": (SendMessageOperation,)')
        except cygrpc.ExecuteBatchError:
            core.exception(
                "ExecuteBatchError raised in core by servicer method [/electric.v1.EntityService/X]"
            )
        core.error("any other error of grpc's core is left alone")
    records = [r for r in caplog.records if r.name == cygrpc.__name__]
    assert len(records) == 21
    assert [(r.levelno, r.exc_info) for r in records[:1]] == [(logging.INFO, None)]
    assert "write(s) failed: the client had gone" in records[0].getMessage()
    assert all(r.levelno == logging.ERROR for r in records[1:])
