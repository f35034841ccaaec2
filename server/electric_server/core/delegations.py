"""Which of an entity's runs delegated to other entities, and which of those are due their
signal: the entity record's side of core/child_interrupts.py, as pure functions every write that
ends a run calls (runtime/writes.py, entity_writes.py).

``EntityRecord.interrupted_runs`` holds "~key@offset" for a run of message ``key`` (at
``offset``) that wrote an ``electric.child`` delegation record, and "key@offset" once such a run
was cut short (aborted, or it ended while the entity is shutting down or ended): its children are
then due their signal, and the commit that ended the run appends an ``interrupting`` record of it
just before the run's end, so a reader of the stream knows a ``told`` record is to come. Due
entries lead the column, so "has a due run" is "not empty and not starting with ~".
"""

from __future__ import annotations

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.events import event_body
from electric_sdk._wire.json_values import json_to_value
from electric_sdk.lifecycle import STATE_RULES

from ..store.base import EntityRecord, NewEvent

__all__ = ["CHILD_EVENT", "DELEGATIONS", "delegated", "entries_of", "run_ended", "started", "with_entries"]

CHILD_EVENT = "electric.child"
DELEGATIONS = ("spawned", "sent")  # the phases entity code's steps write
_PENDING = "~"  # a delegating run's entry, not due (yet)


def entries_of(record: EntityRecord) -> list[str]:
    return record.interrupted_runs.split()


def with_entries(record: EntityRecord, entries: list[str]) -> EntityRecord:
    # Due entries first: "has a due run" is then "not empty and not starting with ~" (the sweep's
    # index says it with these words).
    ordered = [e for e in entries if not e.startswith(_PENDING)] + [
        e for e in entries if e.startswith(_PENDING)
    ]
    return record.replace(interrupted_runs=" ".join(ordered))


def delegated(record: EntityRecord, run: str) -> EntityRecord:
    """``record`` after a delegation record of its run of message ``run``: the run is delegating
    (from its message's offset, the cursor while it runs)."""
    entries = entries_of(record)
    if not run or any(e.rpartition("@")[0].lstrip(_PENDING) == run for e in entries):
        return record
    return with_entries(record, [*entries, f"{_PENDING}{run}@{record.message_cursor}"])


def started(record: EntityRecord, run: str) -> EntityRecord:
    """A run of message ``run`` started: a delegating run whose end was never recorded (its lease
    was lost) and is not this one is forgotten."""
    entries = entries_of(record)
    kept = [e for e in entries if not e.startswith(_PENDING) or e[1:].rpartition("@")[0] == run]
    return record if kept == entries else with_entries(record, kept)


def run_ended(record: EntityRecord, run: str, aborted: bool) -> tuple[EntityRecord, list[NewEvent]]:
    """``record`` after its run of message ``run`` ended, and the events to append before the
    run's end: a delegating run cut short (aborted, or the entity is shutting down or ended) is
    due, with its ``interrupting`` record; any other end forgets it."""
    entries = entries_of(record)
    mine = [e for e in entries if e.startswith(_PENDING) and e[1:].rpartition("@")[0] == run]
    if not mine:
        return record, []
    rest = [e for e in entries if e not in mine]
    rules = STATE_RULES[record.state]
    if not (aborted or rules.shutting_down or record.state.terminal):
        return with_entries(record, rest), []
    data = {"phase": "interrupting", "run": run}
    custom = pb.CustomValue(data=json_to_value(data))
    event = NewEvent(
        CHILD_EVENT, f"interrupting_{run}", pb.OPERATION_INSERT, event_body(pb.Event(custom=custom))
    )
    return with_entries(record, [*rest, mine[0][1:]]), [event]
