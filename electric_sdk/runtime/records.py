"""One lease's durable records: the entity's state and its runs' recorded steps, read and written.

At the lease the state is rebuilt (``state_read``: the latest snapshot plus
the tail); for a run delivered again, the records its message's earlier
attempts wrote are read from the stream after the message. Step records and
state changes are ``electric.*`` custom events written through the lease's
fenced write path, like any runtime write (``durable_state`` gives their
shapes). After a state write, once the policy says so, a snapshot follows.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import anyio

from .. import busy
from .._proto.electric.v1 import runtime_service_pb2 as rt
from .._wire.json_values import json_to_value
from ..durable_state import (
    MAX_SNAPSHOT_BYTES,
    SNAPSHOT_EVENT,
    STATE_EVENT,
    STEP_EVENT,
    Collections,
    Op,
    SnapshotPolicy,
    StateError,
    apply_all,
    restore_ops,
)
from ..models import EventPage
from ..state_read import load_state, read_range
from .context import Context, Message
from .fenced import Fenced
from .run_in_flight import RunInFlight
from .state import LeaseState
from .steps import FINAL_OUTCOMES, RunSteps

__all__ = ["LeaseRecords"]

log = logging.getLogger("electric.runtime")


class LeaseRecords:
    __slots__ = ("_fenced", "_loading", "_policy", "state")

    def __init__(self, fenced: Fenced, policy: SnapshotPolicy) -> None:
        self._fenced = fenced
        self._policy = policy
        self.state: LeaseState | None = None
        # Set once the state is loaded (or its load failed); None: no load was started.
        self._loading: anyio.Event | None = None

    async def _page(self, from_offset: int, limit: int) -> EventPage:
        return await self._fenced.session.events_page(self._fenced.lease.ref, from_offset, limit)

    async def load_state(self) -> None:
        self._loading = anyio.Event()
        try:
            loaded = await load_state(self._page, self._fenced.entity.head_offset)
            self.state = LeaseState(loaded, self._policy)
        finally:
            self._loading.set()
        if loaded.scanned > self._policy.scan_events:
            # The state's newest event was far back: a snapshot now saves the next wake the search.
            await self.write_snapshot()

    async def loaded(self) -> None:
        """Until the state is loaded: a signal handler may start while the lease is loading it.
        No pass of the loop once it is: a handler starts before writes queued behind it."""
        if self._loading is not None and not self._loading.is_set():
            await self._loading.wait()

    def lease_state(self) -> LeaseState:
        if self.state is None:
            raise StateError(
                "this entity type's code was not seen using ctx.state, so its state was not loaded: "
                "define it with app.entity(..., state=True)"
            )
        return self.state

    async def load_steps(self, message: Message, started_offset: int) -> RunSteps:
        """The records the earlier attempts of ``message`` wrote (between it and this STARTED); for
        a retry (``electric retry``), first the retried run's records of the steps it replays."""
        events = await read_range(self._page, message.offset + 1, started_offset)
        own = RunSteps.records(message.key, events)
        if message.retry_of is None:
            return RunSteps(own)
        retried = message.retry_of
        reply = message.reply is not None
        return RunSteps(
            await self._retried(retried.key, retried.offset, retried.from_step, message.offset, reply) + own
        )

    async def _retried(
        self, key: str, offset: int, upto: int, end: int, reply: bool = False
    ) -> list[tuple[str, dict[str, Any]]]:
        """Run ``key``'s records of steps before ``upto``, written between its message at ``offset``
        and ``end``. A retried run that was itself a retry recorded only the steps it executed:
        those before its own from-step come from the run it retried, and so on down the chain.
        ``reply``: the run asked at step ``upto`` (``ctx.ask``) and this resumes it, so the state
        changes it made before asking (segment ``upto``) are its too, not to be made again."""
        if upto <= 0 and not reply:
            return []
        found = await read_range(self._page, offset, offset + 1)
        below: list[tuple[str, dict[str, Any]]] = []
        retry = found[0].value.get("retry") if found and found[0].type == "message" else None
        if isinstance(retry, dict):
            from_step = min(upto, int(retry["from_step"]))
            asked = "reply" in found[0].value and from_step == int(retry["from_step"])
            below = await self._retried(
                str(retry["message_key"]), int(retry["message_offset"]), from_step, offset, asked
            )
        events = await read_range(self._page, offset + 1, end)
        return below + [
            r
            for r in RunSteps.records(key, events)
            if _segment(r) < upto or (reply and r[0] == STATE_EVENT and _segment(r) == upto)
        ]

    async def write_step(self, ctx: Context, data: dict[str, Any]) -> None:
        # Only a step's outcome carries the run's changes: a replay skips the changes of a segment
        # whose step has an outcome, so changes on a retry record would be made twice.
        await self._write(ctx, STEP_EVENT, data, with_ops=data.get("outcome") in FINAL_OUTCOMES)

    async def flush(self, ctx: Context, run_key: str) -> None:
        """The context's unwritten state changes (a run's after its last step, a handler's); a
        closing record (``lifecycle.CLOSING_RECORDS``): however the run ended, at its deadline
        or by SIGKILL too, they land before the stream closes."""
        if ctx.pending_ops:
            await self._write(ctx, STATE_EVENT, {"run": run_key, "seg": ctx.steps.index})

    def state_copy(self) -> Collections | None:
        """The state now (a run's start: what a rollback restores), if the entity keeps one."""
        return copy.deepcopy(self.state.live) if self.state is not None else None

    async def restore(self, run: RunInFlight) -> None:
        """A run a rollback policy's SIGINT aborted (``busy.rollback_requested``): the state is
        restored to its copy from the run's start by a visible restore record, an
        ``electric.state`` whose ``restore`` names the policy and the signal (after the run's own
        changes: the stream keeps both). A closing record, written before the run's end."""
        info, state, before = run.stopped_by, self.state, run.state_before
        if info is None or not busy.rollback_requested(info.payload) or state is None or before is None:
            return
        ops = restore_ops(state.live, before)
        apply_all(state.live, ops)
        data: dict[str, Any] = {"run": run.message.key, "restore": {"policy": "rollback", "signal": info.key}}
        data.update({"ops": ops, "snap": state.snapshot})
        custom = rt.CustomEvent(type=STATE_EVENT, data=json_to_value(data))
        state.inflight += 1
        try:
            result = await self._fenced.write(retry=True, custom=custom)
        finally:
            state.inflight -= 1
        if result is not None and result.applied:
            state.committed_write(ops, result.entity.head_offset - 1, custom.ByteSize())

    async def _write(self, ctx: Context, kind: str, data: dict[str, Any], *, with_ops: bool = True) -> None:
        ops: list[Op] = []
        if with_ops:
            ops = ctx.take_ops()
        state = self.state
        if ops:
            data["ops"] = ops
        if state is not None:
            data["snap"] = state.snapshot
            state.inflight += 1
        custom = rt.CustomEvent(type=kind, data=json_to_value(data))
        try:
            result = await self._fenced.write(retry=True, custom=custom)
        finally:
            if state is not None:
                state.inflight -= 1
        if result is None or not result.applied:
            if ops:  # not written (e.g. a step's record refused after the end): the run's end writes them
                ctx.return_ops(ops)
            return
        if state is None:
            return
        if ops:
            state.committed_write(ops, result.entity.head_offset - 1, custom.ByteSize())
        if state.snapshot_due() and not self._fenced.state.terminal:  # a snapshot is no closing record
            await self.write_snapshot()

    async def write_snapshot(self) -> None:
        state = self.state
        assert state is not None
        custom = rt.CustomEvent(type=SNAPSHOT_EVENT, data=json_to_value(state.snapshot_data()))
        if custom.ByteSize() > MAX_SNAPSHOT_BYTES:
            # The server takes at most 4 MiB a message: the wake replays from the older snapshot.
            log.warning(
                "%s: state of %d bytes: no snapshot (at most %d)",
                self._fenced.entity.ref,
                custom.ByteSize(),
                MAX_SNAPSHOT_BYTES,
            )
            state.snapshot_skipped()
            return
        result = await self._fenced.write(retry=True, custom=custom)
        if result is not None and result.applied:
            state.snapshot_written(result.entity.head_offset - 1)
        else:
            log.info("%s: snapshot not written", self._fenced.entity.ref)


def _segment(record: tuple[str, dict[str, Any]]) -> int:
    """The step a record belongs to: a step record's index, a state record's segment."""
    kind, data = record
    return int(data.get("seg", -1) if kind == STATE_EVENT else data.get("index", -1))
