"""Public types: what the SDK returns and accepts. No generated pb2 type leaks
out of here; each model keeps its wire message as ``.raw`` as an escape hatch.

Times are timezone-aware ``datetime`` in UTC; durations are ``timedelta``.
``Event.to_json()`` renders the RFC's event shape.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import struct_pb2, timestamp_pb2

from ._proto.electric.v1 import entity_service_pb2 as api
from ._proto.electric.v1 import types_pb2 as pb
from .lifecycle import Outcome, Signal, State

__all__ = [
    "Entity",
    "EntityChange",
    "EntityRef",
    "Event",
    "EventPage",
    "MessageReceipt",
    "Outcome",
    "Signal",
    "SignalManyResult",
    "SignalResult",
    "State",
]


# -- enum mapping -------------------------------------------------------------------


# Lookup tables, built once: these run for every event a watch delivers.
_STATE_TO_PB: dict[State, pb.State.ValueType] = {s: pb.State.Value(f"STATE_{s.name}") for s in State}
_PB_TO_STATE: dict[int, State] = {v: k for k, v in _STATE_TO_PB.items()}
_SIGNAL_TO_PB: dict[Signal, pb.Signal.ValueType] = {s: pb.Signal.Value(f"SIGNAL_{s.name}") for s in Signal}
_PB_TO_SIGNAL: dict[int, Signal] = {v: k for k, v in _SIGNAL_TO_PB.items()}
_PB_TO_OUTCOME: dict[int, Outcome] = {pb.SignalOutcome.Value(f"SIGNAL_OUTCOME_{o.name}"): o for o in Outcome}
_RUN_STATUS: dict[int, str] = {v: n.removeprefix("RUN_STATUS_").lower() for n, v in pb.RunStatus.items()}
_OPERATIONS: dict[int, str] = {v: n.removeprefix("OPERATION_").lower() for n, v in pb.Operation.items()}
_EXEC_ACTIONS: dict[int, str] = {v: n.removeprefix("EXEC_ACTION_").lower() for n, v in pb.ExecAction.items()}
_EXEC_DISPOSITIONS: dict[int, str] = {
    v: n.removeprefix("EXEC_DISPOSITION_").lower() for n, v in pb.ExecDisposition.items()
}


def state_from_pb(value: int) -> State | None:
    return _PB_TO_STATE.get(value)


def state_to_pb(state: State) -> pb.State.ValueType:
    return _STATE_TO_PB[state]


def signal_from_pb(value: int) -> Signal:
    return _PB_TO_SIGNAL[value]


def signal_to_pb(signal: Signal) -> pb.Signal.ValueType:
    return _SIGNAL_TO_PB[signal]


def outcome_from_pb(value: int) -> Outcome | None:
    return _PB_TO_OUTCOME.get(value)


def _time(ts: timestamp_pb2.Timestamp) -> datetime:
    return datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, UTC)


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


def _json_value(value: struct_pb2.Value) -> Any:
    """A protobuf Value as plain Python (walked directly: MessageToDict is slow)."""
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        n = value.number_value
        # JSON numbers travel as doubles; give back 1, not 1.0.
        return int(n) if n.is_integer() and abs(n) < 2**53 else n
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return {k: _json_value(v) for k, v in value.struct_value.fields.items()}
    if kind == "list_value":
        return [_json_value(v) for v in value.list_value.values]
    return None


def _html_table(title: str, rows: list[tuple[str, Any]]) -> str:
    cells = "".join(
        f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
        for k, v in rows
    )
    return f"<table><caption style='text-align:left'><b>{html.escape(title)}</b></caption>{cells}</table>"


# -- refs -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EntityRef:
    """``{entity_type}/{instance_id}``; parses ``"type/id"`` and ``"/type/id"``."""

    type: str
    id: str

    @classmethod
    def parse(cls, text: str | EntityRef) -> EntityRef:
        if isinstance(text, EntityRef):
            return text
        parts = text.strip().removeprefix("/").split("/")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"expected an entity as TYPE/ID (or /TYPE/ID), got {text!r}")
        return cls(parts[0], parts[1])

    @property
    def url(self) -> str:
        return f"/{self.type}/{self.id}"

    def __str__(self) -> str:
        return f"{self.type}/{self.id}"

    def to_pb(self) -> pb.EntityRef:
        return pb.EntityRef(type=self.type, id=self.id)


# -- entities ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entity:
    ref: EntityRef
    state: State
    grace_period: timedelta
    idle_timeout: timedelta
    created_at: datetime
    updated_at: datetime
    head_offset: int
    closed: bool
    stopping_deadline: datetime | None
    txid: int
    raw: pb.Entity = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, m: pb.Entity) -> Entity:
        state = state_from_pb(m.state)
        assert state is not None, "the server always sets an entity's state"
        return cls(
            ref=EntityRef(m.ref.type, m.ref.id),
            state=state,
            grace_period=m.profile.grace_period.ToTimedelta(),
            idle_timeout=m.profile.idle_timeout.ToTimedelta(),
            created_at=_time(m.created_at),
            updated_at=_time(m.updated_at),
            head_offset=m.head_offset,
            closed=m.closed,
            stopping_deadline=_time(m.stopping_deadline) if m.HasField("stopping_deadline") else None,
            txid=m.txid,
            raw=m,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.ref.url,
            "type": self.ref.type,
            "id": self.ref.id,
            "state": self.state.value,
            "profile": {
                "grace_period_ms": int(self.grace_period / timedelta(milliseconds=1)),
                "idle_timeout_ms": int(self.idle_timeout / timedelta(milliseconds=1)),
            },
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "head_offset": self.head_offset,
            "closed": self.closed,
            "stopping_deadline": _iso(self.stopping_deadline) if self.stopping_deadline else None,
            "txid": str(self.txid),
        }

    def _repr_html_(self) -> str:
        rows: list[tuple[str, Any]] = [
            ("state", self.state.value),
            ("grace period", self.grace_period),
            ("idle timeout", self.idle_timeout),
            ("events", self.head_offset),
            ("closed", self.closed),
            ("updated", _iso(self.updated_at)),
        ]
        if self.stopping_deadline:
            rows.append(("stopping deadline", _iso(self.stopping_deadline)))
        return _html_table(self.ref.url, rows)


@dataclass(frozen=True, slots=True)
class EntityChange:
    """A state change seen by ``watch_entities`` (or a snapshot row: ``previous_state`` None)."""

    entity: Entity
    previous_state: State | None
    snapshot: bool


# -- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    offset: int
    type: str
    key: str
    operation: str  # insert | update | delete
    timestamp: datetime
    txid: int
    value: dict[str, Any]
    raw: pb.Event = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, m: pb.Event) -> Event:
        return cls(
            offset=m.offset,
            type=m.type,
            key=m.key,
            operation=_OPERATIONS.get(m.headers.operation, "unspecified"),
            timestamp=_time(m.headers.timestamp),
            txid=m.headers.txid,
            value=_value_json(m),
            raw=m,
        )

    @property
    def signal(self) -> Signal | None:
        return Signal.parse(self.value["signal"]) if self.type == "signal" else None

    @property
    def state(self) -> State | None:
        return State.parse(self.value["state"]) if self.type == "state" else None

    def to_json(self) -> dict[str, Any]:
        """The RFC's event shape, plus the stream offset."""
        return {
            "type": self.type,
            "key": self.key,
            "value": self.value,
            "headers": {
                "operation": self.operation,
                "timestamp": _iso(self.timestamp),
                "txid": str(self.txid),
            },
            "offset": self.offset,
        }

    def _repr_html_(self) -> str:
        return _html_table(
            f"#{self.offset} {self.type} {self.key}",
            [*self.value.items(), ("operation", self.operation), ("at", _iso(self.timestamp))],
        )


def _value_json(m: pb.Event) -> dict[str, Any]:
    kind = m.WhichOneof("value")
    if kind == "signal":
        s = m.signal
        out: dict[str, Any] = {
            "signal": signal_from_pb(s.signal).value,
            "sender": s.sender,
            "reason": s.reason,
        }
        if s.HasField("payload"):
            out["payload"] = _json_value(s.payload)
        outcome = outcome_from_pb(s.outcome)
        out["outcome"] = outcome.value if outcome else None
        for name, value in (("previous_state", s.previous_state), ("new_state", s.new_state)):
            judged = state_from_pb(value)
            out[name] = judged.value if judged else None
        if s.detail:
            out["detail"] = s.detail
        if s.message_key:
            out["message_key"] = s.message_key
        return out
    if kind == "state":
        st = m.state
        new = state_from_pb(st.state)
        out = {"state": new.value if new else None}
        prev = state_from_pb(st.previous_state)
        out["previous_state"] = prev.value if prev else None
        out["cause"] = st.cause
        if st.signal_key:
            out["signal_key"] = st.signal_key
        if st.HasField("deadline"):
            out["deadline"] = _iso(_time(st.deadline))
        return out
    if kind == "message":
        msg = m.message
        out = {"text": msg.text, "sender": msg.sender}
        if msg.HasField("data"):
            out["data"] = _json_value(msg.data)
        return out
    if kind == "run":
        r = m.run
        run: dict[str, Any] = {
            "message_key": r.message_key,
            "message_offset": r.message_offset,
            "status": _RUN_STATUS.get(r.status, "unspecified"),
            "attempt": r.attempt,
        }
        for name in ("step", "output", "error"):
            if getattr(r, name):
                run[name] = getattr(r, name)
        return run
    if kind == "custom":
        data = _json_value(m.custom.data) if m.custom.HasField("data") else None
        return {"data": data}
    if kind == "exec":
        return _receipt_json(m.exec)
    if kind == "output":
        o = m.output
        chunk: dict[str, Any] = {
            "task_id": o.task_id,
            "generation": o.generation,
            "stream": o.stream,
            "text": o.text,
        }
        if o.truncated:
            chunk["truncated"] = True
            chunk["dropped_bytes"] = o.dropped_bytes
        return chunk
    return {}


def _receipt_json(r: pb.ExecReceipt) -> dict[str, Any]:
    """An exec receipt: every field named, times as ISO strings, the evidence as a nested object."""
    g = r.generation
    out: dict[str, Any] = {
        "task_id": r.task_id,
        "action": _EXEC_ACTIONS.get(r.action, "unspecified"),
        "action_name": r.action_name,
        "disposition": _EXEC_DISPOSITIONS.get(r.disposition, "unspecified"),
        "backend": r.backend,
        "generation": {
            "task_id": g.task_id,
            "generation": g.generation,
            "pid": g.pid,
            "start_time": g.start_time,
            "boot_id": g.boot_id,
            "worker_id": g.worker_id,
        }
        if r.HasField("generation")
        else None,
        "escalated": r.escalated,
        "group": r.group,
    }
    if r.HasField("issued_at"):
        out["issued_at"] = _iso(_time(r.issued_at))
    if r.HasField("deadline"):
        out["deadline"] = _iso(_time(r.deadline))
    if r.HasField("timeout"):
        out["timeout_ms"] = r.timeout.ToMilliseconds()
    if r.HasField("exit_status"):
        out["exit_status"] = r.exit_status
    for name in ("reason", "signal_key"):
        if getattr(r, name):
            out[name] = getattr(r, name)
    if r.tags:
        out["tags"] = list(r.tags)
    return out


@dataclass(frozen=True, slots=True)
class EventPage:
    events: tuple[Event, ...]
    next_offset: int
    head_offset: int
    end_of_stream: bool


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SignalResult:
    """The RFC's signal response."""

    ref: EntityRef
    signal: Signal
    previous_state: State
    new_state: State
    created_at: datetime
    txid: int
    key: str
    outcome: Outcome | None
    raw: api.SignalEntityResponse = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, m: api.SignalEntityResponse) -> SignalResult:
        prev, new = state_from_pb(m.previous_state), state_from_pb(m.new_state)
        assert prev is not None
        assert new is not None
        return cls(
            ref=EntityRef.parse(m.url),
            signal=signal_from_pb(m.signal),
            previous_state=prev,
            new_state=new,
            created_at=_time(m.created_at),
            txid=m.txid,
            key=m.key,
            outcome=outcome_from_pb(m.outcome),
            raw=m,
        )

    @property
    def url(self) -> str:
        return self.ref.url

    def to_json(self) -> dict[str, Any]:
        """Exactly the RFC's response fields (plus the record key and outcome)."""
        return {
            "url": self.ref.url,
            "signal": self.signal.value,
            "previous_state": self.previous_state.value,
            "new_state": self.new_state.value,
            "created_at": _ms(self.created_at),
            "txid": str(self.txid),
            "key": self.key,
            "outcome": self.outcome.value if self.outcome else None,
        }

    def __str__(self) -> str:
        return f"{self.ref.url}: {self.signal.value} {self.previous_state.value} → {self.new_state.value}"

    def _repr_html_(self) -> str:
        return _html_table(str(self), list(self.to_json().items()))


@dataclass(frozen=True, slots=True)
class SignalManyResult:
    signalled: int
    ignored: int
    skipped: int
    not_found: int
    created_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "signalled": self.signalled,
            "ignored": self.ignored,
            "skipped": self.skipped,
            "not_found": self.not_found,
            "created_at": _ms(self.created_at),
        }

    def _repr_html_(self) -> str:
        return _html_table("signal_many", list(self.to_json().items()))


@dataclass(frozen=True, slots=True)
class MessageReceipt:
    ref: EntityRef
    key: str
    offset: int
    txid: int
    created_at: datetime
    state: State

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.ref.url,
            "key": self.key,
            "offset": self.offset,
            "txid": str(self.txid),
            "created_at": _ms(self.created_at),
            "state": self.state.value,
        }

    def _repr_html_(self) -> str:
        return _html_table(f"message {self.key}", list(self.to_json().items()))


def dumps(obj: Any) -> str:
    """Compact JSON of a model's ``to_json()`` (NDJSON lines)."""
    return json.dumps(
        obj.to_json() if hasattr(obj, "to_json") else obj, separators=(",", ":"), ensure_ascii=False
    )
