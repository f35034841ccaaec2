"""A SIGINT that aborts a run reaches the children working for that run (issue 48, item 3).

Which children worked for a run is in the parent's own stream: entity code's
``ctx.spawn`` and ``ctx.send`` write an ``electric.child`` record of that run
(``{"phase": "spawned" | "sent", "run", "child", "message"}``; runtime/children.py)
as the server answers them, before the run's end. When a run's end is recorded
`aborted` while the entity is not shutting down (a SIGINT's: a SIGTERM or
SIGKILL reaches every child through core/cascade.py), that commit marks the run
due (``EntityRecord.interrupted_runs``, "key@offset" of its message). The sweep
here finds the due runs in the store, so it survives a restart and any
replica's death; it reads the run's records from its message's offset to its
end, and gives each child of the parent named there a SIGINT: scoped to each
message the run sent it, or unscoped if none is known (a child only spawned,
or a send cut before its answer). A delegated entity that is not the parent's
child is someone else's, and is left alone.

Each SIGINT carries an idempotency key named for the parent, the run and the
message (in the child's scope, so for the child too): two replicas, or a sweep
and its retry after a crash, signal a child once. Each child told is then
recorded in the parent's stream (phase ``interrupted``, with the SIGINT's
outcome, keyed so once, while the stream is open); the stop fold reads those
records for the ``downstream`` stage (_wire/stop_stages.py). Last, the run is
cleared from the parent's due runs. A type with ``children="detach"`` records
its children as detached instead of signalling them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.entities import entity_url, parent_key
from electric_sdk._wire.events import event_body
from electric_sdk._wire.json_values import json_to_value, value_to_json
from electric_sdk.lifecycle import STATE_RULES, Signal, SignalRejected

from ..store.base import (
    Commit,
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

log = logging.getLogger(__name__)

__all__ = ["CHILD_EVENT", "DELEGATIONS", "mark_interrupted", "tell_children"]

CHILD_EVENT = "electric.child"
DELEGATIONS = ("spawned", "sent")  # the phases entity code's steps write
SENDER = "electric:cascade"
_PAGE = 256


def mark_interrupted(record: EntityRecord, message_key: str, offset: int) -> EntityRecord:
    """``record`` after its run of ``message_key`` (at ``offset``) ended aborted: due for the
    SIGINT cascade, unless it is shutting down or ended (its children get its SIGTERM or SIGKILL)."""
    rules = STATE_RULES[record.state]
    if rules.shutting_down or record.state.terminal or not message_key:
        return record
    entry = f"{message_key}@{offset}"
    runs = record.interrupted_runs.split()
    return record if entry in runs else record.replace(interrupted_runs=" ".join([*runs, entry]))


def _unmark(entry: str) -> Any:
    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        if current is None or entry not in current.interrupted_runs.split():
            return Mutation()
        runs = [r for r in current.interrupted_runs.split() if r != entry]
        return Mutation([], current.replace(interrupted_runs=" ".join(runs)))

    return decide


def _digest(kind: str, key: str) -> bytes:
    return hashlib.sha256(f"{kind}\0{key}".encode()).digest()


async def run_delegations(store: Store, parent: Ref, run: str, offset: int) -> dict[str, list[str]]:
    """The children ``run`` (its message's key, at ``offset``) delegated to, as its records name
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


async def _interrupt(store: Store, parent: Ref, run: str, child: Ref, message: str) -> dict[str, str]:
    """One child's SIGINT for ``run`` (scoped to ``message`` unless ""): what it came to."""
    key = f"cascade-sigint-{parent[0]}.{parent[1]}-{run}" + (f"-{message}" if message else "")
    spec = entity_writes.SignalSpec(
        Signal.SIGINT,
        reason=f"its parent {entity_url(*parent)} had its run of {run} aborted by SIGINT",
        sender=SENDER,
        message_key=message,
    )
    located = await message_cursor.locate(store, child, message) if message else None
    in_flight = None if message else await message_cursor.at_cursor(store, child)

    def encode(commit: Commit) -> bytes:
        detail, outcome = "", ""
        for event in commit.events:
            if event.kind == "signal":
                value = pb.Event.FromString(event.body).signal
                detail = value.detail
        result = commit.result
        if isinstance(result, entity_writes.Signalled):
            outcome = result.decision.outcome.value
        return json.dumps({"outcome": outcome, "detail": detail}).encode()

    write = Write(
        child,
        entity_writes.signal(child, spec, located, in_flight),
        Idempotency(key, _digest("sigint", key)),
        encode,
    )
    [done] = await store.write_many([write])
    if isinstance(done, SignalRejected):
        return {"outcome": "refused", "detail": str(done)}
    if isinstance(done, BaseException):
        raise done
    answer: dict[str, str] = json.loads(done.response or b"{}")
    return answer


def _record(parent: Ref, data: dict[str, Any]) -> Write:
    """The parent's ``interrupted`` record of one child, once (keyed), while its stream is open."""
    key = f"interrupt_{data['run']}_{data['child']}_{data['message']}"

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        if current is None or current.closed:
            return Mutation()
        custom = pb.CustomValue(data=json_to_value(data))
        event = NewEvent(CHILD_EVENT, key, entity_writes.INSERT, event_body(pb.Event(custom=custom)))
        return Mutation([event], current)

    return Write(parent, decide, Idempotency(key, _digest("interrupted", key)), lambda _c: b"")


async def tell_children(store: Store, parent: EntityRecord, detached: bool) -> None:
    """Every due run of ``parent``: each child working for it told, recorded, and the run cleared.
    Raises what the store raised; the next pass does the rest (each step is once)."""
    for entry in parent.interrupted_runs.split():
        run, _, at = entry.rpartition("@")
        delegated = await run_delegations(store, parent.ref, run, int(at or 0))
        for url, messages in delegated.items():
            child = _child_ref(url)
            record = None if child is None else await store.get_entity(child)
            for message in messages or [""]:
                data = {"phase": "interrupted", "run": run, "child": url, "message": message}
                if child is None or record is None or record.parent != parent_key(*parent.ref):
                    data |= {"outcome": "not signalled", "detail": "not a child of this entity"}
                elif detached:
                    data |= {"outcome": "detached", "detail": "its parent's type leaves its children"}
                else:
                    data |= await _interrupt(store, parent.ref, run, child, message)
                [told] = await store.write_many([_record(parent.ref, data)])
                if isinstance(told, BaseException):
                    raise told
        [cleared] = await store.write_many([Write(parent.ref, _unmark(entry))])
        if isinstance(cleared, BaseException):
            raise cleared
