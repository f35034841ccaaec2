"""Fork an entity at an offset; retry a failed or aborted run from a step.

Both read what they need of a stream first (events never change once written,
so what the read found still holds inside the write), then hand the store one
pure decide function, which refuses (nothing written) or appends:

- a fork is a write to the NEW entity: the origin's events at offsets
  ``0..offset-1`` copied with their type, key, operation and value (their
  headers are the fork's commit's), then its own records: ``electric.fork``
  ``{"origin", "offset", "sender", "reason"}`` at ``offset``, an ``ignored``
  outcome for each copied signal still ``pending`` (it was the origin's to act
  on), and ``state: idle`` (cause ``fork``). Its durable state and recorded
  steps are the origin's as of ``offset``, since both are rebuilt from the
  stream; its message cursor starts at ``offset``, so no copied message runs
  again. The origin is only read: a stopped or killed one can be forked.
- a retry is a message on the entity: a copy of the run's message (text, data,
  sender) whose ``retry`` names the run (key, offset), the step it executes
  from, and the retry's sender and reason. The runtime running it answers the
  steps before ``from_step`` from the run's records (runtime/records.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.entities import entity_url
from electric_sdk._wire.enums import OUTCOME_TO_PB
from electric_sdk._wire.events import event_body
from electric_sdk._wire.json_values import json_to_value, value_to_json
from electric_sdk.durable_state import STEP_EVENT
from electric_sdk.lifecycle import STATE_RULES, Outcome, State

from ..store.base import Decide, EntityRecord, Mutation, NewEvent, Ref, Store, StoredEvent, WriteContext
from . import message_cursor
from .entity_writes import INSERT, UPDATE, state_event
from .errors import ApiError, not_found

__all__ = ["FORK_EVENT", "Forked", "RunFound", "find_run", "fork", "origin_events", "retry"]

FORK_EVENT = "electric.fork"
_PAGE = 1000
# A run that ended this way may be run again; any other (started, a step, completed) may not.
_RETRYABLE = frozenset({pb.RUN_STATUS_FAILED, pb.RUN_STATUS_ABORTED})
_STATUS_TEXT: dict[int, str] = {
    pb.RUN_STATUS_STARTED: "running",
    pb.RUN_STATUS_STEP: "running",
    pb.RUN_STATUS_COMPLETED: "completed",
}
_FINAL_STEP_OUTCOMES = ("ok", "error")


def _refuse_offset(message: str, origin: Ref, offset: int, beyond: bool = False) -> ApiError:
    """A negative offset is never valid (INVALID_ARGUMENT); one past the head is not valid yet
    (OUT_OF_RANGE, as gRPC says of a read past the end: the state may change)."""
    code = grpc.StatusCode.OUT_OF_RANGE if beyond else grpc.StatusCode.INVALID_ARGUMENT
    metadata = {"field": "offset", "entity": entity_url(*origin), "offset": str(offset)}
    return ApiError(code, "INVALID_OFFSET", message, metadata)


async def origin_events(
    store: Store, origin: Ref, offset: int | None
) -> tuple[EntityRecord, list[StoredEvent]]:
    """The origin's record and its events before ``offset`` (None: its head), refusing an offset
    past the head or below 0."""
    record = await store.get_entity(origin)
    if record is None:
        raise not_found(*origin)
    at = record.head_offset if offset is None else offset
    if at < 0:
        raise _refuse_offset(f"offset must be 0 or more, got {at}", origin, at)
    if at > record.head_offset:
        raise _refuse_offset(
            f"offset {at} is past the head of {entity_url(*origin)} ({record.head_offset})", origin, at, True
        )
    events: list[StoredEvent] = []
    while len(events) < at:
        page = await store.read_events(origin, len(events), min(_PAGE, at - len(events)))
        if not page:
            break
        events.extend(e for e in page if e.offset < at)
    if len(events) != at:  # offsets are gap-free: a short read means the store lost events
        raise ApiError(grpc.StatusCode.INTERNAL, "INTERNAL", f"read {len(events)} of {at} events to fork")
    return record, events


@dataclass(frozen=True, slots=True)
class Forked:
    """A fork's result, for the response."""

    offset: int


def _pending_signals(events: list[StoredEvent]) -> list[tuple[StoredEvent, pb.Event]]:
    """The copied signal inserts no update settled, whose outcome is `pending`."""
    updated = {e.key for e in events if e.kind == "signal" and e.operation == UPDATE}
    found = []
    for e in events:
        if e.kind == "signal" and e.operation == INSERT and e.key not in updated:
            value = pb.Event.FromString(e.body)
            if value.signal.outcome == OUTCOME_TO_PB[Outcome.PENDING]:
                found.append((e, value))
    return found


def fork(ref: Ref, origin: EntityRecord, events: list[StoredEvent], sender: str, reason: str) -> Decide:
    """The new entity ``ref``: ``events`` (the origin's, from offset 0), then its own records."""
    offset = len(events)

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        if current is not None:
            raise ApiError(
                grpc.StatusCode.ALREADY_EXISTS,
                "ENTITY_EXISTS",
                f"Entity {entity_url(*ref)} already exists ({current.state.value})",
                {"entity": entity_url(*ref), "state": current.state.value},
            )
        out = [NewEvent(e.kind, e.key, e.operation, e.body) for e in events]
        data: dict[str, Any] = {
            "origin": entity_url(*origin.ref),
            "offset": offset,
            "sender": sender,
            "reason": reason,
        }
        custom = pb.CustomValue(data=json_to_value(data))
        out.append(NewEvent(FORK_EVENT, f"fork_{ctx.txid}", INSERT, event_body(pb.Event(custom=custom))))
        for event, value in _pending_signals(events):
            # The origin's runtime was to act on it, not the fork's: settled, so no lease delivers it.
            value.signal.outcome = OUTCOME_TO_PB[Outcome.IGNORED]
            value.signal.detail = f"copied by the fork of {entity_url(*origin.ref)} at offset {offset}"
            out.append(NewEvent("signal", event.key, UPDATE, event_body(value)))
        out.append(state_event(f"state_{ctx.txid}", State.IDLE, None, "fork"))
        record = EntityRecord(
            type=ref[0],
            id=ref[1],
            state=State.IDLE,
            grace_ms=origin.grace_ms,
            idle_timeout_ms=origin.idle_timeout_ms,
            created_at_ms=ctx.now_ms,
            updated_at_ms=ctx.now_ms,
            head_offset=0,
            closed=False,
            stopping_deadline_ms=None,
            txid=ctx.txid,
            grace_pending=origin.grace_pending,
            idle_timeout_pending=origin.idle_timeout_pending,
        )
        return Mutation(out, message_cursor.forked(record, offset), Forked(offset))

    return decide


@dataclass(frozen=True, slots=True)
class RunFound:
    """A run looked up by its message key: its message and how it ended."""

    key: str
    offset: int
    message: pb.MessageValue
    status: int  # its latest run record's pb.RunStatus; 0: none (it never started)
    # How many steps it has recorded: the steps a retry may replay.
    recorded_steps: int


async def find_run(store: Store, ref: Ref, key: str) -> RunFound:
    """The run of message ``key`` (NOT_FOUND / RUN_NOT_FOUND if the stream has no such message)."""
    record = await store.get_entity(ref)
    if record is None:
        raise not_found(*ref)
    found: StoredEvent | None = None
    status = 0
    steps = -1
    offset = 0
    while offset < record.head_offset:
        page = await store.read_events(ref, offset, _PAGE)
        if not page:
            break
        for event in page:
            if found is None:
                if event.kind == "message" and event.key == key:
                    found = event
            elif event.kind == "run" and event.key == f"run_{key}":
                status = pb.Event.FromString(event.body).run.status
            elif event.kind == STEP_EVENT:
                data = value_to_json(pb.Event.FromString(event.body).custom.data)
                if (
                    isinstance(data, dict)
                    and data.get("run") == key
                    and data.get("outcome") in _FINAL_STEP_OUTCOMES
                ):
                    steps = max(steps, int(data.get("index", -1)))
        offset = page[-1].offset + 1
    if found is None:
        raise ApiError(
            grpc.StatusCode.NOT_FOUND,
            "RUN_NOT_FOUND",
            f"{entity_url(*ref)} has no message {key!r}: name a run by its message key, as `electric events` shows it",
            {"entity": entity_url(*ref), "run": key},
        )
    message = pb.Event.FromString(found.body).message
    # A retry's own records start at its from_step: the steps before it were replayed, not recorded.
    replayed = message.retry.from_step if message.HasField("retry") else 0
    return RunFound(key, found.offset, message, status, max(steps + 1, replayed))


def retry(ref: Ref, run: RunFound, from_step: int, sender: str, reason: str) -> Decide:
    """A message that runs ``run`` again from step ``from_step`` (checked against ``run`` here)."""
    url = entity_url(*ref)
    if run.status not in _RETRYABLE:
        how = _STATUS_TEXT.get(run.status, "queued: its run has not started")
        raise ApiError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "RUN_NOT_RETRYABLE",
            f"run {run.key} of {url} is {how}: only a failed or aborted run can be retried",
            {"entity": url, "run": run.key},
        )
    if not 0 <= from_step <= run.recorded_steps:
        # Past the recorded steps is OUT_OF_RANGE (as an offset past a stream's head), below 0 invalid.
        code = grpc.StatusCode.OUT_OF_RANGE if from_step > 0 else grpc.StatusCode.INVALID_ARGUMENT
        raise ApiError(
            code,
            "INVALID_STEP",
            f"from_step must be 0..{run.recorded_steps} (the steps run {run.key} recorded), got {from_step}",
            {"field": "from_step", "run": run.key},
        )

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        if current is None:
            raise not_found(*ref)
        if not STATE_RULES[current.state].accepts_messages:
            hint = ": fork it instead (electric fork)" if current.state.terminal else ""
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "ENTITY_TERMINAL",
                f"Cannot retry a run of a {current.state.value} entity{hint}",
                {"entity": url, "state": current.state.value},
            )
        value = pb.MessageValue()
        value.CopyFrom(run.message)
        value.retry.CopyFrom(
            pb.RunRetry(
                message_key=run.key,
                message_offset=run.offset,
                from_step=from_step,
                sender=sender,
                reason=reason,
            )
        )
        key = f"msg_{ctx.txid}"
        event = NewEvent("message", key, INSERT, event_body(pb.Event(message=value)))
        return Mutation([event], message_cursor.sent(current), key)

    return decide
