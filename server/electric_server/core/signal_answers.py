"""A signal's answer: built from its commit, and given at a stage by the server, for every
door (issue 48, "Staged receipts").

``SignalEntity`` with ``wait`` (gRPC's field, HTTP's ``?wait=``; ``timeout``
its bound): the signal is written as it is without one, then the entity's
stream after the signal's record is folded by ``_wire.stop_stages.StageFollow``
(the fold every door shares, and the SDK's own where it resumes a wait by
itself) until the stage waited for, and each before it, is settled, or the
bound passes. The answer is the signal's, plus each stage reached or not.

How the stream is followed: the waiter subscribes to the store's hub for the
entity before the signal is written, so every commit after the signal's
reaches it, in commit order, as it is published (on PostgreSQL, another
replica's too, through the commit feed): the run's end is folded as it lands,
with no read of the store and no watch in between. Two cases read the stream
instead, through the service's own watch (``Watches.events``: the store's
events, then the feed's): an answer replayed for a retried idempotency key
(its signal committed before the subscription), and a gap in the offsets,
which the hub's order rules out but which is not taken on trust.

The bound: ``timeout`` from the signal's answer (a retried call's, from its
retry); none: until just before the call's deadline, where the stages not
reached say "not reached within the call's deadline" (the SDK then goes on
waiting by itself, from the signal's record), and at most ``MAX_WAIT_MS``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import anyio

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.entities import entity_url
from electric_sdk._wire.enums import (
    OUTCOME_TO_PB,
    SIGNAL_TO_PB,
    STATE_TO_PB,
    outcome_from_pb,
    signal_from_pb,
    state_from_pb,
)
from electric_sdk._wire.events import event_to_pb, event_value_json
from electric_sdk._wire.stop_stages import StageFollow, parse_stage, report_to_pb
from electric_sdk._wire.times import set_timestamp_ms, timestamp_to_datetime, to_iso
from electric_sdk.durations import MAX_WAIT_MS, format_ms
from electric_sdk.lifecycle import Signal, Stage, StageUnavailable

from ..store.base import Commit, Ref, Store, StoredEvent
from . import entity_writes
from . import validation as v
from .auth import current_principal, denial
from .errors import invalid_argument
from .watch import Watches

__all__ = ["MAX_WAIT_MS", "StageWait", "answer_at_stage", "requested", "signal_response"]

# What an answer bounded by the call's deadline leaves of it, for the answer's trip back.
_DEADLINE_MARGIN_S = 0.25


@dataclass(frozen=True, slots=True)
class StageWait:
    """What a signal's answer waits for: ``stage``, within ``bound_ms`` (None: the call's deadline)."""

    stage: Stage
    bound_ms: int | None


def requested(request: api.SignalEntityRequest) -> StageWait | None:
    """The request's wait, checked before anything is written (None: answer once committed).
    Waiting reads the stream: it needs the ``read`` scope as well as ``signal``."""
    has_timeout = request.HasField("timeout")
    if not request.wait:
        if has_timeout:
            raise invalid_argument("USAGE", "a timeout needs a stage to wait for (wait)", field="timeout")
        return None
    try:
        stage = parse_stage(signal_from_pb(request.signal), request.wait)
    except StageUnavailable as exc:
        raise invalid_argument(StageUnavailable.reason, str(exc), field="wait") from None
    except ValueError as exc:
        raise invalid_argument("UNKNOWN_WAIT", str(exc), field="wait") from None
    bound = None
    if has_timeout:
        d = request.timeout
        # 0 answers at once with the stages reached by then, as a send's `wait=run` does.
        bound = min(v.duration_ms(d.seconds, d.nanos, True, 0, "timeout", minimum_ms=0), MAX_WAIT_MS)
    if (refused := denial(current_principal.get(), "read")) is not None:
        raise refused
    return StageWait(stage, bound)


async def answer_at_stage(
    store: Store,
    watches: Watches,
    ref: Ref,
    wait: StageWait,
    message_key: str,
    deadline_s: float | None,
    signal: Callable[[Callable[[bool], object]], Awaitable[api.SignalEntityResponse]],
) -> api.SignalEntityResponse:
    """``signal(replayed)`` (the write, which tells whether its answer was replayed), answered at
    ``wait``'s stage. ``deadline_s``: what is left of the call (None: no deadline)."""
    follower = _Follower(store, watches, ref)
    try:
        replayed: list[bool] = []
        response = await signal(replayed.append)
        # What the commit set going (the signal's delivery to its worker) goes before the fold.
        await asyncio.sleep(0)
        follow = StageFollow(
            signal_from_pb(response.signal),
            response.key,
            response.offset,
            to_iso(timestamp_to_datetime(response.created_at)),
            wait.stage,
            run_message_key=response.run_message_key,
            process_running=response.process_running,
            message_key=message_key,
            outcome=outcome_from_pb(response.outcome),
            state=state_from_pb(response.new_state),
        )
        bound_s, bound_text = _bound(wait, deadline_s)
        with anyio.move_on_after(bound_s) as scope:
            if not follow.done:
                await follower.follow(follow, any(replayed))
        if scope.cancelled_caught:
            follow.timed_out(bound_text)
        follow.finish()
    finally:
        follower.close()
    response.stages.extend(report_to_pb(report) for report in follow.reports.values())
    return response


def _bound(wait: StageWait, deadline_s: float | None) -> tuple[float, str]:
    """How long the answer waits, and how its stages not reached say it."""
    if wait.bound_ms is not None:
        return wait.bound_ms / 1000, format_ms(wait.bound_ms)
    if deadline_s is None:
        return MAX_WAIT_MS / 1000, format_ms(MAX_WAIT_MS)
    left = max(0.0, deadline_s - min(_DEADLINE_MARGIN_S, deadline_s / 10))
    return left, f"the call's deadline ({format_ms(round(left * 1000))})"


class _Follower:
    """The entity's commits from before the signal's write on (see the module docstring), folded
    as each is published: the waiting call runs again only once its stage is settled (or the
    stream closed, or a gap sends it to the watch), not for each commit on the way."""

    __slots__ = ("_early", "_follow", "_gap", "_offset", "_ref", "_settled", "_unsubscribe", "_watches")

    def __init__(self, store: Store, watches: Watches, ref: Ref) -> None:
        self._ref = ref
        self._watches = watches
        self._follow: StageFollow | None = None
        self._offset = 0  # the next event's, once following
        self._early: list[Commit] = []  # published before the signal's answer was had
        self._gap = False
        self._settled = asyncio.Event()
        self._unsubscribe = store.hub.subscribe(ref, self._on_commit, first=True)

    def _on_commit(self, commit: Commit) -> None:
        if self._follow is None:
            self._early.append(commit)
        elif not self._settled.is_set():
            self._fold(self._follow, commit)

    def _fold(self, follow: StageFollow, commit: Commit) -> None:
        for event in commit.events:
            if event.offset < self._offset:
                continue
            if event.offset > self._offset:  # never in the hub's order; read, not trusted
                self._gap = True
                break
            try:
                _see(follow, event)
            except Exception:
                self._gap = True  # the watch folds it again, and the call says what failed
                self._settled.set()
                raise
            self._offset += 1
            if follow.done:
                break
        else:
            after = commit.after
            if not (after is not None and after.closed and self._offset >= after.head_offset):
                return
            follow.stream_closed()
        self._settled.set()

    def close(self) -> None:
        self._unsubscribe()

    async def follow(self, follow: StageFollow, replayed: bool) -> None:
        """Feed ``follow`` the events after the signal's record until it is done or the stream
        closed."""
        if replayed:
            return await _watch(self._watches, self._ref, follow, follow.offset + 1)
        self._follow, self._offset = follow, follow.offset + 1
        early, self._early = self._early, []
        for commit in early:
            if not self._settled.is_set():
                self._fold(follow, commit)
        await self._settled.wait()
        if self._gap:
            await _watch(self._watches, self._ref, follow, self._offset)
        return None


def _see(follow: StageFollow, event: StoredEvent) -> None:
    message = event_to_pb(event)
    at = to_iso(timestamp_to_datetime(message.headers.timestamp))
    follow.see(event.kind, event.key, event_value_json(message), event.offset, at)


async def _watch(watches: Watches, ref: Ref, follow: StageFollow, offset: int) -> None:
    """Fold the entity's watch from ``offset`` until ``follow`` is done or the stream closed."""
    async with contextlib.aclosing(
        cast(AsyncGenerator[Any, None], watches.events(ref, offset, True))
    ) as stream:
        async for item in stream:
            m = api.WatchEventsResponse.FromString(item) if isinstance(item, bytes) else item
            kind = m.WhichOneof("item")
            if kind == "end_of_stream":
                follow.stream_closed()
                return
            events: list[pb.Event] = list(m.events.events) if kind == "events" else [m.event]
            for event in events:
                at = to_iso(timestamp_to_datetime(event.headers.timestamp))
                follow.see(event.type, event.key, event_value_json(event), event.offset, at)
                if follow.done:
                    return


def signal_response(ref: Ref, signal: Signal, commit: Commit) -> api.SignalEntityResponse:
    """The RFC's answer to a signal, from its commit."""
    commit_result: entity_writes.Signalled = commit.result
    d = commit_result.decision
    before = commit.before
    response = api.SignalEntityResponse(
        url=entity_url(*ref),
        signal=SIGNAL_TO_PB[signal],
        previous_state=STATE_TO_PB[d.previous_state],
        new_state=STATE_TO_PB[d.new_state],
        txid=commit.txid,
        key=commit_result.key,
        outcome=OUTCOME_TO_PB[d.outcome],
        # What a wait for the signal's stages needs to know (_wire/stop_stages.py): where its
        # record is, and what was in progress when it landed.
        offset=next((e.offset for e in commit.events if e.key == commit_result.key), 0),
        run_message_key=before.run_key if before is not None else "",
        process_running=before is not None and before.process_running,
    )
    set_timestamp_ms(response.created_at, commit.timestamp_ms)  # in place: no Timestamp to copy
    return response
