"""The server's writes, as pure decide functions over an entity's record.

Each function returns a ``Decide`` for the store: it sees the current record
inside the entity's serialized write and returns the events and new record,
or raises to refuse (nothing is written). Lifecycle rules come from
``electric_sdk.lifecycle`` only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import grpc
from google.protobuf import struct_pb2

from electric_sdk import busy, lifecycle
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.entities import entity_url
from electric_sdk._wire.enums import OUTCOME_TO_PB, SIGNAL_TO_PB, STATE_TO_PB
from electric_sdk._wire.events import event_body
from electric_sdk._wire.times import timestamp_from_ms
from electric_sdk.busy import BusyPolicy
from electric_sdk.lifecycle import (
    DEFAULT_GRACE_MS,
    DEFAULT_IDLE_TIMEOUT_MS,
    INITIAL_STATE,
    RELOAD_SIGNALS,
    SERVER_ABORTED_SIGNALS,
    STATE_RULES,
    MessageProgress,
    Outcome,
    Signal,
    State,
)

from ..store.base import Decide, EntityRecord, Mutation, NewEvent, Ref, Store, WriteContext
from ..store.sessions import holds_lease
from . import delegations, message_cursor
from .errors import ApiError, busy_policy_not_allowed, entity_busy, not_found

INSERT = pb.OPERATION_INSERT
UPDATE = pb.OPERATION_UPDATE
# The policies a send compares with, bound once: an enum member's lookup costs a send 0.3 us.
_ENQUEUE, _REJECT, _STEER = BusyPolicy.ENQUEUE, BusyPolicy.REJECT, BusyPolicy.STEER


# The error of a cancelled message's run record, by how far the message had got.
_CANCELLED_RUN = {
    MessageProgress.QUEUED: "cancelled before it started",
    MessageProgress.STARTED: "cancelled before it started again (its run was lost with its runtime)",
}


def _scoped_detail(decision: lifecycle.Decision, progress: MessageProgress | None) -> str:
    """What a scoped signal's record says when the server settles it."""
    if decision.cancels_message:
        assert progress is not None
        return f"its message was {_CANCELLED_RUN[progress]}"
    if progress is MessageProgress.ENDED:
        return "its message is done: its run ended, or it was cancelled"
    return ""


@dataclass(frozen=True, slots=True)
class SignalSpec:
    signal: Signal
    reason: str = ""
    payload: struct_pb2.Value | None = None
    sender: str = "anonymous"
    message_key: str = ""
    # SIGTERM only: the step in progress is interrupted at once (lifecycle.OPT_IN_TIMING).
    interrupt: bool = False
    # SIGTERM only: the grace ends by then at the latest (a cascade from a parent: its own
    # deadline, so a tree stops within its root's grace; core/cascade.py). None: the entity's grace.
    latest_deadline_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Signalled:
    """The result of a signal write, for the response."""

    key: str
    decision: lifecycle.Decision


def state_event(
    key: str,
    new: State,
    previous: State | None,
    cause: str,
    signal_key: str = "",
    deadline_ms: int | None = None,
) -> NewEvent:
    value = pb.StateValue(
        state=STATE_TO_PB[new],
        previous_state=STATE_TO_PB[previous] if previous else pb.STATE_UNSPECIFIED,
        cause=cause,
        signal_key=signal_key,
    )
    if deadline_ms is not None:
        value.deadline.CopyFrom(timestamp_from_ms(deadline_ms))
    return NewEvent("state", key, INSERT, event_body(pb.Event(state=value)))


def spawn(ref: Ref, grace_ms: int | None, idle_timeout_ms: int | None, parent: str = "") -> Decide:
    """A new entity in `spawning`; a profile value the request left unset (None) is its type's
    default, fixed at its first lease (runtime/profiles.py): the server's default holds its place."""

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        if current is not None:
            raise ApiError(
                grpc.StatusCode.ALREADY_EXISTS,
                "ENTITY_EXISTS",
                f"Entity {entity_url(*ref)} already exists ({current.state.value})",
                {"entity": entity_url(*ref), "state": current.state.value},
            )
        record = EntityRecord(
            type=ref[0],
            id=ref[1],
            state=INITIAL_STATE,
            grace_ms=DEFAULT_GRACE_MS if grace_ms is None else grace_ms,
            idle_timeout_ms=DEFAULT_IDLE_TIMEOUT_MS if idle_timeout_ms is None else idle_timeout_ms,
            created_at_ms=ctx.now_ms,
            updated_at_ms=ctx.now_ms,
            head_offset=0,
            closed=False,
            stopping_deadline_ms=None,
            txid=ctx.txid,
            grace_pending=grace_ms is None,
            idle_timeout_pending=idle_timeout_ms is None,
            parent=parent,
        )
        return Mutation([state_event(f"state_{ctx.txid}", INITIAL_STATE, None, "spawn")], record)

    return decide


def _transition(
    current: EntityRecord,
    new: State,
    ctx: WriteContext,
    cause: str,
    signal_key: str = "",
    leased: bool = False,
    latest_deadline_ms: int | None = None,
) -> tuple[NewEvent, EntityRecord]:
    deadline = ctx.now_ms + current.grace_ms if STATE_RULES[new].cleanup else None
    if deadline is not None and latest_deadline_ms is not None:
        deadline = max(ctx.now_ms, min(deadline, latest_deadline_ms))
    event = state_event(f"state_{ctx.txid}", new, current.state, cause, signal_key, deadline)
    # A terminal entity's stream closes (EOF) once nobody is left to write its
    # last records: at once without a lease, else when the lease ends (or, if later, once
    # the server has told its cut run's children: core/child_interrupts.py).
    closed = new.terminal and not leased and not current.children_due
    record = current.replace(state=new, stopping_deadline_ms=deadline, closed=closed)
    return event, record


class NeedsInFlight(Exception):
    """An unscoped SIGINT found the entity's run waiting for a worker of its code version, and the
    write was not given that run's message (read it, ``message_cursor.at_cursor``, then write
    again with it). Read only then: a runtime that holds the run records its end itself, so the
    common SIGINT costs no read before its write."""


def signal(
    ref: Ref,
    spec: SignalSpec,
    located: message_cursor.Located | None = None,
    in_flight: message_cursor.Located | None = None,
    *,
    in_flight_read: bool = True,
) -> Decide:
    """``located``: the message a scoped signal names (``message_cursor.locate``), required then;
    ``in_flight``: an unscoped SIGINT's, the message whose run was in flight (``at_cursor``), if
    ``in_flight_read``; else the write raises ``NeedsInFlight`` where it needs it."""

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        if current is None:
            raise not_found(*ref)
        progress = None
        if spec.message_key:
            assert located is not None
            assert located.key == spec.message_key
            progress = message_cursor.progress(current, located)
        waiting = message_cursor.waiting_for(current, holds_lease(current, ctx))
        if waiting and progress in (None, MessageProgress.STARTED):
            # No runtime holds the run: the server decides alone (lifecycle.decide_waiting).
            needs_read = spec.signal in SERVER_ABORTED_SIGNALS and not spec.message_key
            if needs_read and not in_flight_read and current.cursor_attempt > 0:
                raise NeedsInFlight(f"the message in flight on {ref[0]}/{ref[1]} is needed")
            return _signal_waiting(current, ctx, spec, waiting, located or in_flight)
        aborts = _aborts_run(current, ctx, spec.signal, located, progress)
        decision = lifecycle.decide(current.state, spec.signal, True if aborts else None, message=progress)
        key = f"sig_{ctx.txid}"
        # Filled in place: pb.Event(signal=value) would copy the value (a signal's hot path).
        signal_event = pb.Event()
        value = signal_event.signal
        value.signal = SIGNAL_TO_PB[spec.signal]
        value.sender = spec.sender
        value.reason = spec.reason
        # A SIGINT that aborts the run here is still inserted `pending` and updated with its outcome
        # (below), the shape of every signal a runtime settles (ARCHITECTURE §1), in one commit.
        value.outcome = OUTCOME_TO_PB[Outcome.PENDING if aborts else decision.outcome]
        value.previous_state = STATE_TO_PB[decision.previous_state]
        value.new_state = STATE_TO_PB[decision.new_state]
        value.message_key = spec.message_key
        value.interrupt = spec.interrupt
        value.detail = _scoped_detail(decision, progress)
        if spec.payload is not None:
            value.payload.CopyFrom(spec.payload)
        events = [NewEvent("signal", key, INSERT, event_body(signal_event))]
        if aborts:
            value.outcome = OUTCOME_TO_PB[decision.outcome]
            value.detail = f"aborted the run of {current.run_key}"
            events.append(NewEvent("signal", key, UPDATE, event_body(signal_event)))
        record = current
        if decision.cancels_message:
            assert located is not None
            assert located.offset is not None
            assert progress is not None
            # The message's run record says so in the signal's own transaction, as a runtime
            # would have written it: a reader of the stream sees the message done at once.
            run = pb.RunValue(
                message_key=located.key,
                message_offset=located.offset,
                status=pb.RUN_STATUS_ABORTED,
                attempt=current.cursor_attempt if progress is MessageProgress.STARTED else 0,
                error=_CANCELLED_RUN[progress],
            )
            events.append(NewEvent("run", f"run_{located.key}", UPDATE, event_body(pb.Event(run=run))))
            record = message_cursor.cancelled(record, located)
        elif aborts:
            # The run ends here; its runtime cancels it and records its partial output next.
            record = message_cursor.aborted(record)
        if spec.signal in RELOAD_SIGNALS and not current.reload_pending:
            record = record.replace(reload_pending=True)  # the next wake runs the newest code
        if decision.transitions:
            leased = holds_lease(current, ctx)
            event, record = _transition(
                record, decision.new_state, ctx, "signal", key, leased, spec.latest_deadline_ms
            )
            events.append(event)
        return Mutation(events, record, Signalled(key, decision))

    return decide


def _signal_waiting(
    current: EntityRecord,
    ctx: WriteContext,
    spec: SignalSpec,
    version: str,
    target: message_cursor.Located | None,
) -> Mutation:
    """A signal to an entity whose run waits for a worker of code ``version``: SIGINT aborts that
    run (``target``: its message, if it is the one in flight) and records its end, the rest as
    ``lifecycle.decide_waiting`` says; one that acts on a runtime stays `pending` for the next."""
    key = f"sig_{ctx.txid}"
    run_offset = target.offset if target is not None else None
    aborts = spec.signal in SERVER_ABORTED_SIGNALS and run_offset == current.message_cursor
    if spec.signal in SERVER_ABORTED_SIGNALS and not aborts:
        decision = lifecycle.decide(current.state, spec.signal)  # not its run: as with no runtime
    else:
        decision = lifecycle.decide_waiting(current.state, spec.signal)
    value = pb.SignalValue(
        signal=SIGNAL_TO_PB[spec.signal],
        sender=spec.sender,
        reason=spec.reason,
        outcome=OUTCOME_TO_PB[Outcome.PENDING if aborts else decision.outcome],
        previous_state=STATE_TO_PB[decision.previous_state],
        new_state=STATE_TO_PB[decision.new_state],
        message_key=spec.message_key,
        interrupt=spec.interrupt,
    )
    if spec.payload is not None:
        value.payload.CopyFrom(spec.payload)
    if decision.outcome is Outcome.IGNORED and spec.signal in RELOAD_SIGNALS:
        value.detail = f"no runtime to shut down: the run waiting for code {version} finishes on it"
    events = [NewEvent("signal", key, INSERT, event_body(pb.Event(signal=value)))]
    record = current
    if aborts:
        assert target is not None
        value.outcome, value.detail = OUTCOME_TO_PB[decision.outcome], f"aborted the run of {target.key}"
        events.append(NewEvent("signal", key, UPDATE, event_body(pb.Event(signal=value))))
        run = pb.RunValue(
            message_key=target.key,
            message_offset=current.message_cursor,
            status=pb.RUN_STATUS_ABORTED,
            attempt=current.cursor_attempt,
            error=f"SIGINT while it waited for a worker of code version {version}",
            code_version=version,
        )
        events.append(NewEvent("run", f"run_{target.key}", UPDATE, event_body(pb.Event(run=run))))
        record = message_cursor.aborted(record).replace(run_key="")  # its end is recorded here
        # A delegating run's children are due their SIGINT (core/child_interrupts.py).
        record, interrupting = delegations.run_ended(record, target.key, True)
        events[-1:-1] = interrupting  # just before the run's end
    if spec.signal in RELOAD_SIGNALS and not current.reload_pending:
        record = record.replace(reload_pending=True)
    if decision.transitions:
        event, record = _transition(
            record, decision.new_state, ctx, "signal", key, latest_deadline_ms=spec.latest_deadline_ms
        )
        events.append(event)
    return Mutation(events, record, Signalled(key, decision))


def _aborts_run(
    current: EntityRecord,
    ctx: WriteContext,
    signal: Signal,
    located: message_cursor.Located | None,
    progress: MessageProgress | None,
) -> bool:
    """Whether ``signal`` aborts the run in progress in its own commit (SERVER_ABORTED_SIGNALS):
    the server knows of the run (message_cursor.run_in_progress) and, for a scoped signal, it is
    the named message's."""
    if signal not in SERVER_ABORTED_SIGNALS or not STATE_RULES[current.state].runs_possible:
        return False
    if progress is not None and (progress is not MessageProgress.STARTED or located is None):
        return False
    if located is not None and located.key != current.run_key:
        return False
    return message_cursor.run_in_progress(current, holds_lease(current, ctx))


class Sent(NamedTuple):
    """The result of a message write, for the response (a NamedTuple: built on every send, and
    several times faster than a frozen dataclass)."""

    key: str
    # The policy applied (electric_sdk/busy.py): enqueue when no run was in progress.
    policy: BusyPolicy
    # The SIGINT an aborting policy appended ("" none).
    signal_key: str = ""


class NeedsAsk(Exception):
    """The entity awaits input and the write was not given the asking run's message (read it,
    then write again: ``send_message``'s ``asked``); ``offset`` is where it is."""

    def __init__(self, offset: int) -> None:
        super().__init__(f"the asking message at offset {offset} is needed")
        self.offset = offset


async def asking_message(store: Store, ref: Ref, offset: int) -> tuple[str, pb.MessageValue]:
    """What ``NeedsAsk`` asks for: the asking run's message at ``offset`` (its key "" if there is
    none there), for ``send_message``'s ``asked``."""
    found = await store.read_events(ref, offset, 1)
    if not found or found[0].kind != "message":
        return "", pb.MessageValue()
    return found[0].key, pb.Event.FromString(found[0].body).message


def send_message(
    ref: Ref,
    text: str,
    data: struct_pb2.Value | None,
    sender: str,
    policy: BusyPolicy | None = None,
    asked: tuple[str, pb.MessageValue] | None = None,
) -> Decide:
    """A message appended, judged in its own write by the double-texting policy (``policy``: the
    message's own, None its type's; electric_sdk/busy.py) against the run in progress then. To an
    entity awaiting input it is the reply (``_reply``): ``asked`` is the asking run's message
    (key, value), read before the write (``NeedsAsk`` without it)."""

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        if current is None:
            raise not_found(*ref)
        if not STATE_RULES[current.state].accepts_messages:
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "ENTITY_TERMINAL",
                f"Cannot send a message to a {current.state.value} entity",
                {"entity": entity_url(*ref), "state": current.state.value},
            )
        live = holds_lease(current, ctx)
        try:
            applied = busy.applied(current.on_busy, current.on_busy_choices, policy, _busy(current, live))
        except busy.PolicyNotAllowed as exc:
            raise busy_policy_not_allowed(
                entity_url(*ref), policy.value if policy else "", str(exc)
            ) from None
        key = f"msg_{ctx.txid}"
        events: list[NewEvent] = []
        record = current
        signal_key = ""
        # An aborting policy's message, and a reply, run next: ahead of any queued (message_cursor).
        ahead = False
        if applied is _ENQUEUE:
            pass  # the hot path: no run in progress, or the RFC's rule
        elif applied is _REJECT:
            raise entity_busy(entity_url(*ref), current.run_key, applied.value)
        elif applied in busy.ABORTS_RUN and _aborts_run(current, ctx, Signal.SIGINT, None, None):
            # The run in progress is aborted in this very write, by a SIGINT in the sender's name.
            payload = struct_pb2.Value()
            payload.struct_value.update({busy.SIGINT_PAYLOAD_KEY: applied.value, "message": key})
            spec = SignalSpec(Signal.SIGINT, busy.signal_reason(applied, key), payload, sender)
            aborted = signal(ref, spec)(current, ctx)
            assert aborted.entity is not None
            assert isinstance(aborted.result, Signalled)
            events, record, signal_key = list(aborted.events), aborted.entity, aborted.result.key
            ahead = True
        elif applied in busy.ABORTS_RUN or (
            applied is _STEER and not message_cursor.run_in_progress(current, live)
        ):
            # A run the server may not abort nor steer (an exec host's): the message queues.
            applied = BusyPolicy.ENQUEUE
        if current.awaiting_run and asked is None:
            raise NeedsAsk(current.awaiting_offset)
        if current.awaiting_run and asked is not None and asked[0] == current.awaiting_run:
            value, record = _reply(current, asked[1], text, data, sender), record.replace(awaiting_run="")
            ahead = True
        else:
            if current.awaiting_run:
                # What was read is not the asking message (a question asked since the read; a
                # record that names none): a plain message, and nothing is awaited any more.
                record = record.replace(awaiting_run="")
            value = pb.MessageValue(text=text, sender=sender)
            if applied is _STEER:
                value.steer = True
            if data is not None:
                value.data.CopyFrom(data)
        record = message_cursor.sent(record, len(events), ahead)
        if ahead and message_cursor.sent_ahead(record):
            value.ahead = True
        events.append(NewEvent("message", key, INSERT, event_body(pb.Event(message=value))))
        return Mutation(events, record, Sent(key, applied, signal_key))

    return decide


def _reply(
    current: EntityRecord, asking: pb.MessageValue, text: str, data: struct_pb2.Value | None, sender: str
) -> pb.MessageValue:
    """The reply to the run awaiting input: the asking message's text and data again (the same code
    runs), resuming its steps at the ask (a retry from the ask's step), with what was sent."""
    value = pb.MessageValue(text=asking.text, sender=sender)
    if asking.HasField("data"):
        value.data.CopyFrom(asking.data)
    value.retry.CopyFrom(
        pb.RunRetry(
            message_key=current.awaiting_run,
            message_offset=current.awaiting_offset,
            from_step=current.awaiting_step,
            sender=sender,
            reason="reply to its question",
        )
    )
    value.reply.CopyFrom(pb.InputReply(ask_key=current.awaiting_run, text=text))
    if data is not None:
        value.reply.data.CopyFrom(data)
    return value


def _busy(current: EntityRecord, live: bool) -> bool:
    """Whether a run of the entity is in progress for a message's policy: started under a live
    lease and not ended (a SIGINT that aborted it ended it)."""
    return live and current.cursor_attempt > 0


def expire_grace(ref: Ref, deadline_ms: int, settle_ms: int) -> Decide:
    """The reaper's write: stopping → stopped once the stored deadline passed.

    An exec entity whose live runtime still runs its process waits for the process's exit
    receipt, ``settle_ms`` past the deadline at most, so no watcher sees `stopped` while the
    process lives (whichever replica's reaper writes it). A leased entity's stream stays open
    until the lease ends, so its runtime can still append what the cleanup's end produced (an
    exec entity's force receipt)."""

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        if current is None or current.stopping_deadline_ms != deadline_ms or ctx.now_ms < deadline_ms:
            return Mutation()  # moved on (killed, cleaned up early) or not due: nothing to do
        if current.process_running and holds_lease(current, ctx) and ctx.now_ms < deadline_ms + settle_ms:
            return Mutation()  # its process is being forced now: `stopped` waits for its exit
        new = lifecycle.runtime_target(current.state, "grace_expired")
        if new is None:
            return Mutation()  # no longer stopping
        event, record = _transition(current, new, ctx, "grace_expired", leased=holds_lease(current, ctx))
        return Mutation([event], record)

    return decide
