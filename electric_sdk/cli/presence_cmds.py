"""``electric workers``, and what ``get``, ``ls`` and ``watch`` add about worker presence.

An entity waiting for a worker (``presence.entity_unhosted``) whose type no
connected worker hosts would wait silently: each of these says so. A server
without ``ListWorkers`` (older than the CLI) leaves the addition out.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import errors
from ..code_versions import TypeVersions
from ..models import Entity
from ..presence import WorkerInfo, entity_unhosted, hosted_mark, hosted_types, unhosted_note
from . import console, versions_cmds

if TYPE_CHECKING:
    from .commands import Invocation

__all__ = ["HostedTypes", "entity_presence", "entity_table", "hosted", "workers"]


def workers(ctx: Invocation, args: argparse.Namespace) -> int:
    found = ctx.client.workers()
    waiting = versions_cmds.waiting_lines(_versions(ctx))
    if ctx.out.json_mode:
        ctx.out.record({"workers": [w.to_json() for w in found], "waiting": waiting})
    else:
        ctx.out.line(workers_table(found) if found else "no worker connected")
        for line in waiting:
            ctx.out.line(line)
    return 0


def _versions(ctx: Invocation) -> list[TypeVersions]:
    """The types' versions, for the runs waiting for one; none from a server older than them."""
    try:
        return ctx.client.versions()
    except errors.ServerError as exc:
        if exc.status == "UNIMPLEMENTED":
            return []
        raise


WORKER_HEADERS = ("WORKER", "TYPES", "CODE", "LEASES", "CAPACITY", "HEARTBEAT", "REPLICA")


def workers_table(found: Sequence[WorkerInfo]) -> str:
    rows = [
        [
            w.worker_id,
            ",".join(w.types),
            w.code_version or "-",
            str(w.leases_held),
            str(w.capacity) if w.capacity else "-",  # 0: no limit
            console.when(w.last_heartbeat, ms=True),
            w.replica,
        ]
        for w in found
    ]
    return console.table(WORKER_HEADERS, rows, frozenset({3, 4}))


def hosted(ctx: Invocation) -> frozenset[str] | None:
    """The types some connected worker hosts; None when the server cannot say."""
    try:
        return hosted_types(ctx.client.workers())
    except errors.ServerError as exc:
        if exc.status == "UNIMPLEMENTED":  # a server older than ListWorkers
            return None
        raise


def entity_presence(entity: Entity, types: frozenset[str] | None) -> dict[str, Any]:
    """``get --json``'s and ``ls --json``'s addition: ``hosted``, and a ``warning`` when it waits."""
    if types is None:
        return {}
    out: dict[str, Any] = {"hosted": entity.ref.type in types}
    if entity_unhosted(entity, types):
        out["warning"] = unhosted_note(entity.ref.type)
    return out


def entity_table(entities: Sequence[Entity], types: frozenset[str] | None) -> str:
    """``ls``'s table with a HOSTED column: ``yes`` where a connected worker hosts the type, ``no``
    where the entity waits for a type none hosts, ``-`` where it waits for no worker."""
    if types is None:
        return console.entity_table(entities)
    rows = [[*console.entity_row(e), hosted_mark(e, types)] for e in entities]
    return console.table((*console.ENTITY_HEADERS, "HOSTED"), rows, frozenset({2}))


class HostedTypes:
    """For ``watch``: a note the first time an entity of a type none hosts is seen waiting, with
    the worker list read again at most every ``refresh_s`` (a worker may connect meanwhile)."""

    def __init__(self, ctx: Invocation, refresh_s: float = 5.0) -> None:
        self._ctx = ctx
        self._refresh_s = refresh_s
        self._types = hosted(ctx)
        self._read_at = time.monotonic()
        self._noted: set[str] = set()

    def note(self, entity: Entity) -> str | None:
        type_ = entity.ref.type
        if self._types is None or type_ in self._noted or not entity_unhosted(entity, self._types):
            return None
        if time.monotonic() - self._read_at > self._refresh_s:
            self._types, self._read_at = hosted(self._ctx), time.monotonic()
            if self._types is None or not entity_unhosted(entity, self._types):
                return None
        self._noted.add(type_)
        return unhosted_note(type_)
