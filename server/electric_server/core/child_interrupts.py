"""The children working for a run, reached when it ends cut short (issue 48, item 3).

Which children worked for a run is in the parent's own stream: entity code's
``ctx.spawn`` and ``ctx.send`` write an ``electric.child`` record of that run
(``{"phase": "spawned" | "sent", "run", "child", "message"}``; runtime/children.py)
as the server answers them, before the run's end. The first one marks the run
as delegating (a ``~key@offset`` entry in ``EntityRecord.interrupted_runs``).
The commit of the run's end then decides (``run_ended``): a run that ended
`aborted`, or any run that ended while the entity is shutting down or has
ended, becomes due (``key@offset``), and the same commit appends an
``interrupting`` record of the run just before the run's end, so a reader of
the stream knows a ``told`` record of it is to come. Any other end forgets it.

The sweep here finds the due runs in the store (core/cascade.py calls it), so
it survives a restart and any replica's death. It reads the run's records from
its message's offset to its end and tells each child of the parent named there:

- the parent is not shutting down (a SIGINT aborted the run): a SIGINT scoped
  to each message the run sent it, or unscoped if none is known (a child only
  spawned, or a send cut before its answer), idempotency key named for the
  parent, the run and the message in the child's scope;
- it is shutting down or ended: the parent's own cascade signal (SIGTERM, or
  SIGKILL once killed), under the cascade's own key (``cascade_key``), so it is
  the one core/cascade.py gives every child and a child gets it once.

A delegated entity that is not the parent's child is someone else's, and is
left alone; a type with ``children="detach"`` leaves its children as they are.
Last, one ``told`` record of the run, naming each child and what its signal
came to (outcome, detail, its state and bound after it), is appended to the
parent's stream (while it is open) in the commit that clears the run: once.
The stop fold reads the ``interrupting`` and ``told`` records for the
``downstream`` stage, and the ``ended`` record of each child's end
(core/cascade.py) for a SIGTERM's children (_wire/stop_stages.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from electric_sdk import lifecycle
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.entities import entity_url, parent_key
from electric_sdk._wire.events import event_body
from electric_sdk._wire.json_values import json_to_value, value_to_json
from electric_sdk._wire.times import epoch_to_iso
from electric_sdk.lifecycle import STATE_RULES, Signal, SignalRejected, State

from ..store.base import (
    Commit,
    Decide,
    EntityRecord,
    Idempotency,
    Mutation,
    NewEvent,
    Ref,
    Store,
    Write,
    WriteContext,
)
from . import entity_writes, message_cursor
from .delegations import CHILD_EVENT, DELEGATIONS, entries_of, with_entries

log = logging.getLogger(__name__)

__all__ = ["CHILD_EVENT", "DELEGATIONS", "SENDER", "cascade_key", "stop_write", "tell_children"]

SENDER = "electric:cascade"
_PAGE = 256


def _unmark(entry: str, told: dict[str, Any]) -> Decide:
    """Clear ``entry`` and append the run's ``told`` record (while the stream is open), once."""

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        if current is None or entry not in entries_of(current):
            return Mutation()
        record = with_entries(current, [e for e in entries_of(current) if e != entry])
        if current.closed:
            return Mutation([], record)
        if record.state.terminal and not record.lease_session and not record.children_due:
            record = record.replace(closed=True)  # kept open for this record alone
        custom = pb.CustomValue(data=json_to_value(told))
        body = event_body(pb.Event(custom=custom))
        return Mutation([NewEvent(CHILD_EVENT, f"told_{told['run']}", entity_writes.INSERT, body)], record)

    return decide


def _digest(kind: str, key: str) -> bytes:
    return hashlib.sha256(f"{kind}\0{key}".encode()).digest()


def cascade_key(signal: Signal, parent: Ref) -> str:
    """The idempotency key of ``signal`` cascaded from ``parent`` (in the child's scope)."""
    return f"cascade-{signal.name.lower()}-{parent[0]}.{parent[1]}"


def stop_signal(parent_state: State) -> Signal:
    """The signal a parent's end gives its children."""
    return Signal.SIGKILL if parent_state is State.KILLED else Signal.SIGTERM


def stop_write(
    child: Ref, parent: Ref, parent_state: State, parent_deadline_ms: int | None, encode: Any = None
) -> Write:
    """The cascade's signal to ``child`` of a parent shutting down or ended: SIGTERM whose grace
    ends by the parent's deadline at the latest, or SIGKILL once it was killed."""
    signal = stop_signal(parent_state)
    key = cascade_key(signal, parent)
    spec = entity_writes.SignalSpec(
        signal,
        reason=f"its parent {entity_url(*parent)} is {parent_state.value}",
        sender=SENDER,
        # A parent that has stopped already has no grace left to give.
        latest_deadline_ms=None
        if signal is Signal.SIGKILL
        else (parent_deadline_ms if parent_deadline_ms is not None else 0),
    )
    return Write(
        child,
        entity_writes.signal(child, spec),
        Idempotency(key, _digest("cascade", key)),
        encode or (lambda _c: b""),
    )


async def run_delegations(store: Store, parent: Ref, run: str, offset: int) -> dict[str, list[str]]:
    """The children ``run`` (its message's key, from ``offset``) delegated to, as its records name
    them: child URL -> the message keys it sent each ("" unknown), in order."""
    found: dict[str, list[str]] = {}
    while True:
        page = await store.read_events(parent, offset, _PAGE)
        for event in page:
            if event.kind == "run" and event.key == f"run_{run}":
                status = pb.Event.FromString(event.body).run.status
                if status not in (pb.RUN_STATUS_STARTED, pb.RUN_STATUS_UNSPECIFIED):
                    return found  # the run's end: its records all come before it
            if event.kind != CHILD_EVENT:
                continue
            data = value_to_json(pb.Event.FromString(event.body).custom.data)
            if not isinstance(data, dict) or data.get("run") != run or data.get("phase") not in DELEGATIONS:
                continue
            messages = found.setdefault(str(data.get("child", "")), [])
            message = str(data.get("message") or "")
            if data.get("phase") == "sent" and message not in messages:
                messages.append(message)
        if len(page) < _PAGE:
            return found
        offset = page[-1].offset + 1


def _child_ref(url: str) -> Ref | None:
    parts = url.strip("/").split("/")
    return (parts[0], parts[1]) if len(parts) == 2 and all(parts) else None


def _encode(commit: Commit) -> bytes:
    """A child's signal's answer, kept for the ``told`` record (and its idempotent replay)."""
    detail, outcome = "", ""
    for event in commit.events:
        if event.kind == "signal":
            detail = pb.Event.FromString(event.body).signal.detail
    if isinstance(commit.result, entity_writes.Signalled):
        outcome = commit.result.decision.outcome.value
    if outcome == "pending":  # a runtime holds it: told, and its runtime settles it
        outcome, detail = "told", detail or "its runtime settles it"
    return json.dumps({"outcome": outcome, "detail": detail}).encode()


def _sigint(parent: Ref, run: str, child: Ref, message: str, located: Any, in_flight: Any) -> Write:
    key = f"cascade-sigint-{parent[0]}.{parent[1]}-{run}" + (f"-{message}" if message else "")
    spec = entity_writes.SignalSpec(
        Signal.SIGINT,
        reason=f"its parent {entity_url(*parent)} had its run of {run} aborted by SIGINT",
        sender=SENDER,
        message_key=message,
    )
    signal = entity_writes.signal(child, spec, located, in_flight)
    return Write(child, signal, Idempotency(key, _digest("sigint", key)), _encode)


def stop_reaches(parent_state: State, child_state: State) -> bool:
    """Whether the cascade signals a child in ``child_state`` now: not ended, and (unless the
    parent was killed) one a SIGTERM moves; a `spawning` child is signalled once it has started
    (the rule ``Store.cascades_due`` reads in SQL)."""
    if child_state.terminal:
        return False
    return parent_state is State.KILLED or lifecycle.decide(child_state, Signal.SIGTERM, None).transitions


async def _tell(
    store: Store, parent: EntityRecord, run: str, child: EntityRecord, message: str
) -> dict[str, Any]:
    """One child's signal for ``run``: what it came to, and the child's state and bound after it."""
    signal = stop_signal(parent.state)
    if STATE_RULES[parent.state].shutting_down or parent.state.terminal:
        if not stop_reaches(parent.state, child.state):
            # Under the cascade's own key, the signal now would be the one it never sends again.
            why = f"it is {child.state.value}: the cascade signals it once a {signal.value} would move it"
            return {"signal": signal.value, "outcome": "not yet", "detail": why, "state": child.state.value}
        write = stop_write(child.ref, parent.ref, parent.state, parent.stopping_deadline_ms, _encode)
    else:
        signal = Signal.SIGINT
        located = await message_cursor.locate(store, child.ref, message) if message else None
        in_flight = None if message else await message_cursor.at_cursor(store, child.ref)
        write = _sigint(parent.ref, run, child.ref, message, located, in_flight)
    [done] = await store.write_many([write])
    told: dict[str, Any] = {"signal": signal.value}
    if isinstance(done, SignalRejected):
        told |= {"outcome": "refused", "detail": str(done)}
    elif isinstance(done, BaseException):
        raise done
    else:
        answer = json.loads(done.response or b"{}") or {"outcome": "signalled", "detail": "by the cascade"}
        told |= answer
    now = await store.get_entity(child.ref)
    if now is not None:
        told["state"] = now.state.value
        if now.stopping_deadline_ms is not None:
            told["bound"] = epoch_to_iso(now.stopping_deadline_ms / 1000)
    return told


async def tell_children(store: Store, parent: EntityRecord, detached: bool) -> None:
    """Every due run of ``parent``: each child working for it told, then the run cleared with its
    ``told`` record. Raises what the store raised; the next pass does the rest (each step is once)."""
    for entry in entries_of(parent):
        if entry.startswith("~"):  # a delegating run, not due
            continue
        run, _, at = entry.rpartition("@")
        delegated_to = await run_delegations(store, parent.ref, run, int(at or 0))
        children: list[dict[str, Any]] = []
        for url, messages in delegated_to.items():
            child = _child_ref(url)
            record = None if child is None else await store.get_entity(child)
            for message in messages or [""]:
                report: dict[str, Any] = {"child": url, "message": message}
                if child is None or record is None or record.parent != parent_key(*parent.ref):
                    report |= {"outcome": "not signalled", "detail": "not a child of this entity"}
                elif detached:
                    report |= {"outcome": "detached", "detail": "its parent's type leaves its children"}
                else:
                    report |= await _tell(store, parent, run, record, message)
                children.append(report)
        told = {"phase": "told", "run": run, "children": children}
        [cleared] = await store.write_many([Write(parent.ref, _unmark(entry, told))])
        if isinstance(cleared, BaseException):
            raise cleared
