"""Public types: what the SDK returns and accepts. No generated pb2 type leaks
out of here; each model keeps its wire message as ``.raw`` as an escape hatch.

Times are timezone-aware ``datetime`` in UTC; durations are ``timedelta``.
``to_json()`` renders the RFC's JSON shapes through ``_wire.rendering``, the
renderer the server's HTTP door uses too. Each conversion of a field to or from
the wire is ``_wire``'s, which the server shares; a model assembles them.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ._proto.electric.v1 import entity_service_pb2 as api
from ._proto.electric.v1 import types_pb2 as pb
from ._wire.entities import entity_url, profile_from_pb
from ._wire.enums import OPERATION_NAMES, outcome_from_pb, signal_from_pb, state_from_pb
from ._wire.events import event_value_json
from ._wire.rendering import entity_json, event_json, signal_json
from ._wire.stop_stages import StageReport, report_from_pb
from ._wire.times import datetime_to_ms, timedelta_to_ms, timestamp_to_datetime, to_iso
from .lifecycle import Outcome, Signal, Stage, State

__all__ = [
    "AwaitingInput",
    "Entity",
    "EntityChange",
    "EntityRef",
    "Event",
    "EventPage",
    "LeaseHolder",
    "MessageReceipt",
    "Outcome",
    "Signal",
    "SignalManyResult",
    "SignalResult",
    "State",
]


# -- notebooks --------------------------------------------------------------------------


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
        return entity_url(self.type, self.id)

    def __str__(self) -> str:
        return f"{self.type}/{self.id}"

    def to_pb(self) -> pb.EntityRef:
        return pb.EntityRef(type=self.type, id=self.id)


# -- entities ---------------------------------------------------------------------------

# How a profile value the spawn left to the entity type is shown until the first lease fixes it.
PROFILE_PENDING = "type default, pending"


def _ms_or_none(value: timedelta | None) -> int | None:
    return None if value is None else timedelta_to_ms(value)


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """The worker whose runtime holds an entity's lease now (while its session is live)."""

    worker_id: str
    session: str  # the worker session it was granted to; a reconnecting worker opens a new one
    replica: str  # the server replica that session is connected to
    epoch: int  # the lease's fencing token

    @classmethod
    def from_pb(cls, m: pb.LeaseHolder) -> LeaseHolder:
        return cls(worker_id=m.worker_id, session=m.session, replica=m.replica, epoch=m.epoch)


@dataclass(frozen=True, slots=True)
class Entity:
    ref: EntityRef
    state: State
    # None: the spawn left it to the entity type's default, fixed at the entity's first lease
    # ("type default, pending").
    grace_period: timedelta | None
    idle_timeout: timedelta | None
    created_at: datetime
    updated_at: datetime
    head_offset: int
    closed: bool
    stopping_deadline: datetime | None
    txid: int
    raw: pb.Entity = field(repr=False, compare=False)
    # The worker holding its lease, as GetEntity and ListEntities say; None: no live lease (or a
    # watch's or a write's answer, which do not say).
    holder: LeaseHolder | None = None
    # The code version its run in flight is bound to (docs/runtime.md, "Deploys"); None: no run
    # in flight, or one started by a worker that named no version.
    bound_code_version: str | None = None
    # Since when that run waits for a worker of its version (no lease); None: it does not wait.
    waiting_since: datetime | None = None
    # The entity it was spawned as a child of; None: a root.
    parent: EntityRef | None = None
    # Its last run asked for input (``ctx.ask``): that run's message key and its question; the
    # next message sent is the reply. None: nothing is asked.
    awaiting_input: AwaitingInput | None = None

    @property
    def waiting_for_code(self) -> str | None:
        """The code version the entity's run waits for, while it does: `get` and `ls` say
        "waiting for code VERSION"."""
        return self.bound_code_version if self.waiting_since is not None else None

    @classmethod
    def from_pb(cls, m: pb.Entity) -> Entity:
        state = state_from_pb(m.state)
        assert state is not None, "the server always sets an entity's state"
        grace_period, idle_timeout = profile_from_pb(m)
        return cls(
            ref=EntityRef(m.ref.type, m.ref.id),
            state=state,
            grace_period=grace_period,
            idle_timeout=idle_timeout,
            created_at=timestamp_to_datetime(m.created_at),
            updated_at=timestamp_to_datetime(m.updated_at),
            head_offset=m.head_offset,
            closed=m.closed,
            stopping_deadline=timestamp_to_datetime(m.stopping_deadline)
            if m.HasField("stopping_deadline")
            else None,
            txid=m.txid,
            raw=m,
            holder=LeaseHolder.from_pb(m.holder) if m.HasField("holder") else None,
            bound_code_version=m.bound_code_version or None,
            waiting_since=timestamp_to_datetime(m.waiting_since) if m.HasField("waiting_since") else None,
            parent=EntityRef(m.parent.type, m.parent.id) if m.HasField("parent") else None,
            awaiting_input=AwaitingInput(m.awaiting_input.run, m.awaiting_input.question)
            if m.HasField("awaiting_input")
            else None,
        )

    def to_json(self) -> dict[str, Any]:
        return entity_json(self.raw)

    def _repr_html_(self) -> str:
        rows: list[tuple[str, Any]] = [
            ("state", self.state.value),
            ("grace period", self.grace_period or PROFILE_PENDING),
            ("idle timeout", self.idle_timeout or PROFILE_PENDING),
            ("events", self.head_offset),
            ("closed", self.closed),
            ("updated", to_iso(self.updated_at)),
        ]
        if self.waiting_for_code:
            rows.append(("waiting for code", self.waiting_for_code))
        if self.stopping_deadline:
            rows.append(("stopping deadline", to_iso(self.stopping_deadline)))
        if self.holder:
            rows.append(("worker", self.holder.worker_id))
        if self.parent:
            rows.append(("parent", self.parent.url))
        if self.awaiting_input:
            rows.append(("awaiting input", self.awaiting_input.question))
        return _html_table(self.ref.url, rows)


@dataclass(frozen=True, slots=True)
class AwaitingInput:
    """A run that ended asking for input (``ctx.ask``): its message key and its question."""

    run: str
    question: str


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
            operation=OPERATION_NAMES.get(m.headers.operation, "unspecified"),
            timestamp=timestamp_to_datetime(m.headers.timestamp),
            txid=m.headers.txid,
            value=event_value_json(m),
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
        return event_json(self.raw)

    def _repr_html_(self) -> str:
        return _html_table(
            f"#{self.offset} {self.type} {self.key}",
            [*self.value.items(), ("operation", self.operation), ("at", to_iso(self.timestamp))],
        )


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
    # With ``wait=``: each stage the signal has, up to the one waited for, reached or not (and
    # why); without, none (the answer is ``accepted`` alone).
    stages: tuple[StageReport, ...] = ()

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
            created_at=timestamp_to_datetime(m.created_at),
            txid=m.txid,
            key=m.key,
            outcome=outcome_from_pb(m.outcome),
            raw=m,
            stages=tuple(report_from_pb(r) for r in m.stages),
        )

    @property
    def url(self) -> str:
        return self.ref.url

    def reached(self, stage: Stage | str) -> bool:
        """Whether the wait saw ``stage`` reached (``accepted`` always is)."""
        wanted = Stage(stage) if isinstance(stage, str) else stage
        if wanted is Stage.ACCEPTED:
            return True
        return any(r.stage is wanted and r.reached for r in self.stages)

    def to_json(self) -> dict[str, Any]:
        """Exactly the RFC's response fields (plus the record key and outcome; and the stages,
        after a wait)."""
        out = signal_json(self.raw)
        if self.stages:
            out["stages"] = [r.to_json() for r in self.stages]
        return out

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
            "created_at": datetime_to_ms(self.created_at),
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
    # The double-texting policy the server applied ("enqueue" when no run was in progress; ""
    # from a server that predates policies), and the SIGINT an interrupt or rollback appended.
    policy: str = ""
    signal_key: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.ref.url,
            "key": self.key,
            "offset": self.offset,
            "txid": str(self.txid),
            # ISO like every instant the SDK and CLI print; only the RFC's signal response
            # writes epoch milliseconds (the HTTP door's send response keeps its own shape).
            "created_at": to_iso(self.created_at),
            "state": self.state.value,
            **({"policy": self.policy} if self.policy else {}),
            **({"signal_key": self.signal_key} if self.signal_key else {}),
        }

    def _repr_html_(self) -> str:
        return _html_table(f"message {self.key}", list(self.to_json().items()))


@dataclass(frozen=True, slots=True)
class RunResult:
    """What ``send(..., wait="run")`` answers: the message's receipt and how its run ended.

    ``status``: ``completed`` (``output``), ``failed`` (``error``), ``aborted`` (the partial
    ``output``; ``error`` names what aborted it), ``cancelled`` (a scoped SIGINT, or the entity's
    end, before it started), ``input_required`` (``ctx.ask``: ``question``; the next message sent
    is the reply). A wait that times out raises ``RunNotEnded`` instead.
    """

    receipt: MessageReceipt
    status: str
    output: str | None
    error: str | None
    attempt: int
    entity_state: str | None
    question: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    def to_json(self) -> dict[str, Any]:
        return {
            "receipt": self.receipt.to_json(),
            "status": self.status,
            "output": self.output,
            "error": self.error,
            "attempt": self.attempt,
            "entity_state": self.entity_state,
            **({"question": self.question} if self.question is not None else {}),
        }

    def _repr_html_(self) -> str:
        return _html_table(f"run of {self.receipt.key}", [(k, v) for k, v in self.to_json().items()])


def dumps(obj: Any) -> str:
    """Compact JSON of a model's ``to_json()`` (NDJSON lines)."""
    return json.dumps(
        obj.to_json() if hasattr(obj, "to_json") else obj, separators=(",", ":"), ensure_ascii=False
    )
