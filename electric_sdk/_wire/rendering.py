"""The RFC's JSON shapes of the wire's responses: the one renderer.

The SDK's models render through it (``to_json()``) and so does the server's
HTTP door, so a client reading either sees the same JSON for the same record.
Instants are ISO text except a response's ``created_at`` (epoch milliseconds,
as the RFC writes it); txids are strings (JSON numbers lose 64-bit integers).
"""

from __future__ import annotations

from typing import Any

from .._proto.electric.v1 import entity_service_pb2 as api
from .._proto.electric.v1 import types_pb2 as pb
from .entities import entity_url, profile_from_pb
from .enums import OPERATION_NAMES, outcome_from_pb, signal_from_pb, state_from_pb
from .events import event_value_json
from .times import datetime_to_ms, timedelta_to_ms, timestamp_to_datetime, to_iso

__all__ = [
    "change_message_json",
    "entity_change_json",
    "entity_json",
    "event_json",
    "holder_json",
    "message_receipt_json",
    "signal_json",
    "signal_many_json",
]


def _epoch_ms(ts: Any) -> int:
    if ts.nanos % 1_000_000 == 0:  # whole milliseconds, as the server writes them: exact as is
        return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000
    return datetime_to_ms(timestamp_to_datetime(ts))


def _state(value: int) -> str | None:
    state = state_from_pb(value)
    return state.value if state else None


def entity_json(m: pb.Entity) -> dict[str, Any]:
    """An entity; a profile value the spawn left to its type is ``null`` and named in ``pending``."""
    grace, idle = profile_from_pb(m)
    return {
        "url": entity_url(m.ref.type, m.ref.id),
        "type": m.ref.type,
        "id": m.ref.id,
        "state": _state(m.state),
        "profile": {
            "grace_period_ms": None if grace is None else timedelta_to_ms(grace),
            "idle_timeout_ms": None if idle is None else timedelta_to_ms(idle),
            "pending": [
                name for name, value in (("grace_period", grace), ("idle_timeout", idle)) if value is None
            ],
        },
        "created_at": to_iso(timestamp_to_datetime(m.created_at)),
        "updated_at": to_iso(timestamp_to_datetime(m.updated_at)),
        "head_offset": m.head_offset,
        "closed": m.closed,
        "stopping_deadline": to_iso(timestamp_to_datetime(m.stopping_deadline))
        if m.HasField("stopping_deadline")
        else None,
        "txid": str(m.txid),
        "holder": holder_json(m.holder) if m.HasField("holder") else None,
        "bound_code_version": m.bound_code_version or None,
        "waiting_since": to_iso(timestamp_to_datetime(m.waiting_since))
        if m.HasField("waiting_since")
        else None,
        "parent": entity_url(m.parent.type, m.parent.id) if m.HasField("parent") else None,
        # Its last run asked for input (ctx.ask) and no reply came yet: the next message is the reply.
        "awaiting_input": {"run": m.awaiting_input.run, "question": m.awaiting_input.question}
        if m.HasField("awaiting_input")
        else None,
    }


def holder_json(m: pb.LeaseHolder) -> dict[str, Any]:
    """The worker holding an entity's lease (``holder`` of an entity)."""
    return {"worker_id": m.worker_id, "session": m.session, "replica": m.replica, "epoch": m.epoch}


def change_message_json(m: pb.Event) -> dict[str, Any]:
    """The RFC's event shape, exactly a State Protocol change message: no offset (a Durable
    Streams read carries it in ``Stream-Next-Offset``, and the protocol's schema allows no more)."""
    return {
        "type": m.type,
        "key": m.key,
        "value": event_value_json(m),
        "headers": {
            "operation": OPERATION_NAMES.get(m.headers.operation, "unspecified"),
            "timestamp": to_iso(timestamp_to_datetime(m.headers.timestamp)),
            "txid": str(m.headers.txid),
        },
    }


def event_json(m: pb.Event) -> dict[str, Any]:
    """The RFC's event shape, plus the stream offset (a page of events carries it)."""
    return {**change_message_json(m), "offset": m.offset}


def entity_change_json(m: api.EntityChange) -> dict[str, Any]:
    """A state change seen by a watch of entities: the entity after it, and its state before."""
    return {
        "entity": entity_json(m.entity),
        "previous_state": _state(m.previous_state),
        "changed_at": to_iso(timestamp_to_datetime(m.changed_at)),
    }


def signal_json(m: api.SignalEntityResponse) -> dict[str, Any]:
    """Exactly the RFC's response fields, plus the record key and outcome."""
    outcome = outcome_from_pb(m.outcome)
    return {
        "url": m.url,
        "signal": signal_from_pb(m.signal).value,
        "previous_state": _state(m.previous_state),
        "new_state": _state(m.new_state),
        "created_at": _epoch_ms(m.created_at),
        "txid": str(m.txid),
        "key": m.key,
        "outcome": outcome.value if outcome else None,
    }


def signal_many_json(m: api.SignalEntitiesResponse) -> dict[str, Any]:
    return {
        "signalled": m.signalled,
        "ignored": m.ignored,
        "skipped": m.skipped,
        "not_found": m.not_found,
        "created_at": _epoch_ms(m.created_at),
    }


def message_receipt_json(url: str, m: api.SendMessageResponse | api.RetryRunResponse) -> dict[str, Any]:
    return {
        "url": url,
        "key": m.key,
        "offset": m.offset,
        "txid": str(m.txid),
        "created_at": _epoch_ms(m.created_at),
        "state": _state(m.state),
        # A send's double-texting answer (a retry's receipt has none).
        **({"policy": m.policy} if isinstance(m, api.SendMessageResponse) and m.policy else {}),
        **({"signal_key": m.signal_key} if isinstance(m, api.SendMessageResponse) and m.signal_key else {}),
    }
