"""`electric verify`: replay every stream and compare with the stored state.

The replay rebuilds each entity from its events alone, checking on the way
that offsets are gap-free, that every state change is one the lifecycle
allows (a signal's cell in the RFC table, or a runtime transition), and that
every signal record agrees with the state it was judged against. The result
must equal the materialized record: state, head offset, closed, deadline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from electric_sdk import lifecycle
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.enums import PB_TO_SIGNAL, PB_TO_STATE
from electric_sdk._wire.times import timestamp_to_ms
from electric_sdk.lifecycle import INITIAL_STATE, STATE_RULES, State

from .store.base import EntityRecord, Ref, Store

PAGE = 1000


@dataclass
class Replayed:
    state: State | None = None
    head_offset: int = 0
    deadline_ms: int | None = None
    problems: list[str] = field(default_factory=list)


@dataclass
class Report:
    entities: int = 0
    events: int = 0
    mismatches: dict[Ref, list[str]] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not self.mismatches


async def replay(store: Store, ref: Ref) -> Replayed:
    r = Replayed()
    offset = 0
    while True:
        page = await store.read_events(ref, offset, PAGE)
        for stored in page:
            if stored.offset != r.head_offset:
                r.problems.append(f"offset gap: expected {r.head_offset}, found {stored.offset}")
            r.head_offset = stored.offset + 1
            event = pb.Event.FromString(stored.body)
            kind = event.WhichOneof("value")
            if kind == "state":
                _apply_state(r, event.state, stored.offset)
            elif kind == "signal" and stored.operation == pb.OPERATION_INSERT:
                _check_signal(r, event.signal, stored.offset)
        if len(page) < PAGE:
            return r
        offset = page[-1].offset + 1


def _apply_state(r: Replayed, value: pb.StateValue, offset: int) -> None:
    new = PB_TO_STATE.get(value.state)
    previous = PB_TO_STATE.get(value.previous_state)
    if new is None:
        r.problems.append(f"@{offset}: state event without a state")
        return
    if r.state is None:
        if value.cause != "spawn" or new is not INITIAL_STATE:
            r.problems.append(f"@{offset}: stream does not start with spawn")
    elif previous is not r.state:
        r.problems.append(f"@{offset}: state event leaves {previous} but replay is in {r.state.value}")
    elif value.cause != "signal":
        try:
            lifecycle.check_runtime_transition(r.state, new, value.cause)
        except lifecycle.InvalidTransition as exc:
            r.problems.append(f"@{offset}: {exc}")
    r.state = new
    r.deadline_ms = timestamp_to_ms(value.deadline) if value.HasField("deadline") else None


def _check_signal(r: Replayed, value: pb.SignalValue, offset: int) -> None:
    if r.state is None:
        r.problems.append(f"@{offset}: signal before spawn")
        return
    signal = PB_TO_SIGNAL[value.signal]
    try:
        decision = lifecycle.decide(r.state, signal)
    except lifecycle.LifecycleError as exc:
        r.problems.append(f"@{offset}: recorded signal the table rejects: {exc}")
        return
    recorded = PB_TO_STATE.get(value.new_state)
    if recorded is not decision.new_state:
        r.problems.append(
            f"@{offset}: {signal.value} in {r.state.value} recorded → {recorded}, table says → "
            f"{decision.new_state.value}"
        )


def compare(record: EntityRecord, r: Replayed) -> list[str]:
    problems = list(r.problems)
    if r.state is not record.state:
        problems.append(f"state: stored {record.state.value}, replayed {r.state.value if r.state else None}")
    if r.head_offset != record.head_offset:
        problems.append(f"head offset: stored {record.head_offset}, replayed {r.head_offset}")
    if record.closed and r.state is not None and not r.state.terminal:
        problems.append(f"closed, but replayed state {r.state.value} is not terminal")
    if r.state is not None and STATE_RULES[r.state].cleanup and r.deadline_ms != record.stopping_deadline_ms:
        problems.append(f"deadline: stored {record.stopping_deadline_ms}, replayed {r.deadline_ms}")
    return problems


async def entities(store: Store) -> AsyncIterator[EntityRecord]:
    after: Ref | None = None
    while True:
        page = await store.list_entities(None, (), after, PAGE)
        for record in page:
            yield record
        if len(page) < PAGE:
            return
        after = page[-1].ref


async def verify(store: Store) -> Report:
    report = Report()
    async for record in entities(store):
        replayed = await replay(store, record.ref)
        report.entities += 1
        report.events += replayed.head_offset
        problems = compare(record, replayed)
        if problems:
            report.mismatches[record.ref] = problems
    return report
