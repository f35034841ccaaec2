"""Between the store's records and the wire's messages."""

from __future__ import annotations

from google.protobuf import duration_pb2, timestamp_pb2

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import Outcome, Signal, State

from .store.base import EntityRecord, StoredEvent

STATE_TO_PB: dict[State, pb.State.ValueType] = {s: pb.State.Value(f"STATE_{s.name}") for s in State}
SIGNAL_TO_PB: dict[Signal, pb.Signal.ValueType] = {s: pb.Signal.Value(f"SIGNAL_{s.name}") for s in Signal}
OUTCOME_TO_PB: dict[Outcome, pb.SignalOutcome.ValueType] = {
    o: pb.SignalOutcome.Value(f"SIGNAL_OUTCOME_{o.name}") for o in Outcome
}
PB_TO_STATE = {v: k for k, v in STATE_TO_PB.items()}


def timestamp(ms: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def duration(ms: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def url(type_: str, id_: str) -> str:
    return f"/{type_}/{id_}"


def entity(record: EntityRecord) -> pb.Entity:
    message = pb.Entity(
        ref=pb.EntityRef(type=record.type, id=record.id),
        state=STATE_TO_PB[record.state],
        profile=pb.Profile(
            grace_period=duration(record.grace_ms), idle_timeout=duration(record.idle_timeout_ms)
        ),
        created_at=timestamp(record.created_at_ms),
        updated_at=timestamp(record.updated_at_ms),
        head_offset=record.head_offset,
        closed=record.closed,
        txid=record.txid,
    )
    if record.stopping_deadline_ms is not None:
        message.stopping_deadline.CopyFrom(timestamp(record.stopping_deadline_ms))
    return message


def event(stored: StoredEvent) -> pb.Event:
    message = pb.Event.FromString(stored.body)
    message.offset = stored.offset
    message.type = stored.kind
    message.key = stored.key
    message.headers.operation = stored.operation  # type: ignore[assignment]
    message.headers.timestamp.CopyFrom(timestamp(stored.timestamp_ms))
    message.headers.txid = stored.txid
    return message


def body(message: pb.Event) -> bytes:
    """Only the typed value is stored; offset, type, key and headers are columns."""
    return message.SerializeToString(deterministic=True)
