"""An entity on the wire: its record to a ``pb.Entity``, and its URL.

The server's store record (``EntityRecord``) is taken by the fields it has,
through ``EntityFields``: this package knows nothing of the server.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

from .._proto.electric.v1 import types_pb2 as pb
from ..lifecycle import STATE_RULES, State
from .enums import STATE_TO_PB
from .times import duration_from_ms, timestamp_from_ms

__all__ = ["EntityFields", "HolderFields", "entity_to_pb", "entity_url", "profile_from_pb"]


class EntityFields(Protocol):
    """What ``entity_to_pb`` reads of an entity's record (read-only: records are NamedTuples)."""

    @property
    def type(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def state(self) -> State: ...
    @property
    def grace_ms(self) -> int: ...
    @property
    def idle_timeout_ms(self) -> int: ...
    @property
    def created_at_ms(self) -> int: ...
    @property
    def updated_at_ms(self) -> int: ...
    @property
    def head_offset(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def stopping_deadline_ms(self) -> int | None: ...
    @property
    def txid(self) -> int: ...
    @property
    def grace_pending(self) -> bool: ...
    @property
    def idle_timeout_pending(self) -> bool: ...
    @property
    def message_waiting(self) -> bool: ...
    @property
    def lease_epoch(self) -> int: ...
    @property
    def cursor_attempt(self) -> int: ...
    @property
    def run_version(self) -> str: ...
    @property
    def waiting_since_ms(self) -> int | None: ...
    @property
    def parent(self) -> str: ...
    @property
    def awaiting_run(self) -> str: ...
    @property
    def awaiting_question(self) -> str: ...


class HolderFields(Protocol):
    """What ``entity_to_pb`` reads of the session holding the lease (the server's ``SessionRow``)."""

    @property
    def id(self) -> str: ...
    @property
    def worker_id(self) -> str: ...
    @property
    def replica(self) -> str: ...


def parent_key(type_: str, id_: str) -> str:
    """How a record names its parent ("type/id": names hold no "/")."""
    return f"{type_}/{id_}"


def entity_url(type_: str, id_: str) -> str:
    """``/{entity_type}/{instance_id}``: how the RFC names an entity."""
    return f"/{type_}/{id_}"


def entity_to_pb(record: EntityFields, holder: HolderFields | None = None) -> pb.Entity:
    """A profile value still pending (the type's default, fixed at the first lease) is left unset
    and named in ``pending_profile``. ``holder``: the live session holding the lease, if known."""
    profile = pb.Profile()
    pending = []
    if record.grace_pending:
        pending.append(pb.PROFILE_FIELD_GRACE_PERIOD)
    else:
        profile.grace_period.CopyFrom(duration_from_ms(record.grace_ms))
    if record.idle_timeout_pending:
        pending.append(pb.PROFILE_FIELD_IDLE_TIMEOUT)
    else:
        profile.idle_timeout.CopyFrom(duration_from_ms(record.idle_timeout_ms))
    message = pb.Entity(
        ref=pb.EntityRef(type=record.type, id=record.id),
        state=STATE_TO_PB[record.state],
        profile=profile,
        pending_profile=pending,
        created_at=timestamp_from_ms(record.created_at_ms),
        updated_at=timestamp_from_ms(record.updated_at_ms),
        head_offset=record.head_offset,
        closed=record.closed,
        txid=record.txid,
        message_waiting=record.message_waiting,
    )
    if record.stopping_deadline_ms is not None:
        message.stopping_deadline.CopyFrom(timestamp_from_ms(record.stopping_deadline_ms))
    if record.cursor_attempt > 0 and record.run_version:  # a run in flight, bound to its version
        message.bound_code_version = record.run_version
        # It waits for a worker of it (no lease since its last one ended) unless the entity is
        # shutting down: a SIGTERM's cleanup goes to the version new wakes get.
        if record.waiting_since_ms is not None and not STATE_RULES[record.state].shutting_down:
            message.waiting_since.CopyFrom(timestamp_from_ms(record.waiting_since_ms))
    if record.parent:
        parent_type, _, parent_id = record.parent.partition("/")
        message.parent.CopyFrom(pb.EntityRef(type=parent_type, id=parent_id))
    if record.awaiting_run:
        message.awaiting_input.CopyFrom(
            pb.AwaitingInput(run=record.awaiting_run, question=record.awaiting_question)
        )
    if holder is not None:
        message.holder.CopyFrom(
            pb.LeaseHolder(
                worker_id=holder.worker_id,
                session=holder.id,
                replica=holder.replica,
                epoch=record.lease_epoch,
            )
        )
    return message


def profile_from_pb(m: pb.Entity) -> tuple[timedelta | None, timedelta | None]:
    """An entity's grace period and idle timeout; None for a value still pending (its type's
    default, fixed at the entity's first lease)."""
    pending = set(m.pending_profile)
    grace = None if pb.PROFILE_FIELD_GRACE_PERIOD in pending else m.profile.grace_period.ToTimedelta()
    idle = None if pb.PROFILE_FIELD_IDLE_TIMEOUT in pending else m.profile.idle_timeout.ToTimedelta()
    return grace, idle
