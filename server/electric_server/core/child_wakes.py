"""A parent woken when a run it delegated ends: ``ctx.send(child, text, wake=True)``.

Entity code that hands work to a child and ends its own run asks to be woken
by the end of the child's run: its ``sent`` record (runtime/children.py) says
``"wake": true`` with the message's key and offset. The commit of that record
adds the run to the sender's ``EntityRecord.awaited_runs``
("type/id@key@offset"). The sweep here (core/cascade.py runs it) finds the
waiting entities in the store, reads each awaited run's end from the child's
stream, and delivers it to the sender as a message: sender ``electric:child``,
data ``{"child", "message", "status", "output", "error"}`` (the run's end as
recorded; ``status`` "not run" when the child ended first, "lost" when it is
gone), under an idempotency key named for the child and the message in the
sender's scope, so it is delivered once, across replicas and restarts; the
same commit clears the run from its awaited runs. That message starts a run of
the sender like any other (it wakes an idle entity). An ended sender gets none,
and its wait is dropped.
"""

from __future__ import annotations

import hashlib
from typing import Any

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.entities import entity_url
from electric_sdk._wire.json_values import json_to_value
from electric_sdk.busy import BusyPolicy

from ..store.base import (
    Decide,
    EntityRecord,
    Mutation,
    Ref,
    StorageFault,
    Store,
    Write,
    WriteContext,
)
from ..store.base import Idempotency as Idem
from . import entity_writes

__all__ = ["WAKE_SENDER", "awaiting", "wake_senders"]

WAKE_SENDER = "electric:child"
_PAGE = 256
ENQUEUE = BusyPolicy.ENQUEUE
_ENDS = {
    pb.RUN_STATUS_COMPLETED: "completed",
    pb.RUN_STATUS_FAILED: "failed",
    pb.RUN_STATUS_ABORTED: "aborted",
}


def awaiting(record: EntityRecord, data: dict[str, Any]) -> EntityRecord:
    """``record`` after its ``sent`` record ``data``: waiting for that run's end if it asked."""
    child, key, offset = (
        str(data.get("child", "")).strip("/"),
        str(data.get("message") or ""),
        data.get("offset"),
    )
    if data.get("wake") is not True or not key or not isinstance(offset, int) or child.count("/") != 1:
        return record
    entry = f"{child}@{key}@{offset}"
    runs = record.awaited_runs.split()
    return record if entry in runs else record.replace(awaited_runs=" ".join([*runs, entry]))


def _without(record: EntityRecord, entry: str) -> EntityRecord:
    return record.replace(awaited_runs=" ".join(r for r in record.awaited_runs.split() if r != entry))


def _cleared(entry: str) -> Decide:
    """The wait ``entry`` dropped: its sender ended, or its delivery was a retry the store answered
    from its idempotency key (the first, which cleared it too, may not have)."""

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        if current is None or entry not in current.awaited_runs.split():
            return Mutation()
        return Mutation([], _without(current, entry))

    return decide


async def _run_end(store: Store, child: Ref, key: str, offset: int) -> dict[str, str] | None:
    """How the child's run of message ``key`` (at ``offset``) ended; None while it has not."""
    record = await store.get_entity(child)
    if record is None:
        return {"status": "lost", "output": "", "error": "the entity no longer exists"}
    at = offset
    while at < record.head_offset:
        page = await store.read_events(child, at, _PAGE)
        for event in page:
            if event.kind == "run" and event.key == f"run_{key}":
                run = pb.Event.FromString(event.body).run
                if run.status in _ENDS:
                    return {"status": _ENDS[run.status], "output": run.output, "error": run.error}
        if not page:
            break
        at = page[-1].offset + 1
    if record.state.terminal and record.closed:
        why = f"the entity ended ({record.state.value}) before running it"
        return {"status": "not run", "output": "", "error": why}
    return None


async def _deliver(store: Store, sender: Ref, entry: str, child: Ref, key: str, end: dict[str, str]) -> int:
    """The run's ``end`` as a message to ``sender``, once, its wait (``entry``) cleared in the
    same commit; 1 if it took it (0: it has ended)."""
    url = entity_url(*child)
    data = {"child": url, "message": key, **end}
    text = f"{url} ended its run of {key}: {end['status']}"
    idem_key = f"wake-{child[0]}.{child[1]}-{key}"
    idem = Idem(idem_key, hashlib.sha256(f"wake\0{idem_key}".encode()).digest())
    asked: tuple[str, pb.MessageValue] | None = None
    while True:
        # Enqueued whatever the sender's double-texting policy: a wake is owed, never refused as busy.
        send = entity_writes.send_message(sender, text, json_to_value(data), WAKE_SENDER, ENQUEUE, asked)

        def delivered(current: EntityRecord | None, ctx: WriteContext, send: Decide = send) -> Mutation:
            mutation = send(current, ctx)
            if mutation.entity is None:
                return mutation
            return Mutation(mutation.events, _without(mutation.entity, entry), mutation.result)

        [sent] = await store.write_many([Write(sender, delivered, idem, lambda _c: b"")])
        if not isinstance(sent, entity_writes.NeedsAsk):
            break
        # The sender awaits input (ctx.ask): the wake is its reply, as any next message is.
        asked = await entity_writes.asking_message(store, sender, sent.offset)
    if isinstance(sent, StorageFault):
        raise sent
    return 0 if isinstance(sent, BaseException) else 1  # an ended sender refuses it


async def wake_senders(store: Store, senders: list[EntityRecord]) -> int:
    """Deliver each awaited run's end that has come; how many were delivered. Raises what the
    store raised; the next pass does the rest (each delivery is once)."""
    delivered = 0
    for sender in senders:
        for entry in sender.awaited_runs.split():
            name, key, offset = entry.split("@")
            child_type, _, child_id = name.partition("/")
            # An ended sender is woken no more: its wait is dropped unread.
            end = (
                None
                if sender.state.terminal
                else await _run_end(store, (child_type, child_id), key, int(offset))
            )
            if end is None and not sender.state.terminal:
                continue
            if end is not None:
                delivered += await _deliver(store, sender.ref, entry, (child_type, child_id), key, end)
            [cleared] = await store.write_many([Write(sender.ref, _cleared(entry))])
            if isinstance(cleared, BaseException):
                raise cleared
    return delivered
