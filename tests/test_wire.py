"""``electric_sdk._wire``: every conversion between the wire and Python values, and that nothing
outside it converts on its own (so the server and the SDK cannot drift apart)."""

from __future__ import annotations

import ast
import enum
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from electric_server.store.base import EntityRecord, StoredEvent
from google.protobuf import struct_pb2

from electric_sdk import Entity, Event
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire import enums, events, json_values, times
from electric_sdk._wire.entities import entity_to_pb, entity_url
from electric_sdk.lifecycle import Outcome, Signal, State

ROOT = Path(__file__).resolve().parent.parent
WIRE = ROOT / "electric_sdk" / "_wire"


# -- enums ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", list(State))
def test_every_state_round_trips(state: State) -> None:
    value = enums.state_to_pb(state)
    assert pb.State.Name(value) == f"STATE_{state.name}"
    assert enums.state_from_pb(value) is state


@pytest.mark.parametrize("signal", list(Signal))
def test_every_signal_round_trips(signal: Signal) -> None:
    value = enums.signal_to_pb(signal)
    assert pb.Signal.Name(value) == f"SIGNAL_{signal.name}"
    assert enums.signal_from_pb(value) is signal


@pytest.mark.parametrize("outcome", list(Outcome))
def test_every_outcome_round_trips(outcome: Outcome) -> None:
    value = enums.outcome_to_pb(outcome)
    assert pb.SignalOutcome.Name(value) == f"SIGNAL_OUTCOME_{outcome.name}"
    assert enums.outcome_from_pb(value) is outcome


@pytest.mark.parametrize(
    ("wire", "table"),
    [(pb.State, enums.PB_TO_STATE), (pb.Signal, enums.PB_TO_SIGNAL), (pb.SignalOutcome, enums.PB_TO_OUTCOME)],
)
def test_the_wire_and_the_lifecycle_name_the_same_members(wire: Any, table: dict[int, Any]) -> None:
    """Every wire value but UNSPECIFIED (zero) has its enum member, and no member lacks one."""
    assert sorted(table) == sorted(v for v in wire.values() if v)


def test_unspecified_reads_as_nothing() -> None:
    assert enums.state_from_pb(pb.STATE_UNSPECIFIED) is None
    assert enums.outcome_from_pb(pb.SIGNAL_OUTCOME_UNSPECIFIED) is None
    with pytest.raises(KeyError):
        enums.signal_from_pb(pb.SIGNAL_UNSPECIFIED)


@pytest.mark.parametrize(
    ("names", "by_name", "wire", "prefix"),
    [
        (enums.OPERATION_NAMES, None, pb.Operation, "OPERATION_"),
        (enums.RUN_STATUS_NAMES, None, pb.RunStatus, "RUN_STATUS_"),
        (enums.EXEC_ACTION_NAMES, enums.EXEC_ACTION_BY_NAME, pb.ExecAction, "EXEC_ACTION_"),
        (
            enums.EXEC_DISPOSITION_NAMES,
            enums.EXEC_DISPOSITION_BY_NAME,
            pb.ExecDisposition,
            "EXEC_DISPOSITION_",
        ),
    ],
)
def test_named_enums_round_trip(
    names: dict[int, str], by_name: dict[str, int] | None, wire: Any, prefix: str
) -> None:
    for value in wire.values():
        if value:
            assert names[value] == wire.Name(value).removeprefix(prefix).lower()
            if by_name is not None:
                assert by_name[names[value]] == value
    assert 0 not in names
    assert by_name is None or "unspecified" not in by_name


# -- times ----------------------------------------------------------------------------------------

# Zero, the edges of a second, now-ish, and far ahead (2199-12-31T23:59:59.999Z).
INSTANTS_MS = [0, 1, 999, 1000, 1001, 1_700_000_000_123, 7_258_118_399_999]


@pytest.mark.parametrize("ms", [*INSTANTS_MS, -1])
def test_timestamps_round_trip_at_millisecond_precision(ms: int) -> None:
    ts = times.timestamp_from_ms(ms)
    assert 0 <= ts.nanos < 1_000_000_000
    assert ts.ToMilliseconds() == ms
    assert times.timestamp_to_ms(ts) == ms


@pytest.mark.parametrize("ms", INSTANTS_MS)
def test_datetimes_and_iso_text_round_trip(ms: int) -> None:
    dt = times.timestamp_to_datetime(times.timestamp_from_ms(ms))
    assert dt.tzinfo is UTC
    assert times.datetime_to_ms(dt) == ms
    text = times.to_iso(dt)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", text)
    assert times.from_iso(text) == dt
    assert times.timestamp_to_ms(times.timestamp_from_datetime(dt)) == ms


def test_iso_text_is_utc_whatever_the_zone() -> None:
    east = datetime(2026, 3, 7, 12, 0, 0, 123_000, tzinfo=UTC).astimezone()
    assert times.to_iso(east) == "2026-03-07T12:00:00.123Z"


@pytest.mark.parametrize("ms", [0, 1, 999, 1000, 86_400_000, 10**12])
def test_durations_round_trip_at_millisecond_precision(ms: int) -> None:
    d = times.duration_from_ms(ms)
    assert d.ToMilliseconds() == ms
    assert times.timedelta_to_ms(d.ToTimedelta()) == ms
    assert times.timedelta_to_ms(timedelta(milliseconds=ms, microseconds=999)) == ms  # truncated


# -- JSON values ----------------------------------------------------------------------------------

JSON_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -7,
    1.5,
    2**53 - 1,
    "",
    "é ✓ \n \u0000",
    [],
    {},
    [1, "two", None, [3.25, {"four": [False]}]],
    {"nested": {"list": [1, 2, {"deep": None}], "text": "x"}, "n": -0.5, "empty": {}},
]


@pytest.mark.parametrize("value", JSON_VALUES)
def test_json_values_round_trip(value: Any) -> None:
    back = json_values.value_to_json(json_values.json_to_value(value))
    assert back == value
    assert type(back) is type(value)


def test_json_numbers_come_back_as_ints_when_whole_and_exact() -> None:
    assert json_values.value_to_json(struct_pb2.Value(number_value=3.0)) == 3
    assert type(json_values.value_to_json(struct_pb2.Value(number_value=3.0))) is int
    assert type(json_values.value_to_json(struct_pb2.Value(number_value=2.0**53))) is float


def test_an_unset_json_value_reads_as_null() -> None:
    assert json_values.value_to_json(struct_pb2.Value()) is None


class _Level(enum.IntEnum):
    HIGH = 3


def _self_containing() -> dict[str, Any]:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    return loop


@pytest.mark.parametrize(
    "value",
    [
        *JSON_VALUES,
        2**53 + 1,
        2**80,
        10**400,
        float("nan"),
        1e308,
        (1, 2),
        {1: "int key", None: "null key", 2.5: "float key"},
        _Level.HIGH,
        {"level": _Level.HIGH},
        {"text": "\ud800"},
        _self_containing(),
        [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
        {1, 2},
    ],
)
def test_json_to_value_is_what_json_text_makes(value: Any) -> None:
    """The direct conversion gives what going through JSON text gives, or the same error."""

    def outcome(convert: Callable[[Any], struct_pb2.Value]) -> tuple[str, Any]:
        try:
            return "ok", convert(value).SerializeToString(deterministic=True)
        except (ValueError, RecursionError) as exc:
            return type(exc).__name__, str(exc)

    assert outcome(json_values.json_to_value) == outcome(json_values.through_text)


@pytest.mark.parametrize("value", [{1, 2}, object(), {"a": b"bytes"}])
def test_what_is_not_json_is_a_value_error(value: Any) -> None:
    with pytest.raises(ValueError, match="not JSON serializable"):
        json_values.json_to_value(value)


# -- entities and events: the server's records, read back by the SDK's models ---------------------


@pytest.mark.parametrize("deadline_ms", [None, 1_700_000_030_500])
def test_an_entity_record_reads_back_as_the_model(deadline_ms: int | None) -> None:
    state = State.STOPPING if deadline_ms else State.RUNNING
    record = EntityRecord(
        "agent", "a1", state, 30_000, 60_001, 1_700_000_000_001, 1_700_000_000_500, 7, False, deadline_ms, 42
    )
    message = entity_to_pb(record)
    assert message.HasField("stopping_deadline") is (deadline_ms is not None)
    entity = Entity.from_pb(message)
    assert (entity.ref.type, entity.ref.id, entity.state) == ("agent", "a1", state)
    assert entity.ref.url == entity_url("agent", "a1") == "/agent/a1"
    assert entity.to_json()["profile"] == {
        "grace_period_ms": 30_000,
        "idle_timeout_ms": 60_001,
        "pending": [],
    }
    assert times.datetime_to_ms(entity.created_at) == record.created_at_ms
    assert times.datetime_to_ms(entity.updated_at) == record.updated_at_ms
    assert (entity.head_offset, entity.closed, entity.txid) == (7, False, 42)
    stopping = entity.stopping_deadline
    assert (stopping and times.datetime_to_ms(stopping)) == deadline_ms


def test_a_pending_profile_value_reads_back_as_none() -> None:
    """A value the spawn left to the type's default is not shown until the first lease fixes it:
    its placeholder (the server's default) never reaches the wire."""
    record = EntityRecord(
        "agent", "a1", State.SPAWNING, 30_000, 60_000, 1, 1, 1, False, None, 1, grace_pending=True
    )
    message = entity_to_pb(record)
    assert list(message.pending_profile) == [pb.PROFILE_FIELD_GRACE_PERIOD]
    assert not message.profile.HasField("grace_period")
    entity = Entity.from_pb(message)
    assert (entity.grace_period, entity.idle_timeout) == (None, timedelta(minutes=1))
    assert entity.to_json()["profile"] == {
        "grace_period_ms": None,
        "idle_timeout_ms": 60_000,
        "pending": ["grace_period"],
    }


def test_a_stored_event_reads_back_as_the_model() -> None:
    value = pb.SignalValue(
        signal=enums.SIGNAL_TO_PB[Signal.SIGUSR],
        sender="user:alice",
        reason="poke",
        outcome=enums.OUTCOME_TO_PB[Outcome.PENDING],
        previous_state=enums.STATE_TO_PB[State.RUNNING],
        new_state=enums.STATE_TO_PB[State.RUNNING],
    )
    value.payload.CopyFrom(json_values.json_to_value({"n": [1, 2]}))
    body = events.event_body(pb.Event(signal=value))
    stored = StoredEvent(3, "signal", "sig_9", pb.OPERATION_INSERT, 1_700_000_000_250, 9, body)
    event = Event.from_pb(events.event_to_pb(stored))
    assert (event.offset, event.type, event.key, event.operation, event.txid) == (
        3,
        "signal",
        "sig_9",
        "insert",
        9,
    )
    assert times.to_iso(event.timestamp) == "2023-11-14T22:13:20.250Z"
    assert event.value == {
        "signal": "SIGUSR",
        "sender": "user:alice",
        "reason": "poke",
        "payload": {"n": [1, 2]},
        "outcome": "pending",
        "previous_state": "running",
        "new_state": "running",
    }


def test_the_state_value_json_names_unspecified_as_null_and_the_deadline_as_iso() -> None:
    value = pb.StateValue(state=enums.STATE_TO_PB[State.STOPPING], cause="signal", signal_key="sig_1")
    value.deadline.CopyFrom(times.timestamp_from_ms(1_700_000_030_000))
    assert events.event_value_json(pb.Event(state=value)) == {
        "state": "stopping",
        "previous_state": None,
        "cause": "signal",
        "signal_key": "sig_1",
        "deadline": "2023-11-14T22:13:50.000Z",
    }


def test_an_exec_receipt_renders_every_field() -> None:
    receipt = pb.ExecReceipt(
        task_id="t",
        action=enums.EXEC_ACTION_BY_NAME["graceful"],
        disposition=enums.EXEC_DISPOSITION_BY_NAME["issued"],
        backend="local",
        exit_status=0,
        tags=["a"],
    )
    receipt.issued_at.CopyFrom(times.timestamp_from_ms(1_000))
    receipt.timeout.CopyFrom(times.duration_from_ms(250))
    assert events.receipt_json(receipt) == {
        "task_id": "t",
        "action": "graceful",
        "action_name": "",
        "disposition": "issued",
        "backend": "local",
        "generation": None,
        "escalated": False,
        "group": False,
        "issued_at": "1970-01-01T00:00:01.000Z",
        "timeout_ms": 250,
        "exit_status": 0,
        "tags": ["a"],
    }
    assert events.event_value_json(pb.Event(exec=receipt)) == events.receipt_json(receipt)


# -- watch frames: messages joined from events encoded once -------------------------------------


@pytest.mark.parametrize("text_bytes", [0, 100, 200, 20_000])  # lengths whose varints take 1-3 bytes
def test_watch_frames_decode_as_the_generated_classes_would_build_them(text_bytes: int) -> None:
    from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
    from electric_sdk._wire import watch_frames

    stored = [
        StoredEvent(
            i,
            "message",
            f"msg_{i}",
            pb.OPERATION_INSERT,
            1_700_000_000_000 + i,
            i + 1,
            events.event_body(pb.Event(message=pb.MessageValue(text="t" * (text_bytes + i)))),
        )
        for i in range(3)
    ]
    expected = [events.event_to_pb(e) for e in stored]
    entries = [watch_frames.event_entry(e) for e in stored]
    single = api.WatchEventsResponse.FromString(watch_frames.single_event(entries[0]))
    assert single == api.WatchEventsResponse(event=expected[0])
    batch = api.WatchEventsResponse.FromString(watch_frames.event_batch(entries))
    assert batch == api.WatchEventsResponse(events=api.EventBatch(events=expected))


def test_change_frames_decode_as_the_generated_classes_would_build_them() -> None:
    from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
    from electric_sdk._wire import watch_frames

    changes = [
        api.EntityChange(
            entity=pb.Entity(ref=pb.EntityRef(type="t", id=f"e{i}" * (i * 40 + 1))), previous_state=i
        )
        for i in range(3)
    ]
    encoded = [c.SerializeToString() for c in changes]
    single = api.WatchEntitiesResponse.FromString(watch_frames.single_change(encoded[0]))
    assert single == api.WatchEntitiesResponse(change=changes[0])
    batch = api.WatchEntitiesResponse.FromString(watch_frames.change_batch(encoded))
    assert batch == api.WatchEntitiesResponse(changes=api.EntityChanges(changes=changes))


# -- guards: one place per conversion, at the bottom layer ---------------------------------------

# What only `_wire` may do: build an enum map from the wire's names, or build a wire time by hand.
CONVERTING = re.compile(
    r"\bpb\.(?:State|Signal|SignalOutcome|Operation|RunStatus|ExecAction|ExecDisposition)"
    r"\.(?:Value|Name|items|keys|values)\("
    r"|\b(?:Timestamp|Duration)\("
    r"|\.(?:FromDatetime|FromMilliseconds|FromSeconds|FromNanoseconds)\("
    r"|\bfromtimestamp\("
    r"|\bjson_format\.Parse\("
)


def _sources() -> list[Path]:
    roots = [ROOT / "electric_sdk", ROOT / "server" / "electric_server"]
    skip = {ROOT / "electric_sdk" / "_proto", WIRE}
    return [p for root in roots for p in root.rglob("*.py") if not any(p.is_relative_to(s) for s in skip)]


def test_nothing_outside_wire_converts_on_its_own() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _sources()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if CONVERTING.search(line)
    ]
    assert not found, "convert in electric_sdk/_wire, not here:\n" + "\n".join(found)


def test_wire_imports_only_the_bottom_layer() -> None:
    """``_wire`` is shared by the server and the SDK: it may not pull in either's upper layers."""
    allowed = ("electric_sdk._proto", "electric_sdk._wire", "electric_sdk.lifecycle", "google.protobuf")
    for path in WIRE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = ["electric_sdk", "_wire"][: 2 - node.level + 1]
                names = [".".join([*base, node.module]) if node.module else ".".join(base)]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                ok = top in sys.stdlib_module_names or name.startswith(allowed)
                assert ok, f"{path.name} imports {name}"
