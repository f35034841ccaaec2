"""Durable entity state: how its changes are written in the stream, and how it is rebuilt (pure).

An entity's durable state (``ctx.state``) is a set of named collections of
JSON values: a collection is a list (``append``) or a keyed map (``set``,
``del``), fixed by its first change. Every change is an *op* in the entity's
own stream, inside one of the runtime's reserved custom events:

- ``electric.state`` ``{"ops": [...], "run": KEY, "seg": N, "snap": S}``: changes
  made by a signal handler (``run`` empty), or by a run after its last step;
- ``electric.step`` ``{..., "ops": [...], "snap": S}``: a recorded step's result,
  with the changes its run made since the previous step, in one event (so the
  step and its changes are committed together, or not at all);
- ``electric.snapshot`` ``{"upto": U, "state": {...}}``: the whole state after
  every op in events at offsets <= ``U``.

``snap`` is the offset of the latest snapshot when the event was written (-1:
none yet), so a reader finds the snapshot from the newest state-bearing event
without reading the whole stream. The state is the fold of every op in stream
order; ``rebuild`` from a snapshot plus the ops after its ``upto`` gives the
same state as the fold from the start (the property test checks it).

This module is pure (no I/O): the runtime (``runtime/state.py``) and the
client (``state_read.py``) both rebuild with it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ._wire.json_values import MAX_JSON_DEPTH, nests_too_deep

__all__ = [
    "MAX_PENDING_BYTES",
    "MAX_SNAPSHOT_BYTES",
    "MAX_VALUE_DEPTH",
    "RESERVED_PREFIX",
    "SNAPSHOT_EVENT",
    "STATE_EVENT",
    "STEP_EVENT",
    "Collections",
    "Op",
    "SnapshotPolicy",
    "StateError",
    "apply",
    "apply_all",
    "bears_state",
    "fold",
    "json_copy",
    "ops_of",
    "rebuild",
    "restore_ops",
]

RESERVED_PREFIX = "electric."
STATE_EVENT = "electric.state"
STEP_EVENT = "electric.step"
SNAPSHOT_EVENT = "electric.snapshot"

# An op: ["append", name, value] | ["set", name, key, value] | ["del", name, key] | ["clear", name]
# | ["drop", name] (the collection is gone, as if never changed: a rollback's restore writes it).
Op = list[Any]
Collections = dict[str, Any]  # name -> list | dict[str, Any]
# Bounds that keep every write far below the server's 4 MiB a message: the changes a context makes
# before they are written (with a step's result, at most 256 KiB, in one event), and a snapshot
# (a larger state is not snapshotted: its wakes replay from the older snapshot).
MAX_PENDING_BYTES = 1 << 20
MAX_SNAPSHOT_BYTES = 2 << 20
# A value sits 4 levels down in a snapshot ({"state": {name: {key: value}}}) or an op event.
MAX_VALUE_DEPTH = MAX_JSON_DEPTH - 4


class StateError(ValueError):
    """A change that does not fit the collection (e.g. ``append`` to a keyed map); nothing changes."""


def json_copy(value: Any, what: str = "value") -> Any:
    """``value`` as the JSON it becomes in the stream (tuples become lists): what a rebuild sees."""
    try:
        copied = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise StateError(f"{what} must be JSON (str, number, bool, None, list, dict): {exc}") from None
    if nests_too_deep(copied, MAX_VALUE_DEPTH):
        raise StateError(f"{what} nests more than {MAX_VALUE_DEPTH} lists and dicts deep")
    return copied


def _collection(state: Collections, name: str, kind: type) -> Any:
    current = state.get(name)
    if current is None:
        current = state[name] = kind()
    elif not isinstance(current, kind):
        have = "a list" if isinstance(current, list) else "a keyed map"
        raise StateError(f"state[{name!r}] is {have}")
    return current


def apply(state: Collections, op: Op) -> None:
    """Apply one op to ``state`` in place; StateError (and no change) if it does not fit."""
    match op:
        case ["append", str(name), value]:
            _collection(state, name, list).append(value)
        case ["set", str(name), str(key), value]:
            _collection(state, name, dict)[key] = value
        case ["del", str(name), str(key)]:
            _collection(state, name, dict).pop(key, None)
        case ["clear", str(name)]:
            current = state.get(name)
            if current is not None:
                current.clear()
        case ["drop", str(name)]:
            state.pop(name, None)
        case _:
            raise StateError(f"not a state op: {op!r}")


def apply_all(state: Collections, ops: Iterable[Op]) -> None:
    for op in ops:
        apply(state, op)


def restore_ops(now: Collections, before: Collections) -> list[Op]:
    """The ops that make ``now`` equal ``before`` again (a rollback's restore record): each
    collection that differs is cleared and refilled, or dropped if ``before`` had none."""
    ops: list[Op] = []
    for name in sorted(now.keys() | before.keys()):
        was = before.get(name)
        if now.get(name) == was:
            continue
        if was is None:
            ops.append(["drop", name])
            continue
        ops.append(["drop", name])
        if isinstance(was, list):
            ops.extend(["append", name, value] for value in was)
        else:
            ops.extend(["set", name, key, value] for key, value in was.items())
    return ops


def bears_state(event_type: str) -> bool:
    """Whether events of this type may carry state ops (and a ``snap`` pointer)."""
    return event_type in (STATE_EVENT, STEP_EVENT)


def ops_of(event_type: str, data: Any) -> list[Op]:
    """The ops an event carries (none for any other event)."""
    if not bears_state(event_type) or not isinstance(data, Mapping):
        return []
    ops = data.get("ops")
    return ops if isinstance(ops, list) else []


def fold(events: Iterable[tuple[str, Any]], start: Collections | None = None) -> Collections:
    """The state after ``events`` ((type, data), in stream order), from ``start`` (not changed)."""
    state: Collections = copy.deepcopy(start) if start else {}
    for event_type, data in events:
        apply_all(state, ops_of(event_type, data))
    return state


def rebuild(snapshot: Mapping[str, Any] | None, tail: Iterable[tuple[int, str, Any]]) -> Collections:
    """The state from a snapshot's data (``{"upto", "state"}``, or None) and the events after it
    ((offset, type, data)); events at or before the snapshot's ``upto`` are skipped."""
    upto = int(snapshot["upto"]) if snapshot is not None else -1
    start = snapshot["state"] if snapshot is not None else None
    return fold(((t, d) for offset, t, d in tail if offset > upto), start)


@dataclass
class SnapshotPolicy:
    """When the runtime writes a snapshot: after ``every_ops`` ops or ``every_bytes`` bytes of
    ops since the last one (whichever comes first); ``scan_events``: a wake that had to look
    further back than this for the state writes one at once, so the next wake need not."""

    every_ops: int = 1000
    every_bytes: int = 1 << 20
    scan_events: int = 1000

    def __post_init__(self) -> None:
        if min(self.every_ops, self.every_bytes, self.scan_events) < 1:
            raise ValueError("snapshot policy values must be >= 1")

    def due(self, ops: int, nbytes: int) -> bool:
        return ops >= self.every_ops or nbytes >= self.every_bytes
