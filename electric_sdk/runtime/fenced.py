"""A host's view of its entity, and its fenced writes; plus reading delivered events.

Every write names the lease epoch and the state the host believes the entity
is in (ARCHITECTURE §2: compare-and-swap). Records (runs, signal outcomes,
custom events) are retried against the state a refusal reports, as long as
the entity still takes records from this lease; a transition is not retried:
its refusal is the answer. A refusal that means the entity moved on (stale
epoch, closed stream) or a lost session ends the hosting, through ``on_gone``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from .. import errors, lifecycle
from .._proto.electric.v1 import runtime_service_pb2 as rt
from .._proto.electric.v1 import types_pb2 as pb
from .._wire.enums import OUTCOME_TO_PB, signal_from_pb, signal_to_pb, state_from_pb, state_to_pb
from .._wire.json_values import value_to_json
from .._wire.times import timestamp_to_datetime
from ..lifecycle import DEFAULT_GRACE_MS, DEFAULT_IDLE_TIMEOUT_MS, Outcome, State
from ..models import Entity, Event, EventPage
from .context import Message, Reply, RetryOf, SignalInfo

if TYPE_CHECKING:
    from ..client import AsyncClient
    from .metrics import WorkerMetrics

__all__ = [
    "DEFAULT_GRACE",
    "DEFAULT_IDLE_TIMEOUT",
    "FINAL_WRITE_TIMEOUT_S",
    "Doorbell",
    "Fenced",
    "SessionLost",
    "WorkerLink",
    "loop_deadline",
    "message_of",
    "signal_info",
]

log = logging.getLogger("electric.runtime")

# The lifecycle's profile defaults, for an entity seen without them.
DEFAULT_GRACE = timedelta(milliseconds=DEFAULT_GRACE_MS)
DEFAULT_IDLE_TIMEOUT = timedelta(milliseconds=DEFAULT_IDLE_TIMEOUT_MS)
# Last records (a run's end, a signal's outcome) are written even while the host is being
# cancelled, within this bound.
FINAL_WRITE_TIMEOUT_S = 5.0
_RETRIES = 4
# A write the server could not store (RETRYABLE_WRITE_REASONS) goes again after these pauses,
# doubling, for as long as the lease lasts: a run waits for its record rather than lose it.
_UNSTORED_FIRST_PAUSE_S = 0.05
_UNSTORED_MAX_PAUSE_S = 2.0


class Doorbell:
    """Wakes every waiter; each then re-checks the facts it waits on (no state kept in flags).

    Built on bare asyncio futures (the runtime runs on asyncio, as grpc.aio does): a host keeps
    one for its whole life and a worker may host ten thousand, so it holds nothing while nobody
    waits (an ``anyio.Event`` per ring costs an ``asyncio.Event`` and its deque each time).
    """

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] | None = None

    def ring(self) -> None:
        waiters, self._waiters = self._waiters, None
        for future in waiters or ():
            if not future.done():
                future.set_result(None)

    async def wait(self, at_most_s: float = math.inf) -> None:
        """Until the next ring, or ``at_most_s`` seconds (a timer, not a cancel scope: cheap)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(future)
        timer = loop.call_later(at_most_s, _wake, future) if at_most_s < math.inf else None
        try:
            await future
        finally:
            if timer is not None:
                timer.cancel()
            if self._waiters is not None and future in self._waiters and not future.done():
                self._waiters.remove(future)  # cancelled: leave the others be


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class SessionLost(Exception):
    """The worker's session with the server ended; the lease is gone with it."""


class WorkerLink(Protocol):
    """What a host needs from its worker (worker.py implements it)."""

    async def write(self, request: rt.RuntimeWrite) -> rt.WriteResult: ...
    def ack(self, lease: rt.Lease, offset: int) -> None: ...
    async def history(self, ref: pb.EntityRef) -> list[Event]: ...
    async def events_page(self, ref: pb.EntityRef, from_offset: int, limit: int) -> EventPage: ...
    def now_s(self) -> float: ...  # the idle timeouts' clock, in seconds (Worker.now_s)
    def client(self) -> AsyncClient: ...  # the worker's client (entity code's ctx.spawn, ctx.send)
    @property
    def code_version(self) -> str: ...  # the version a run's STARTED record names

    # The worker's metrics, or None when they are off.
    metrics: WorkerMetrics | None


class Fenced:
    __slots__ = ("_on_change", "_on_gone", "_txid", "entity", "lease", "lost", "released", "session")

    def __init__(
        self,
        session: WorkerLink,
        lease: rt.Lease,
        entity: pb.Entity,
        on_change: Callable[[], None],
        on_gone: Callable[[str], None],
    ) -> None:
        self.session = session
        self.lease = lease
        self.entity = Entity.from_pb(entity)
        self._txid = entity.txid
        self._on_change = on_change
        self._on_gone = on_gone
        # The lease went back with a write (``transition(release=True)``): no Release owed.
        self.released = False
        # Why this host may write no more (the lease was fenced off, the session ended), once a
        # write found out: what its run does after that is no longer the entity's.
        self.lost: str | None = None

    @property
    def state(self) -> State:
        return self.entity.state

    def observe(self, entity: pb.Entity) -> None:
        """Take a newer snapshot (results and deliveries may cross on the wire: the txid orders them)."""
        if entity.HasField("ref") and entity.txid >= self._txid:
            self._txid = entity.txid
            self.entity = Entity.from_pb(entity)
            self._on_change()

    def observe_state(self, state: State, txid: int) -> None:
        if txid >= self._txid:
            self._txid = txid
            self.entity = replace(self.entity, state=state)
            self._on_change()

    def observe_state_event(self, event: pb.Event) -> datetime | None:
        """A transition someone else wrote (a signal's, the reaper's); returns its deadline, if any."""
        new = state_from_pb(event.state.state)
        if new is not None:
            self.observe_state(new, event.headers.txid)
        return timestamp_to_datetime(event.state.deadline) if event.state.HasField("deadline") else None

    def ack(self, offset: int) -> None:
        self.session.ack(self.lease, offset)

    async def write(self, *, retry: bool, **op: Any) -> rt.WriteResult | None:
        """One fenced write; None when the hosting ended because of it."""
        if (metrics := self.session.metrics) is not None:
            metrics.recording(self.lease.ref, op)  # once, before it is sent: retries are one record
        result: rt.WriteResult | None = None
        for _ in range(_RETRIES):
            request = rt.RuntimeWrite(
                ref=self.lease.ref, epoch=self.lease.epoch, expect_state=state_to_pb(self.state), **op
            )
            try:
                result = await self._stored(request)
            except SessionLost:
                self._gone("session lost")
                return None
            self.observe(result.entity)
            if result.applied:
                return result
            if result.reason == "STALE_EPOCH" or result.entity.closed:
                self._gone(f"write refused: {result.reason or 'closed'}")
                return None
            if not (retry and result.reason == "STATE_CHANGED"):
                break
        if result is not None:
            log.info("%s: write refused: %s %s", self.entity.ref, result.reason, result.message)
        return result

    def _gone(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
        self._on_gone(reason)

    async def _stored(self, request: rt.RuntimeWrite) -> rt.WriteResult:
        """The server's answer to ``request`` once it is not a storage fault. The request goes
        again unchanged, its request id too: if the first did commit (its answer lost in a
        cut-off commit), the server answers what it answered then, and nothing is appended
        twice (server's runtime/answers.py)."""
        pause, unstored = _UNSTORED_FIRST_PAUSE_S, 0
        while True:
            result = await self.session.write(request)
            if result.reason not in errors.RETRYABLE_WRITE_REASONS:
                if unstored:
                    log.info("%s: a write was stored after %d retries", self.entity.ref, unstored)
                return result
            unstored += 1
            report = log.warning if unstored == 1 else log.debug
            report(
                "%s: the server could not store a write (%s: %s); sending it again in %g ms",
                self.entity.ref,
                result.reason,
                result.message,
                pause * 1000,
            )
            await anyio.sleep(pause)
            pause = min(pause * 2, _UNSTORED_MAX_PAUSE_S)

    async def transition(
        self,
        to: State,
        cause: str,
        settles: Sequence[tuple[SignalInfo, Outcome]] = (),
        *,
        release: bool = False,
    ) -> bool:
        """A runtime transition; ``settles``: signal outcomes recorded in the same commit;
        ``release``: the lease goes back in that commit too, if it applies (the host then ends)."""
        lifecycle.check_runtime_transition(self.state, to, cause)
        outcomes = [_update(info, outcome) for info, outcome in settles]
        transition = rt.Transition(to=state_to_pb(to), cause=cause, outcomes=outcomes)
        result = await self.write(retry=False, transition=transition, release=release)
        applied = result is not None and result.applied
        self.released = self.released or (applied and release)
        return applied

    async def outcome(self, info: SignalInfo, outcome: Outcome, detail: str = "") -> None:
        """A signal's outcome is written even while the host is being cancelled (its lease
        ending, SIGKILL): a signal left pending would reach the next lease again."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(FINAL_WRITE_TIMEOUT_S):
            await self.write(retry=True, signal_outcome=_update(info, outcome, detail))

    async def run(
        self,
        message: Message,
        status: pb.RunStatus.ValueType,
        server_may_abort: bool = False,
        earlier: Sequence[int] = (),
        **fields: Any,
    ) -> rt.WriteResult | None:
        """A run's record; ``server_may_abort`` (with STARTED): a SIGINT may abort the run in its
        own commit (``RuntimeWrite.server_may_abort``); ``earlier`` (with STEERED): the messages
        before it still to run (``RuntimeWrite.earlier_messages``)."""
        value = pb.RunValue(
            message_key=message.key,
            status=status,
            attempt=message.attempt,
            message_offset=message.offset,
            **fields,
        )
        if status == pb.RUN_STATUS_STARTED:  # the attempt is bound to the code that started it
            value.code_version = self.session.code_version
        # A run starts only in the state the host saw; its later records follow the entity.
        extra: dict[str, Any] = {"server_may_abort": True} if server_may_abort else {}
        if earlier:
            extra["earlier_messages"] = list(earlier)
        result = await self.write(retry=status != pb.RUN_STATUS_STARTED, run=value, **extra)
        metrics = self.session.metrics
        if metrics is not None and status == pb.RUN_STATUS_STARTED and result is not None and result.applied:
            metrics.run_started(self.lease.ref, message.offset)
        return result


def _update(info: SignalInfo, outcome: Outcome, detail: str = "") -> rt.SignalOutcomeUpdate:
    return rt.SignalOutcomeUpdate(
        signal_key=info.key, outcome=OUTCOME_TO_PB[outcome], detail=detail, signal=signal_to_pb(info.signal)
    )


def loop_deadline(deadline: datetime) -> float:
    """A wall-clock deadline (the server's) as a deadline on the event loop's clock."""
    return anyio.current_time() + max(0.0, (deadline - datetime.now(UTC)).total_seconds())


def message_of(event: pb.Event, attempt: int) -> Message:
    m = event.message
    data = value_to_json(m.data) if m.HasField("data") else None
    retry_of = None
    if m.HasField("retry"):
        retry_of = RetryOf(m.retry.message_key, m.retry.message_offset, m.retry.from_step)
    reply = None
    if m.HasField("reply"):
        reply_data = value_to_json(m.reply.data) if m.reply.HasField("data") else None
        reply = Reply(m.reply.ask_key, m.reply.text, reply_data)
    return Message(
        event.key, event.offset, m.text, data, m.sender, attempt or 1, retry_of, reply, m.steer, m.ahead
    )


def signal_info(event: pb.Event, entity: Entity) -> SignalInfo:
    s = event.signal
    previous = state_from_pb(s.previous_state) or entity.state
    deadline = None
    if s.signal == pb.SIGNAL_SIGTERM:  # the server's deadline: the signal's time + the grace
        deadline = timestamp_to_datetime(event.headers.timestamp) + (entity.grace_period or DEFAULT_GRACE)
    return SignalInfo(
        signal=signal_from_pb(s.signal),
        key=event.key,
        offset=event.offset,
        reason=s.reason,
        sender=s.sender,
        payload=value_to_json(s.payload) if s.HasField("payload") else None,
        previous_state=previous,
        new_state=state_from_pb(s.new_state) or previous,
        message_key=s.message_key,
        deadline=deadline,
        interrupt=s.interrupt,
    )
