"""`electric verify`: check the store's storage, then replay every stream and compare with the stored state.

First the storage (``Store.damage``: for SQLite, its files as the server
checks them before opening them, and SQLite's integrity check). Then the
replay rebuilds each entity from its events alone, checking on the way
that offsets are gap-free, that every state change is one the lifecycle
allows (a signal's cell in the RFC table, or a runtime transition), and that
every signal record agrees with the state it was judged against. The result
must equal the materialized record: state, head offset, closed, deadline.

A damaged store is reported, never a traceback: what could not be read is
one more line of damage, and the report counts what could.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from electric_sdk import lifecycle
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.enums import PB_TO_SIGNAL, PB_TO_STATE
from electric_sdk._wire.times import timestamp_to_ms
from electric_sdk.lifecycle import INITIAL_STATE, STATE_RULES, State

from ..store.base import DamagedStore, EntityRecord, Ref, StorageFault, Store, StoreBusy

PAGE = 1000
UNREADABLE_LISTED = 10  # streams listed by name when they cannot be read; the rest are counted


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
    # The storage's damage, and what could not be read because of it.
    damage: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.mismatches and not self.damage


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
    """Raises StoreBusy where another process holds the store locked (not damage), and
    what a read raised where the storage is not known to be damaged."""
    report = Report(damage=await store.damage())
    unreadable = 0

    def lost(exc: Exception) -> bool:  # a read failed because of damage: one more line of it
        return not isinstance(exc, StoreBusy) and (isinstance(exc, StorageFault) or bool(report.damage))

    try:
        async for record in entities(store):
            try:
                replayed = await replay(store, record.ref)
            except Exception as exc:
                if not lost(exc):
                    raise
                unreadable += 1
                if unreadable <= UNREADABLE_LISTED:
                    report.damage.extend(_unreadable(exc, f"the stream of {record.type}/{record.id}"))
                continue
            report.entities += 1
            report.events += replayed.head_offset
            problems = compare(record, replayed)
            if problems:
                report.mismatches[record.ref] = problems
    except Exception as exc:
        if not lost(exc):
            raise
        report.damage.extend(_unreadable(exc, f"the entities after the first {report.entities + unreadable}"))
    if unreadable > UNREADABLE_LISTED:
        report.damage.append(f"... {unreadable} streams in all cannot be read")
    return report


def _unreadable(exc: Exception, what: str) -> list[str]:
    reasons = exc.problems if isinstance(exc, DamagedStore) else [f"{type(exc).__name__}: {exc}"]
    return [f"{what} cannot be read: {reason}" for reason in reasons]
