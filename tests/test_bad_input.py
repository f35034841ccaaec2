"""The bad-input matrix (ARCHITECTURE §7, server/electric_server/core/validation.py).

Every violation gets its specific status code and google.rpc.ErrorInfo reason
(domain "electric.v1"), never UNKNOWN, and writes nothing: the entities seen
through the API and every row of the SQLite file are the same afterwards.
Inputs exactly at a limit are accepted and recorded as sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio
import grpc
import pytest
from electric_server.app import ElectricServer
from google.protobuf import duration_pb2, struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import types_pb2 as pb

if TYPE_CHECKING:
    from conftest import DbRows

    from electric_sdk._proto.electric.v1.entity_service_pb2_grpc import EntityServiceAsyncStub as Stub

pytestmark = pytest.mark.anyio

Call = Callable[["Stub"], Awaitable[object]]
Code = grpc.StatusCode
INVALID = Code.INVALID_ARGUMENT

LIVE = pb.EntityRef(type="agent", id="a1")
OTHER = pb.EntityRef(type="other", id="o1")
DEAD = pb.EntityRef(type="agent", id="dead")
NEW = pb.EntityRef(type="agent", id="new")
KIB = 1024
DAY_S = 24 * 3600


def ref(type_: str = "agent", id_: str = "a1") -> pb.EntityRef:
    return pb.EntityRef(type=type_, id=id_)


def text_value(chars: int, char: str = "x") -> struct_pb2.Value:
    """A JSON string value whose compact encoding is chars + 2 bytes (for ASCII)."""
    return struct_pb2.Value(string_value=char * chars)


def json_value(obj: dict[str, Any]) -> struct_pb2.Value:
    value = struct_pb2.Value()
    value.struct_value.update(obj)
    return value


def duration(seconds: int = 0, nanos: int = 0) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=seconds, nanos=nanos)


# -- request builders ------------------------------------------------------------------


def spawn(r: pb.EntityRef = NEW, **kw: Any) -> Call:
    return lambda s: s.SpawnEntity(api.SpawnEntityRequest(ref=r, **kw))


def get(r: pb.EntityRef = LIVE) -> Call:
    return lambda s: s.GetEntity(api.GetEntityRequest(ref=r))


def signal(r: pb.EntityRef = LIVE, sig: int = pb.SIGNAL_SIGSTOP, **kw: Any) -> Call:
    return lambda s: s.SignalEntity(api.SignalEntityRequest(ref=r, signal=sig, **kw))  # type: ignore[arg-type]


def signal_many(sig: int = pb.SIGNAL_SIGSTOP, **selector: Any) -> Call:
    rest = {k: selector.pop(k) for k in ("reason", "payload", "idempotency_key") if k in selector}
    sel = api.EntitySelector(**selector)
    return lambda s: s.SignalEntities(api.SignalEntitiesRequest(selector=sel, signal=sig, **rest))  # type: ignore[arg-type]


def send(r: pb.EntityRef = LIVE, text: str = "hi", **kw: Any) -> Call:
    return lambda s: s.SendMessage(api.SendMessageRequest(ref=r, text=text, **kw))


def delete(r: pb.EntityRef = LIVE, **kw: Any) -> Call:
    return lambda s: s.DeleteEntity(api.DeleteEntityRequest(ref=r, **kw))


def read(r: pb.EntityRef = LIVE, **kw: Any) -> Call:
    return lambda s: s.ReadEvents(api.ReadEventsRequest(ref=r, **kw))


def list_entities(**kw: Any) -> Call:
    return lambda s: s.ListEntities(api.ListEntitiesRequest(**kw))


def first_item(open_stream: Callable[[Stub], Any]) -> Call:
    async def call(s: Stub) -> object:
        stream = open_stream(s)
        try:
            item: object = await stream.read()
            return item
        finally:
            stream.cancel()

    return call


def watch(r: pb.EntityRef = LIVE) -> Call:
    return first_item(lambda s: s.WatchEvents(api.WatchEventsRequest(ref=r)))


def watch_entities(**kw: Any) -> Call:
    return first_item(lambda s: s.WatchEntities(api.WatchEntitiesRequest(**kw)))


REF_CALLS: dict[str, Callable[[pb.EntityRef], Call]] = {
    "SpawnEntity": spawn,
    "GetEntity": get,
    "SignalEntity": signal,
    "SendMessage": send,
    "ReadEvents": read,
    "WatchEvents": watch,
    "DeleteEntity": delete,
}
BAD_NAMES = {"empty": "", "129_chars": "x" * 129, "slash": "a/b", "space": "a b", "unicode": "é"}
BAD_KEYS = {"129_chars": "k" * 129, "space": "a key", "tab": "a\tkey", "unicode": "clé", "del": "k\x7f"}
BAD_DURATIONS = {
    "zero": duration(0),
    "over_24h": duration(DAY_S, 1_000_000),
    "sub_ms": duration(0, 500_000),
    "ms_plus_nanos": duration(1, 1),
    "negative": duration(-1),
    "negative_nanos": duration(1, -500_000_000),
    "nanos_overflow": duration(0, 1_000_000_000),
}


# -- the matrix -------------------------------------------------------------------------


def cases() -> Iterator[Any]:
    def case(id_: str, call: Call, reason: str, code: Code = INVALID) -> Any:
        return pytest.param(call, code, reason, id=id_)

    for method, make in REF_CALLS.items():
        for part in ("type", "id"):
            for label, bad in BAD_NAMES.items():
                r = ref()
                setattr(r, part, bad)
                yield case(f"name-{method}-{part}-{label}", make(r), "INVALID_NAME")
        if method != "SpawnEntity":
            yield case(f"unknown-{method}", make(NEW), "ENTITY_NOT_FOUND", Code.NOT_FOUND)
    for label, bad in BAD_NAMES.items():
        yield case(f"name-selector-ref-{label}", signal_many(refs=[ref(id_=bad)]), "INVALID_NAME")
        if bad:  # an empty type filter means "every type"
            yield case(f"name-ListEntities-{label}", list_entities(type=bad), "INVALID_NAME")
            yield case(f"name-WatchEntities-{label}", watch_entities(type=bad), "INVALID_NAME")
            yield case(f"name-selector-type-{label}", signal_many(type=bad), "INVALID_NAME")

    for value in (99, -1, pb.SIGNAL_UNSPECIFIED):
        yield case(f"signal-{value}", signal(sig=value), "UNKNOWN_SIGNAL")
        yield case(f"signal-many-{value}", signal_many(value, type="agent"), "UNKNOWN_SIGNAL")
    for states in ([99], [pb.STATE_UNSPECIFIED], [pb.STATE_RUNNING, 99]):
        label = "-".join(map(str, states))
        yield case(f"state-List-{label}", list_entities(states=states), "UNKNOWN_STATE")
        yield case(f"state-Watch-{label}", watch_entities(states=states), "UNKNOWN_STATE")
        yield case(f"state-selector-{label}", signal_many(states=states), "UNKNOWN_STATE")

    for label, reason in {"1025_bytes": "r" * (KIB + 1), "513_e_acute": "é" * 513}.items():
        yield case(f"reason-{label}", signal(reason=reason), "REASON_TOO_LONG")
        yield case(f"reason-many-{label}", signal_many(type="agent", reason=reason), "REASON_TOO_LONG")

    usr = pb.SIGNAL_SIGUSR
    too_big = {
        "string": text_value(64 * KIB - 1),  # 65537 bytes of JSON
        "escaped_quotes": text_value(33 * KIB, '"'),  # small as proto, > 64 KiB as JSON
        "struct": json_value({"k": "v" * 64 * KIB}),
        "utf8": text_value(32 * KIB, "é"),  # 65538 bytes of UTF-8 JSON
    }
    for label, big in too_big.items():
        yield case(f"payload-{label}", signal(sig=usr, payload=big), "PAYLOAD_TOO_LARGE")
        yield case(f"data-{label}", send(data=big), "PAYLOAD_TOO_LARGE")
    many = signal_many(usr, type="agent", payload=too_big["string"])
    yield case("payload-many", many, "PAYLOAD_TOO_LARGE")
    infinity = struct_pb2.Value()
    infinity.list_value.values.add().number_value = float("inf")
    not_json = {
        "unset": struct_pb2.Value(),
        "nan": struct_pb2.Value(number_value=float("nan")),
        "inf": infinity,
    }
    for label, bad_value in not_json.items():
        yield case(f"payload-{label}", signal(sig=usr, payload=bad_value), "INVALID_PAYLOAD")
        yield case(f"data-{label}", send(data=bad_value), "INVALID_PAYLOAD")
    small = text_value(3)
    for sig in (pb.SIGNAL_SIGINT, pb.SIGNAL_SIGTERM, pb.SIGNAL_SIGKILL, pb.SIGNAL_SIGSTOP):
        name = pb.Signal.Name(sig)
        yield case(f"payload-on-{name}", signal(sig=sig, payload=small), "PAYLOAD_NOT_ALLOWED")
    many = signal_many(pb.SIGNAL_SIGKILL, type="agent", payload=small)
    yield case("payload-many-SIGKILL", many, "PAYLOAD_NOT_ALLOWED")
    for sig in (pb.SIGNAL_SIGTERM, pb.SIGNAL_SIGKILL, pb.SIGNAL_SIGUSR):
        name = pb.Signal.Name(sig)
        yield case(f"message-key-on-{name}", signal(sig=sig, message_key="m1"), "MESSAGE_KEY_NOT_ALLOWED")
    yield case("message-key-bad-name", signal(sig=pb.SIGNAL_SIGINT, message_key="a b"), "INVALID_NAME")

    yield case("text-65537-bytes", send(text="m" * (64 * KIB + 1)), "MESSAGE_TOO_LARGE")
    yield case("text-65538-bytes-e-acute", send(text="é" * (32 * KIB + 1)), "MESSAGE_TOO_LARGE")
    yield case("text-empty", send(text=""), "EMPTY_MESSAGE")

    yield case("spawn-existing", spawn(LIVE), "ENTITY_EXISTS", Code.ALREADY_EXISTS)
    yield case("spawn-killed", spawn(DEAD), "ENTITY_EXISTS", Code.ALREADY_EXISTS)
    yield case("send-to-killed", send(DEAD), "ENTITY_TERMINAL", Code.FAILED_PRECONDITION)
    yield case("signal-killed", signal(DEAD), "INVALID_SIGNAL", Code.FAILED_PRECONDITION)
    yield case("delete-killed", delete(DEAD), "INVALID_SIGNAL", Code.FAILED_PRECONDITION)

    for field in ("grace_period", "idle_timeout"):
        for label, bad_duration in BAD_DURATIONS.items():
            profile = pb.Profile(**{field: bad_duration})
            yield case(f"duration-{field}-{label}", spawn(profile=profile), "INVALID_DURATION")

    for size in (KIB + 1, 2**32 - 1):
        yield case(f"page-size-{size}", list_entities(page_size=size), "PAGE_TOO_LARGE")
        yield case(f"read-limit-{size}", read(limit=size), "PAGE_TOO_LARGE")
    for token in ("garbage", "agent/", "/a1", "agent/a1/x", "a b/c", "é/x"):
        yield case(f"page-token-{token}", list_entities(page_token=token), "INVALID_PAGE_TOKEN")

    keyed: dict[str, Callable[[str], Call]] = {
        "SpawnEntity": lambda k: spawn(idempotency_key=k),
        "SignalEntity": lambda k: signal(idempotency_key=k),
        "SignalEntities": lambda k: signal_many(type="agent", idempotency_key=k),
        "SendMessage": lambda k: send(idempotency_key=k),
        "DeleteEntity": lambda k: delete(idempotency_key=k),
    }
    for method, make_keyed in keyed.items():
        for label, key in BAD_KEYS.items():
            yield case(f"idem-{method}-{label}", make_keyed(key), "INVALID_IDEMPOTENCY_KEY")

    yield case("selector-empty", signal_many(), "INVALID_SELECTOR")
    yield case("selector-refs-and-type", signal_many(refs=[LIVE], type="agent"), "INVALID_SELECTOR")
    yield case("selector-refs-and-states", signal_many(refs=[LIVE], states=[1]), "INVALID_SELECTOR")


# -- helpers ------------------------------------------------------------------------------


def error_reason(err: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason of a failed call; asserts there is exactly one, in our domain."""
    assert err.code() is not Code.UNKNOWN, f"UNKNOWN status: {err.details()}"
    status = rpc_status.from_call(err)
    assert status is not None, f"no google.rpc.Status detail on {err.code()}: {err.details()}"
    infos = []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            infos.append(info)
    assert len(infos) == 1, status
    assert infos[0].domain == "electric.v1"
    return str(infos[0].reason)


async def rejected(call: Call, stub: Stub) -> grpc.aio.AioRpcError:
    with anyio.fail_after(10), pytest.raises(grpc.aio.AioRpcError) as info:
        await call(stub)
    return info.value


async def entities(stub: Stub) -> list[tuple[object, ...]]:
    page = await stub.ListEntities(api.ListEntitiesRequest(page_size=1000))
    assert not page.next_page_token
    return [(e.ref.type, e.ref.id, e.state, e.head_offset, e.txid, e.closed) for e in page.entities]


@pytest.fixture
async def world(server: ElectricServer, stub: Stub) -> Stub:
    """Two live entities of two types and a killed one."""
    for r in (LIVE, OTHER, DEAD):
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=r))
    await stub.SignalEntity(api.SignalEntityRequest(ref=DEAD, signal=pb.SIGNAL_SIGKILL))
    return stub


# -- tests --------------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "code", "reason"), list(cases()))
async def test_rejected_with_reason_and_nothing_written(
    server: ElectricServer,
    world: Stub,
    db_rows: Callable[[ElectricServer], DbRows],
    call: Call,
    code: Code,
    reason: str,
) -> None:
    before, rows_before = await entities(world), db_rows(server)
    assert len(before) == 3

    err = await rejected(call, world)

    assert (err.code(), error_reason(err)) == (code, reason), err.details()
    assert await entities(world) == before
    assert db_rows(server) == rows_before
    # A refused spawn (or anything else) never leaves the new entity behind.
    not_there = await rejected(get(NEW), world)
    assert not_there.code() is Code.NOT_FOUND


async def test_respawn_of_killed_refused_and_stream_stays_readable(world: Stub) -> None:
    before = await world.ReadEvents(api.ReadEventsRequest(ref=DEAD))
    assert before.end_of_stream
    assert [e.type for e in before.events] == ["state", "signal", "state"]

    err = await rejected(spawn(DEAD), world)

    assert (err.code(), error_reason(err)) == (Code.ALREADY_EXISTS, "ENTITY_EXISTS")
    entity = (await world.GetEntity(api.GetEntityRequest(ref=DEAD))).entity
    assert (entity.state, entity.closed) == (pb.STATE_KILLED, True)
    assert await world.ReadEvents(api.ReadEventsRequest(ref=DEAD)) == before
    items = [item async for item in world.WatchEvents(api.WatchEventsRequest(ref=DEAD))]
    assert [i.event.offset for i in items[:-1]] == [0, 1, 2]
    assert items[-1].end_of_stream.head_offset == 3


@pytest.mark.parametrize("name", ["..ok", "x" * 128, "A-Z_a.z-09", "-", "_"])
async def test_valid_names_accepted(world: Stub, name: str) -> None:
    # A new type may not start with "." (RESERVED_NAME: tests/test_reserved_types.py); an id may.
    for r in [ref("agent", name)] + ([] if name.startswith(".") else [ref(name, "i1")]):
        spawned = await world.SpawnEntity(api.SpawnEntityRequest(ref=r))
        assert spawned.entity.ref == r
        assert (await world.GetEntity(api.GetEntityRequest(ref=r))).entity.ref == r


async def signal_event(stub: Stub, r: pb.EntityRef = LIVE) -> pb.SignalValue:
    page = await stub.ReadEvents(api.ReadEventsRequest(ref=r))
    return [e.signal for e in page.events if e.type == "signal"][-1]


async def message_event(stub: Stub) -> pb.MessageValue:
    page = await stub.ReadEvents(api.ReadEventsRequest(ref=LIVE))
    return [e.message for e in page.events if e.type == "message"][-1]


@pytest.mark.parametrize("reason", ["r" * KIB, "é" * (KIB // 2)], ids=["1024_ascii", "512_e_acute"])
async def test_reason_at_limit_recorded(world: Stub, reason: str) -> None:
    await world.SignalEntity(api.SignalEntityRequest(ref=LIVE, signal=pb.SIGNAL_SIGSTOP, reason=reason))
    assert (await signal_event(world)).reason == reason


@pytest.mark.parametrize(
    "payload",
    [
        text_value(64 * KIB - 2),
        text_value(32 * KIB - 1, "é"),
        json_value({"k": [1, "two", None, True]}),
    ],
    ids=["65536_bytes", "65536_bytes_utf8", "struct"],
)
async def test_sigusr_payload_within_limit_recorded(world: Stub, payload: struct_pb2.Value) -> None:
    await world.SignalEntity(api.SignalEntityRequest(ref=LIVE, signal=pb.SIGNAL_SIGUSR, payload=payload))
    assert (await signal_event(world)).payload == payload
    result = await world.SignalEntities(
        api.SignalEntitiesRequest(
            selector=api.EntitySelector(type="agent"), signal=pb.SIGNAL_SIGUSR, payload=payload
        )
    )
    assert (result.signalled + result.ignored, result.skipped) == (1, 1)
    assert (await signal_event(world)).payload == payload


@pytest.mark.parametrize("text", ["m" * 64 * KIB, "é" * 32 * KIB], ids=["65536_ascii", "65536_e_acute"])
async def test_message_text_at_limit_recorded(world: Stub, text: str) -> None:
    await world.SendMessage(api.SendMessageRequest(ref=LIVE, text=text))
    assert (await message_event(world)).text == text


async def test_message_with_data_only_accepted(world: Stub) -> None:
    data = text_value(64 * KIB - 2)
    await world.SendMessage(api.SendMessageRequest(ref=LIVE, data=data))
    assert (await message_event(world)).data == data


@pytest.mark.parametrize(
    ("grace", "idle", "grace_ms", "idle_ms"),
    [
        (duration(0, 1_000_000), duration(0, 1_000_000), 1, 1),
        (duration(DAY_S), duration(DAY_S), DAY_S * 1000, DAY_S * 1000),
        (duration(1, 500_000_000), None, 1500, None),
        (None, None, None, None),
    ],
    ids=["1ms", "24h", "1.5s-default-idle", "defaults"],
)
async def test_durations_within_limits_accepted(
    world: Stub,
    grace: duration_pb2.Duration | None,
    idle: duration_pb2.Duration | None,
    grace_ms: int | None,
    idle_ms: int | None,
) -> None:
    """None: left to the type's default, pending until the first lease."""
    profile = pb.Profile(grace_period=grace, idle_timeout=idle)
    entity = (await world.SpawnEntity(api.SpawnEntityRequest(ref=NEW, profile=profile))).entity
    for name, field, ms in (
        ("grace_period", pb.PROFILE_FIELD_GRACE_PERIOD, grace_ms),
        ("idle_timeout", pb.PROFILE_FIELD_IDLE_TIMEOUT, idle_ms),
    ):
        assert entity.profile.HasField(name) is (ms is not None)
        assert (field in entity.pending_profile) is (ms is None)
        if ms is not None:
            assert getattr(entity.profile, name).ToMilliseconds() == ms


async def test_page_size_and_limit_at_1000_accepted(world: Stub) -> None:
    page = await world.ListEntities(api.ListEntitiesRequest(page_size=1000))
    assert len(page.entities) == 3
    events = await world.ReadEvents(api.ReadEventsRequest(ref=DEAD, limit=1000))
    assert len(events.events) == 3


@pytest.mark.parametrize("key", ["k" * 128, "!~", "a-b_c.d:e/f"])
async def test_valid_idempotency_keys_accepted(world: Stub, key: str) -> None:
    first = await world.SendMessage(api.SendMessageRequest(ref=LIVE, text="hi", idempotency_key=key))
    again = await world.SendMessage(api.SendMessageRequest(ref=LIVE, text="hi", idempotency_key=key))
    assert again == first
