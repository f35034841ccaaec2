"""An event on the wire: a stored event to a ``pb.Event``, its stored body, and its value as JSON.

The store keeps only an event's typed value as bytes (``event_body``); offset,
type, key and headers are its columns, put back by ``event_to_pb``. The server's
``StoredEvent`` is taken by the fields it has, through ``StoredEventFields``.

``event_value_json`` renders an event's value in the RFC's JSON shape (enums by
name, times as ISO text): the SDK's ``Event.value`` and any JSON door share it.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any, Protocol

from .._proto.electric.v1 import types_pb2 as pb
from .enums import (
    EXEC_ACTION_NAMES,
    EXEC_DISPOSITION_NAMES,
    PB_TO_OUTCOME,
    PB_TO_SIGNAL,
    PB_TO_STATE,
    RUN_STATUS_NAMES,
)
from .json_values import value_to_json
from .times import timestamp_from_ms, timestamp_to_datetime, to_iso

__all__ = ["StoredEventFields", "event_body", "event_to_pb", "event_value_json", "receipt_json"]


class StoredEventFields(Protocol):
    """What ``event_to_pb`` reads of a stored event (read-only: records are NamedTuples)."""

    @property
    def offset(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def operation(self) -> int: ...
    @property
    def timestamp_ms(self) -> int: ...
    @property
    def txid(self) -> int: ...
    @property
    def body(self) -> bytes: ...


def event_to_pb(stored: StoredEventFields) -> pb.Event:
    message = pb.Event.FromString(stored.body)
    message.offset = stored.offset
    message.type = stored.kind
    message.key = stored.key
    message.headers.operation = stored.operation  # type: ignore[assignment]
    message.headers.timestamp.CopyFrom(timestamp_from_ms(stored.timestamp_ms))
    message.headers.txid = stored.txid
    return message


def event_body(message: pb.Event) -> bytes:
    """Only the typed value is stored; offset, type, key and headers are columns."""
    return message.SerializeToString(deterministic=True)


def _name(table: Mapping[int, Enum], value: int) -> str | None:
    """An enum's JSON text, None for a value the table lacks (``UNSPECIFIED``)."""
    found = table.get(value)
    return found.value if found else None


def event_value_json(m: pb.Event) -> dict[str, Any]:
    """The event's typed value as the RFC's JSON object (``{}`` for a kind this version lacks)."""
    kind = m.WhichOneof("value")
    if kind == "signal":
        s = m.signal
        out: dict[str, Any] = {
            "signal": PB_TO_SIGNAL[s.signal].value,
            "sender": s.sender,
            "reason": s.reason,
        }
        if s.HasField("payload"):
            out["payload"] = value_to_json(s.payload)
        out["outcome"] = _name(PB_TO_OUTCOME, s.outcome)
        out["previous_state"] = _name(PB_TO_STATE, s.previous_state)
        out["new_state"] = _name(PB_TO_STATE, s.new_state)
        if s.detail:
            out["detail"] = s.detail
        if s.message_key:
            out["message_key"] = s.message_key
        return out
    if kind == "state":
        st = m.state
        out = {
            "state": _name(PB_TO_STATE, st.state),
            "previous_state": _name(PB_TO_STATE, st.previous_state),
            "cause": st.cause,
        }
        if st.signal_key:
            out["signal_key"] = st.signal_key
        if st.HasField("deadline"):
            out["deadline"] = to_iso(timestamp_to_datetime(st.deadline))
        return out
    if kind == "message":
        msg = m.message
        out = {"text": msg.text, "sender": msg.sender}
        if msg.HasField("data"):
            out["data"] = value_to_json(msg.data)
        if msg.HasField("retry"):
            retry = msg.retry
            out["retry"] = {
                "message_key": retry.message_key,
                "message_offset": retry.message_offset,
                "from_step": retry.from_step,
                "sender": retry.sender,
                "reason": retry.reason,
            }
        if msg.steer:
            out["steer"] = True
        if msg.ahead:
            out["ahead"] = True
        if msg.HasField("reply"):
            reply: dict[str, Any] = {"ask_key": msg.reply.ask_key, "text": msg.reply.text}
            if msg.reply.HasField("data"):
                reply["data"] = value_to_json(msg.reply.data)
            out["reply"] = reply
        return out
    if kind == "run":
        r = m.run
        run: dict[str, Any] = {
            "message_key": r.message_key,
            "message_offset": r.message_offset,
            "status": RUN_STATUS_NAMES.get(r.status, "unspecified"),
            "attempt": r.attempt,
        }
        for name in ("step", "output", "error", "code_version", "question", "steered_into"):
            if getattr(r, name):
                run[name] = getattr(r, name)
        if r.status == pb.RUN_STATUS_INPUT_REQUIRED:
            run["ask_step"] = r.ask_step
        if r.status == pb.RUN_STATUS_STEERED:
            run["steered_step"] = r.steered_step
        return run
    if kind == "custom":
        data = value_to_json(m.custom.data) if m.custom.HasField("data") else None
        return {"data": data}
    if kind == "exec":
        return receipt_json(m.exec)
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


def receipt_json(r: pb.ExecReceipt) -> dict[str, Any]:
    """An exec receipt: every field named, times as ISO strings, the evidence as a nested object."""
    g = r.generation
    out: dict[str, Any] = {
        "task_id": r.task_id,
        "action": EXEC_ACTION_NAMES.get(r.action, "unspecified"),
        "action_name": r.action_name,
        "disposition": EXEC_DISPOSITION_NAMES.get(r.disposition, "unspecified"),
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
        out["issued_at"] = to_iso(timestamp_to_datetime(r.issued_at))
    if r.HasField("deadline"):
        out["deadline"] = to_iso(timestamp_to_datetime(r.deadline))
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
