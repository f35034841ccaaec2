"""Connected workers as the SDK returns them, and whether an entity's type is hosted.

An entity waits for a worker while its state needs a runtime (``spawning``,
``running``, ``stopping``), or while idle with a message waiting to be run
(the lifecycle's rule, ``needs_runtime``); if no connected worker hosts
its type, it waits until one does. ``get``, ``ls``, ``watch`` and the widgets
all ask ``unhosted`` here, so they say it alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ._proto.electric.v1 import entity_service_pb2 as api
from ._wire.times import timestamp_to_datetime
from ._wire.workers import worker_json
from .lifecycle import State, needs_runtime
from .models import Entity

__all__ = [
    "WorkerInfo",
    "entity_unhosted",
    "hosted_mark",
    "hosted_types",
    "state_decides",
    "unhosted",
    "unhosted_note",
]


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker session connected to the server (any replica of its store)."""

    worker_id: str
    replica: str
    types: tuple[str, ...]
    code_version: str
    capacity: int  # 0: no limit
    leases_held: int
    last_heartbeat: datetime
    raw: api.Worker = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, m: api.Worker) -> WorkerInfo:
        return cls(
            worker_id=m.worker_id,
            replica=m.replica,
            types=tuple(m.types),
            code_version=m.code_version,
            capacity=m.capacity,
            leases_held=m.leases_held,
            last_heartbeat=timestamp_to_datetime(m.last_heartbeat),
            raw=m,
        )

    def to_json(self) -> dict[str, Any]:
        return worker_json(self.raw)


def hosted_types(workers: Iterable[WorkerInfo]) -> frozenset[str]:
    return frozenset(t for w in workers for t in w.types)


def unhosted(type_: str, state: State, hosted: frozenset[str], message_waiting: bool = False) -> bool:
    """Whether an entity of ``type_`` in ``state`` (with a message waiting to be run or not) waits
    for a worker that none connected hosts."""
    return needs_runtime(state, message_waiting) and type_ not in hosted


def entity_unhosted(entity: Entity, hosted: frozenset[str]) -> bool:
    return unhosted(entity.ref.type, entity.state, hosted, entity.raw.message_waiting)


def state_decides(state: State) -> bool:
    """Whether ``state`` alone says if an entity waits for a worker. ``idle`` does not: a message
    waiting to be run makes it wait, and its arrival changes no state."""
    return needs_runtime(state, message_waiting=False) == needs_runtime(state, message_waiting=True)


def hosted_mark(entity: Entity, hosted: frozenset[str]) -> str:
    """``ls``'s HOSTED column and the widgets' table: ``yes`` where a connected worker hosts the
    type, ``no`` where the entity waits for a worker none connected hosts, ``-`` where it waits
    for no worker."""
    if entity.ref.type in hosted:
        return "yes"
    return "no" if entity_unhosted(entity, hosted) else "-"


def unhosted_note(type_: str) -> str:
    return f"no connected worker hosts type {type_!r}: it waits until one does (see `electric workers`)"
