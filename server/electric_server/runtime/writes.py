"""The runtime's writes and the lease bookkeeping, as pure decide functions.

Every runtime write is fenced (ARCHITECTURE §2): it names the lease epoch and
the state it expects to leave, and applies only if the epoch is the entity's
current one and the entity is still in that state. After the end (a terminal
state) only the runtime's closing records apply (``lifecycle.CLOSING_RECORDS``),
until its lease ends with the settle. Refusals raise ``Refused`` with a reason
the worker can act on; nothing is written.

A signal's outcome is an update of the signal's record: its whole value is the
stored insert's (sender, reason, states, payload) with the outcome and its
detail, never what the worker echoes, so a reader that keeps each key's latest
value still knows who sent the signal and why. The runtime service hands each
decide function the inserts of the signals the lease was given (``Inserts``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from electric_sdk import lifecycle
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.enums import PB_TO_STATE
from electric_sdk._wire.events import event_body
from electric_sdk._wire.exec_receipts import receipt_says_running
from electric_sdk._wire.json_values import value_to_json
from electric_sdk.durable_state import STATE_EVENT
from electric_sdk.event_types import custom_type_problem
from electric_sdk.lifecycle import Record, State

from ..core import child_wakes, delegations, message_cursor
from ..core.entity_writes import INSERT, UPDATE, state_event
from ..core.errors import not_found
from ..store.base import Decide, EntityRecord, Mutation, NewEvent, Ref, TypeProfile, WriteContext
from ..store.sessions import holds_lease
from .profiles import resolve

# An exec entity's output chunk: the worker bounds chunks far below this; the server enforces it.
MAX_OUTPUT_CHARS = 64 * 1024
_TERMINAL_RUNS = {
    pb.RUN_STATUS_COMPLETED,
    pb.RUN_STATUS_ABORTED,
    pb.RUN_STATUS_FAILED,
    pb.RUN_STATUS_INPUT_REQUIRED,
}
# Outcomes a runtime may report: not `pending` (what it settles) nor none at all.
_UNREPORTABLE = {pb.SIGNAL_OUTCOME_UNSPECIFIED, pb.SIGNAL_OUTCOME_PENDING}

# Signal key → the value of its stored insert (outcome `pending`).
Inserts = Mapping[str, pb.SignalValue]
# Marks the commits the runtime made itself (``marked``): not echoed back to it.
RUNTIME_WRITE = "runtime-write"


class Refused(Exception):
    """A runtime write that does not apply; ``reason`` goes back to the worker."""

    def __init__(self, reason: str, message: str, entity: EntityRecord | None = None) -> None:
        super().__init__(message)
        self.reason, self.message, self.entity = reason, message, entity


@dataclass(frozen=True, slots=True)
class Granted:
    epoch: int


def grant(
    ref: Ref,
    seen_epoch: int,
    session: str,
    type_default: TypeProfile | None = None,
    seen_bound: str = "",
    busy: tuple[str, str] = ("", ""),
) -> Decide:
    """Take a new lease for worker session ``session``: granted if the epoch is the one seen and
    no live runtime holds the entity (a holder whose session ended loses its lease here first,
    as ``end_lease`` with runtime_lost). The epoch grows, so every older holder is fenced off.
    The first lease fixes the profile values the spawn left to the type (``type_default``).
    ``seen_bound``: the code version the run in flight was bound to when the session was chosen
    for it (binding.py); refused if that changed meanwhile. ``busy``: the session's type's
    double-texting policy and choices, which the entity's messages are judged by from now on."""

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        if current is None or current.closed or current.lease_epoch != seen_epoch:
            raise Refused("LEASE_RACE", "the entity changed while a lease was being granted", current)
        if message_cursor.bound_version(current) != seen_bound:
            raise Refused("LEASE_RACE", "the run in flight changed while a lease was being granted", current)
        if holds_lease(current, ctx):
            raise Refused("LEASE_HELD", "a live runtime holds the entity", current)
        base, events = current, []
        if current.lease_session:
            lost = end_lease(ref, current.lease_epoch, "runtime_lost")(current, ctx)
            assert lost.entity is not None
            base, events = lost.entity, lost.events
            if base.closed:
                raise Refused("ENTITY_CLOSED", "the entity ended: no lease is granted", current)
        if message_cursor.awaiting_record(base):  # an earlier lease ended with no _let_go (a restart)
            base, ended = _unrecorded_abort(base, "its runtime's lease ended")
            events = [*events, *ended]
        epoch = base.lease_epoch + 1
        # No run is in progress under a new lease (one lost with a restart is delivered again).
        record = resolve(base, type_default).replace(
            lease_epoch=epoch,
            reload_pending=False,
            lease_session=session,
            run_key="",
            waiting_since_ms=None,
            on_busy=busy[0],
            on_busy_choices=busy[1],
        )
        return Mutation(events, record, Granted(epoch))

    return decide


def end_lease(
    ref: Ref, epoch: int, cause: str, unsettled: Inserts | None = None, given: Inserts | None = None
) -> Decide:
    """A lease ended (released, lost, expired): fence it off, and mend the state.

    A `running` entity whose runtime was lost goes idle (cause runtime_lost);
    a terminal entity's stream closes now that nobody can append to it. The
    signals its runtime never reported on get the outcome `ignored`, saying
    so: every signal gets one. Those are ``unsettled`` (a runtime that let go
    first), or, once the entity has ended, every pending signal the lease was
    ``given``: no later lease will report on them.
    """

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        if current is None or current.lease_epoch != epoch:
            return Mutation()  # someone else holds it now: nothing of ours to end
        owed = given if current.state.terminal else unsettled
        mutation = _let_go(Mutation([], current), epoch, cause, owed, ctx)
        assert mutation.entity is not None
        new = lifecycle.runtime_target(current.state, cause)  # runtime_lost: running → idle
        if new is not None:
            mutation.events.append(state_event(f"state_{ctx.txid}", new, current.state, cause))
            mutation.entity = mutation.entity.replace(state=new)
        return mutation

    return decide


def settle_ignored(unsettled: Inserts, state: State) -> Decide:
    """Signals a lease's runtime never reported on, found owed only after its lease ended with a
    write (they landed while that write was on its way): ignored, saying so."""

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        if current is None or current.closed:  # closed meanwhile: the close settled what was pending
            return Mutation()
        return Mutation(
            [_ignored(key, insert, _not_handled("released", state)) for key, insert in unsettled.items()],
            current,
        )

    return decide


def close_ended(pending: Inserts, settle_ms: int) -> Decide:
    """An ended entity whose stream is still open though no live runtime may append to it (its
    holder's session ended, e.g. with its replica or a restart), or whose settle is over: it closes,
    its lease ends, and the signals still ``pending`` get `ignored`, saying why."""

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        if current is None or current.closed or not current.state.terminal:
            return Mutation()
        if holds_lease(current, ctx) and ctx.now_ms < current.updated_at_ms + settle_ms:
            return Mutation()  # its runtime may still append its closing records
        if current.children_due and ctx.now_ms < current.updated_at_ms + settle_ms:
            return Mutation()  # the server's `told` record of its cut run's children is coming
        detail = f"not handled: the runtime's lease ended after the entity's end ({current.state.value})"
        mutation = _let_go(
            Mutation([_ignored(key, insert, detail) for key, insert in pending.items()], current),
            current.lease_epoch,
            "settled",
            None,
            ctx,
        )
        assert mutation.entity is not None
        mutation.entity = mutation.entity.replace(closed=True)  # the told record's wait is bounded too
        return mutation

    return decide


def _not_handled(cause: str, state: State) -> str:
    return f"not handled: the runtime's lease ended first ({cause}; the entity was {state.value})"


def _let_go(
    mutation: Mutation, epoch: int, cause: str, unsettled: Inserts | None, ctx: WriteContext
) -> Mutation:
    """``mutation`` plus the end of lease ``epoch``: fenced off, the signals its runtime never
    reported on settled as ignored, and a terminal entity's stream closed (nobody may append)."""
    record = mutation.entity
    assert record is not None
    detail = _not_handled(cause, record.state)
    mutation.events.extend(_ignored(key, insert, detail) for key, insert in (unsettled or {}).items())
    if message_cursor.awaiting_record(record):
        record, ended = _unrecorded_abort(record, f"its lease ended ({cause})")
        mutation.events.extend(ended)
    # An ended entity whose cut run's children are still to be told keeps its stream open for
    # the server's `told` record (core/child_interrupts.py closes it then).
    closed = record.closed or (record.state.terminal and not record.children_due)
    mutation.entity = record.replace(
        run_key="",  # a run in progress is lost with its lease: its message is delivered again
        lease_epoch=epoch + 1,
        closed=closed,
        lease_session="",
        process_running=False,  # nobody is left to say it ended: no expiry waits for it
        # A run bound to its code version now waits for a worker of it: the type's bound on that
        # wait counts from here (binding.py).
        waiting_since_ms=None if closed or not message_cursor.bound_version(record) else ctx.now_ms,
    )
    return mutation


def _awaited(run: pb.RunValue, current: EntityRecord) -> bool:
    """Whether ``run`` is the end of the run a SIGINT aborted, which the server awaits."""
    return (
        bool(run.message_key)
        and run.message_key == current.run_key
        and message_cursor.awaiting_record(current)
    )


def _aborted_after_all(run: pb.RunValue) -> pb.RunValue:
    """A run a SIGINT aborted that its runtime saw end otherwise (its end was on the way when the
    SIGINT committed): the SIGINT came first, so the run ended aborted, and what it wrote is its
    partial output."""
    value = pb.RunValue()
    value.CopyFrom(run)
    how = "completed" if run.status == pb.RUN_STATUS_COMPLETED else f"failed: {run.error}"
    value.status, value.error = pb.RUN_STATUS_ABORTED, f"SIGINT (the run had {how} as it landed)"
    return value


def _unrecorded_abort(record: EntityRecord, why: str) -> tuple[EntityRecord, list[NewEvent]]:
    """The end of the run a SIGINT aborted (``record.run_key``'s) whose runtime never recorded it
    (``why``), and ``record`` after it (a delegating run's children are due their SIGINT)."""
    message_key = record.run_key
    run = pb.RunValue(
        message_key=message_key,
        status=pb.RUN_STATUS_ABORTED,
        error=f"SIGINT (no partial output: {why} before recording it)",
    )
    record, events = delegations.run_ended(record, message_key, True)
    return record, [*events, NewEvent("run", f"run_{message_key}", UPDATE, event_body(pb.Event(run=run)))]


def _ignored(key: str, insert: pb.SignalValue, detail: str) -> NewEvent:
    return _outcome_event(key, insert, pb.SIGNAL_OUTCOME_IGNORED, detail)


def _outcome_event(
    key: str, insert: pb.SignalValue, outcome: pb.SignalOutcome.ValueType, detail: str
) -> NewEvent:
    """A signal record's outcome, as an update of the record's own key: the insert's whole value
    with the outcome and its detail."""
    value = pb.SignalValue()
    value.CopyFrom(insert)
    value.outcome, value.detail = outcome, detail
    return NewEvent("signal", key, UPDATE, event_body(pb.Event(signal=value)))


def _reported(update: rt.SignalOutcomeUpdate, inserts: Inserts, current: EntityRecord) -> NewEvent:
    """A runtime's report on a signal it was given, built from the signal's stored insert."""
    insert = inserts.get(update.signal_key)
    if insert is None:
        raise Refused(
            "UNKNOWN_SIGNAL",
            f"no signal {update.signal_key!r} awaits an outcome from this lease",
            current,
        )
    if update.outcome in _UNREPORTABLE:
        raise Refused(
            "INVALID_OUTCOME", "a reported outcome must be neither pending nor unspecified", current
        )
    return _outcome_event(update.signal_key, insert, update.outcome, update.detail)


def _record(write: rt.RuntimeWrite, current: EntityRecord) -> Record:
    """What kind of record a write appends (what the entity's state may refuse)."""
    op = write.WhichOneof("op")
    if op == "run":
        run = write.run
        if run.status == pb.RUN_STATUS_STARTED:
            return Record.RUN_START
        if run.status not in _TERMINAL_RUNS:
            return Record.RUN_STEP
        # The run in progress is the one at the cursor, once a STARTED record moved it there; or
        # the one a SIGINT aborted, whose end the server awaits.
        in_progress = run.message_offset == current.message_cursor and current.cursor_attempt > 0
        if in_progress or _awaited(run, current):
            return Record.RUN_END
        return Record.RUN_CANCELLED
    if op == "custom" and write.custom.type == STATE_EVENT:
        return Record.STATE_CHANGES
    return _RECORDS[op or ""]


_RECORDS = {
    "transition": Record.TRANSITION,
    "signal_outcome": Record.SIGNAL_OUTCOME,
    "custom": Record.CUSTOM,
    "exec": Record.EXEC_RECEIPT,
    "output": Record.OUTPUT,
}


def _steered(current: EntityRecord, run: pb.RunValue, earlier: Sequence[int]) -> EntityRecord:
    """A steering message taken by the run in progress (``ctx.take_steer``): done, never run on
    its own, as a cancelled one (``earlier``: the messages before it still to run)."""
    offset = run.message_offset
    if not message_cursor.deliverable(current, offset) or offset == current.message_cursor:
        raise Refused("MESSAGE_DONE", f"the message at offset {offset} is done or running", current)
    if (none := message_cursor.beyond(current, offset)) is not None:
        raise Refused("INVALID_MESSAGE_OFFSET", none, current)
    return message_cursor.cancelled(current, message_cursor.Located(run.message_key, offset, tuple(earlier)))


def runtime_write(
    ref: Ref, write: rt.RuntimeWrite, inserts: Inserts, unsettled: Inserts | None = None
) -> Decide:
    """A runtime's fenced write; ``inserts``: the signals whose outcomes it may report. With
    ``write.release``, the lease ends in the same commit (``unsettled``: the signals its runtime
    still owes an outcome, as for a Release)."""

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        mutation = apply(current, ctx)
        if not write.release:
            return mutation
        settled = {u.signal_key for u in write.transition.outcomes}
        if write.HasField("signal_outcome"):
            settled.add(write.signal_outcome.signal_key)
        owed = {key: insert for key, insert in (unsettled or {}).items() if key not in settled}
        return _let_go(mutation, write.epoch, "released", owed, ctx)

    expect = PB_TO_STATE.get(write.expect_state)

    def apply(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        if current is None:
            raise not_found(*ref)
        if write.epoch != current.lease_epoch:
            raise Refused("STALE_EPOCH", f"lease epoch {write.epoch} is not the current one", current)
        if current.closed:
            raise Refused("ENTITY_CLOSED", "the stream is closed", current)
        op = write.WhichOneof("op")
        if op is None:
            raise Refused("EMPTY_WRITE", "the write has no operation", current)
        # Before the state's compare-and-swap: a worker that has not seen the end yet learns of it
        # at once, rather than retrying against the terminal state.
        appended = _record(write, current)
        if not lifecycle.accepts_record(current.state, appended):
            raise Refused(
                "ENTITY_TERMINAL",
                f"the entity is {current.state.value}: a {appended.value} is refused after its end",
                current,
            )
        if expect is not current.state:
            raise Refused("STATE_CHANGED", f"the entity is {current.state.value}, not {expect}", current)
        key = f"rt_{ctx.txid}"
        if op == "transition":
            new = PB_TO_STATE.get(write.transition.to)
            if new is None:
                raise Refused("INVALID_TRANSITION", "no target state", current)
            try:
                lifecycle.check_runtime_transition(current.state, new, write.transition.cause)
            except lifecycle.InvalidTransition as exc:
                raise Refused("INVALID_TRANSITION", str(exc), current) from exc
            event = state_event(f"state_{ctx.txid}", new, current.state, write.transition.cause)
            settled = [_reported(update, inserts, current) for update in write.transition.outcomes]
            return Mutation([event, *settled], current.replace(state=new, stopping_deadline_ms=None))
        if op == "run":
            run = write.run
            record = current
            events: list[NewEvent] = []
            if run.status == pb.RUN_STATUS_STARTED:
                # A message that was cancelled (or is done) never runs, whoever still has it queued.
                if (done := message_cursor.refuses_start(current, run.message_offset)) is not None:
                    raise Refused("MESSAGE_DONE", done, current)
                if (none := message_cursor.beyond(current, run.message_offset)) is not None:
                    raise Refused("INVALID_MESSAGE_OFFSET", none, current)  # a broken worker's
                if (first := message_cursor.behind(current, run.message_offset)) is not None:
                    raise Refused("MESSAGE_BEHIND", first, current)  # its runtime waits for that one
                if message_cursor.awaiting_record(current):
                    record, events = _unrecorded_abort(current, "its runtime started the next run")
                abortable = run.message_key if write.server_may_abort else ""
                record = message_cursor.started(
                    record, run.message_offset, run.attempt, abortable, run.code_version
                )
                record = delegations.started(record, run.message_key)
            elif run.status == pb.RUN_STATUS_STEERED:
                record = _steered(current, run, write.earlier_messages)
            elif run.status in _TERMINAL_RUNS:
                if run.status != pb.RUN_STATUS_ABORTED and _awaited(run, current):
                    run = _aborted_after_all(run)
                record = message_cursor.ended(record, run.message_offset, run.message_key)
                # A delegating run cut short: its children are due their signal (and told so).
                aborted = run.status == pb.RUN_STATUS_ABORTED
                record, events = delegations.run_ended(record, run.message_key, aborted)
                if run.status == pb.RUN_STATUS_INPUT_REQUIRED:  # the next message is its reply
                    if len(run.question) > MAX_OUTPUT_CHARS:
                        raise Refused(
                            "OUTPUT_TOO_LARGE", f"a question holds at most {MAX_OUTPUT_CHARS} characters"
                        )
                    record = record.replace(
                        awaiting_run=run.message_key,
                        awaiting_offset=run.message_offset,
                        awaiting_question=run.question,
                        awaiting_step=run.ask_step,
                    )
            run_key = f"run_{run.message_key}" if run.message_key else key
            operation = INSERT if run.status in (pb.RUN_STATUS_STARTED, pb.RUN_STATUS_STEERED) else UPDATE
            events.append(NewEvent("run", run_key, operation, event_body(pb.Event(run=run))))
            return Mutation(events, record)
        if op == "signal_outcome":
            return Mutation([_reported(write.signal_outcome, inserts, current)], current)
        if op == "custom":
            kind = write.custom.type
            problem = custom_type_problem(kind)
            if problem is not None:
                raise Refused("INVALID_EVENT_TYPE", problem, current)
            custom = pb.CustomValue(data=write.custom.data)
            record = current
            if kind == delegations.CHILD_EVENT:  # entity code's delegation (runtime/children.py)
                data = value_to_json(write.custom.data)
                if isinstance(data, dict) and data.get("phase") in delegations.DELEGATIONS:
                    record = delegations.delegated(current, str(data.get("run", "")))
                    record = child_wakes.awaiting(record, data)
            return Mutation([NewEvent(kind, key, INSERT, event_body(pb.Event(custom=custom)))], record)
        if op == "exec":
            receipt = pb.Event(exec=write.exec)
            running = receipt_says_running(write.exec)
            record = current if running is None else current.replace(process_running=running)
            return Mutation([NewEvent("exec", key, INSERT, event_body(receipt))], record)
        if len(write.output.text) > MAX_OUTPUT_CHARS:  # the one op left: output (see _RECORDS)
            raise Refused(
                "OUTPUT_TOO_LARGE", f"an output chunk holds at most {MAX_OUTPUT_CHARS} characters", current
            )
        chunk = pb.Event(output=write.output)
        return Mutation([NewEvent("output", key, INSERT, event_body(chunk))], current)

    return decide


def marked(decide: Decide) -> Decide:
    """``decide``, its commit marked as the runtime's own (``RUNTIME_WRITE``)."""

    def marked_decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        mutation = decide(current, ctx)
        mutation.result = RUNTIME_WRITE
        return mutation

    return marked_decide
