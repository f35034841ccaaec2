"""A parent's end reaches its children: the cascade of SIGTERM and SIGKILL down a tree.

A child records its parent at its spawn (``EntityRecord.parent``). When a parent
is shutting down or has ended, each of its open children gets the parent's
signal: SIGTERM while the parent is `stopping` or `stopped`, SIGKILL once it
was `killed`. A cascaded SIGTERM's grace is the smaller of the child's own and
what remains of the parent's (``SignalSpec.latest_deadline_ms``), so a tree
stops within its root's grace; the child's own children follow from its
`stopping`, by the same rule.

Nothing here is held only in memory: what to signal is found in the store
(``Store.cascades_due``), woken by the commits this replica hears and by a poll
of the store for the others' (and after a restart). Each signal carries an
idempotency key named for the parent and the signal, in the child's own
scope, so two replicas, or one sweep and its retry after a crash, signal a
child once. The signal's own write re-checks the child's state, so a child
that ended meanwhile is left as it is.

A child's end is recorded in its parent's stream, an ``electric.child`` record
{phase: "ended", child, state, cause}, keyed by the child (so written once), while that stream
is open; the child is then marked told (``EntityRecord.parent_told``), so the
sweep finds each ended child once, after a restart too. A parent whose stream
has closed (it ended before the child) gets no record.

The same sweep tells the children of each run cut short (a SIGINT's: each child
working for that run gets a SIGINT), found in the store too: core/child_interrupts.py;
and wakes the entities waiting for a run's end they delegated: core/child_wakes.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.entities import entity_url
from electric_sdk._wire.events import event_body
from electric_sdk._wire.json_values import json_to_value
from electric_sdk.lifecycle import STATE_RULES, SignalRejected

from ..lifetime import Component, TaskGroup
from ..settings import POLL
from ..store.base import (
    CascadeFind,
    Commit,
    Decide,
    EntityRecord,
    Idempotency,
    Mutation,
    NewEvent,
    StorageFault,
    Store,
    Write,
    WriteContext,
)
from . import child_interrupts, child_wakes, entity_writes

log = logging.getLogger(__name__)

__all__ = ["CHILD_EVENT", "Cascade", "cascade_key"]

CHILD_EVENT = child_interrupts.CHILD_EVENT

PAGE = 256  # children signalled per pass
# How long a woken sweep waits before it reads. The commit that woke it (a parent's SIGTERM) has
# its deliveries and its answer to send: the sweep's reads run on the same loop, and so would hold
# the signal's way to the parent's worker up by a quarter of a millisecond. Commits landing
# meanwhile are swept together. It costs a cascade this much per level of the tree.
SETTLE_S = 0.002
CASCADE_SENDER = "electric:cascade"


cascade_key = child_interrupts.cascade_key


class Cascade(Component):
    def __init__(self, store: Store, poll_ms: int = POLL.value) -> None:
        self.store = store
        self.poll_s = poll_ms / 1000
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._tasks = TaskGroup("the cascade")
        self._unsubscribe: Callable[[], None] = lambda: None
        self.signalled = 0  # cascaded signals written, for tests and status
        self._awaiting = False  # some entity waits for a run's end (core/child_wakes.py)

    def _on_commit(self, commit: Commit) -> None:
        after = commit.after
        if after is not None and after.children_due:
            self._wakeup.set()  # a run cut short: its children are due their signal
        if after is not None and after.awaited_runs:
            self._awaiting = True  # an entity waits to be woken by a run's end
        if self._awaiting and any(event.kind == "run" for event in commit.events):
            self._wakeup.set()  # perhaps the end it waits for
        # A parent entering a state its children follow; the sweep finds whether it has any.
        if (
            after is not None
            and (after.state.terminal or STATE_RULES[after.state].shutting_down)
            and (commit.before is None or commit.before.state is not after.state)
        ):
            self._wakeup.set()

    async def start(self) -> None:
        self._unsubscribe = self.store.hub.subscribe_all(self._on_commit)
        self._tasks.start_soon(self._run(), name="electric-cascade")

    async def stop(self) -> None:
        self._unsubscribe()
        self._stopping = True
        self._wakeup.set()
        await self._tasks.wait()
        await self._tasks.aclose()

    async def _run(self) -> None:
        while not self._stopping:
            self._wakeup.clear()
            more = False
            try:
                found = await self.store.cascades_due(PAGE)
                if found:
                    await self._signal(found)
                ended = await self.store.children_ended(PAGE)
                if ended:
                    await self._tell_parents(ended)
                interrupted = await self.store.interrupts_due(PAGE)
                if interrupted:
                    await self._interrupt(interrupted)
                waiting = await self.store.awaiting(PAGE)
                self._awaiting = bool(waiting)
                if waiting:
                    await child_wakes.wake_senders(self.store, waiting)
                more = len(found) >= PAGE or len(ended) >= PAGE or len(interrupted) >= PAGE
            except StorageFault:
                pass  # the store has said why; the next pass will do
            except Exception:  # a bug must not end the cascade (nor its server's stop)
                log.exception("the cascade of parents' signals failed")
            if self._stopping:
                return
            if more:
                continue  # more wait: the next page at once
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), self.poll_s)
            await asyncio.sleep(SETTLE_S)

    async def _signal(self, found: list[CascadeFind]) -> None:
        writes = [
            child_interrupts.stop_write(find.child, find.parent, find.parent_state, find.parent_deadline_ms)
            for find in found
        ]
        outcomes = await self.store.write_many(writes)
        for find, outcome in zip(found, outcomes, strict=True):
            if isinstance(outcome, SignalRejected):
                continue  # the child's state refuses it (it ended meanwhile): nothing to do
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, StorageFault):
                    log.error("the cascade to /%s/%s failed: %s", *find.child, outcome)
                continue  # found again by the next pass
            if outcome.commit is not None:
                self.signalled += 1

    async def _interrupt(self, parents: list[EntityRecord]) -> None:
        profiles = await self.store.type_profiles()
        for parent in parents:
            # The type's policy, as its newest code version announced it.
            newest = max((p for p in profiles if p.type == parent.type), key=lambda p: p.seq, default=None)
            detached = newest is not None and newest.children == "detach"
            try:
                await child_interrupts.tell_children(self.store, parent, detached)
            except StorageFault:
                raise
            except Exception as exc:  # one parent's failure must not stop the others'
                log.error("the SIGINT cascade from /%s/%s failed: %s", *parent.ref, exc)

    async def _tell_parents(self, ended: list[EntityRecord]) -> None:
        for child in ended:
            parent_type, _, parent_id = child.parent.partition("/")
            parent = (parent_type, parent_id)
            cause = await self._end_cause(child)
            key = f"child-{child.type}.{child.id}"
            digest = hashlib.sha256(f"child\0{key}".encode()).digest()
            told = await self.store.write_many(
                [Write(parent, _record_child(child, cause), Idempotency(key, digest), lambda _c: b"")]
            )
            if isinstance(told[0], BaseException):
                if not isinstance(told[0], StorageFault):
                    log.error("the record of /%s/%s's end in its parent failed: %s", *child.ref, told[0])
                continue  # found again by the next pass
            marked = await self.store.write_many([Write(child.ref, _mark_told)])
            if isinstance(marked[0], BaseException) and not isinstance(marked[0], StorageFault):
                log.error("marking /%s/%s's parent told failed: %s", *child.ref, marked[0])

    async def _end_cause(self, child: EntityRecord) -> str:
        """The cause its terminal `state` record names (the last state record in its stream)."""
        events = await self.store.read_events(child.ref, max(0, child.head_offset - 50), 50)
        for event in reversed(events):
            if event.kind == "state":
                return pb.Event.FromString(event.body).state.cause
        return ""


def _record_child(child: EntityRecord, cause: str) -> Decide:
    """The parent's ``electric.child`` record of the child's end, unless its stream has closed."""
    data = {"phase": "ended", "child": entity_url(*child.ref), "state": child.state.value, "cause": cause}

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        if current is None or current.closed:
            return Mutation()
        custom = pb.CustomValue(data=json_to_value(data))
        event = NewEvent(
            CHILD_EVENT,
            f"child_{child.type}.{child.id}",
            entity_writes.INSERT,
            event_body(pb.Event(custom=custom)),
        )
        return Mutation([event], current)

    return decide


def _mark_told(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
    if current is None or current.parent_told:
        return Mutation()
    return Mutation([], current.replace(parent_told=True))
