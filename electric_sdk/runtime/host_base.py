"""HostBase: the flow both entity hosts share (``EntityHost`` for Python code, ``ExecHost`` for a process).

It takes the entity up (``started`` from spawning, ``wake`` from idle, the cleanup
resumed when leased mid-stopping: ``lifecycle.STATE_RULES`` says which), keeps
the idle timeout, takes delivered events in (messages queue, signals act at
once, state events move the host's view and the grace deadline), judges each
signal with ``lifecycle.decide`` in the state the server judged it in and
dispatches it by action, and runs SIGTERM's cleanup to its ``cleanup_complete``
write. Outcomes come from ``lifecycle`` (``decide``, ``runtime_outcome``).

Each host supplies only what differs: its loop (when a message runs), how a
message arrives and runs, whether a run is in progress, and how each action
acts: a cancel scope and ``on_signal`` for Python code, process actions and
receipts for an exec entity.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from .. import lifecycle
from .._proto.electric.v1 import runtime_service_pb2 as rt
from .._proto.electric.v1 import types_pb2 as pb
from ..lifecycle import MESSAGE_SCOPED_SIGNALS, STATE_RULES, Action, Effect, Outcome, State
from .context import Message, SignalInfo
from .fenced import DEFAULT_IDLE_TIMEOUT, WorkerLink
from .lifetime import Lifetime

if TYPE_CHECKING:
    from ..client import AsyncClient

__all__ = ["HostBase"]

# The outcome of a SIGTERM whose cleanup has begun.
_CLEANING_UP = lifecycle.runtime_outcome(Action.CLEANUP, Effect.ACTED)


class HostBase(Lifetime):
    __slots__ = (
        "_behind",
        "_behind_key",
        "_cleanup_started",
        "_deliveries",
        "_idle_since",
        "_queue",
        "_term",
        "grace_deadline",
    )

    # Whether the server may abort this host's runs in a SIGINT's own commit
    # (RuntimeWrite.server_may_abort): a host whose SIGINT cancels the run itself.
    SERVER_MAY_ABORT: ClassVar[bool] = False

    def __init__(self, session: WorkerLink, grant: rt.LeaseGranted) -> None:
        super().__init__(session, grant)
        # Messages delivered and not yet run (a list: a worker may host ten thousand entities,
        # most with nothing queued).
        self._queue: list[Message] = []
        # Deliveries so far, and their count when the server last refused a run because a message
        # sent ahead of the queue runs first (-1 none since), with the refused message's key: it
        # starts again once one more delivery came, or once another message is at the front.
        self._deliveries = 0
        self._behind = -1
        self._behind_key = ""
        # When the host was last busy: the idle timeout counts from then.
        self._idle_since = 0.0
        self._cleanup_started = False
        # The SIGTERM the cleanup is for; None when it resumed on a lease taken mid-stopping.
        self._term: SignalInfo | None = None
        # The `stopping` event's deadline, once seen: the cleanup ends then.
        self.grace_deadline: datetime | None = self.entity.stopping_deadline

    def client(self) -> AsyncClient:
        """The worker's client (entity code's ctx.spawn and ctx.send: children.py)."""
        return self._fenced.session.client()

    # -- lifetime -----------------------------------------------------------------------------

    async def _main(self) -> None:
        self._idle_since = self._fenced.session.now_s()
        try:
            await self._prepare()
            await self._start()
            await self._loop()
        finally:
            self.end(self.end_reason or "done")

    async def _prepare(self) -> None:
        """What must happen before the entity is taken up (an exec host judges its stored process)."""
        return

    async def _start(self) -> None:
        rules = STATE_RULES[self.state]
        if rules.start_cause is not None:
            await self._fenced.transition(State.RUNNING, rules.start_cause)
        elif rules.cleanup:  # leased mid-cleanup: the previous worker was lost
            self._start_cleanup(None, pending=False)

    @abstractmethod
    async def _loop(self) -> None:
        """Run messages while the state starts runs, until the hosting ends."""

    def _idle_left_s(self) -> float:
        """Seconds until the idle timeout (negative: it has passed)."""
        idle = self.entity.idle_timeout or DEFAULT_IDLE_TIMEOUT
        return self._idle_since + idle.total_seconds() - self._fenced.session.now_s()

    def clock_moved(self) -> None:
        """The worker's manual clock jumped: look at the idle timeout again."""
        self._bell.ring()

    async def _go_idle(
        self, cause: str, settles: Sequence[tuple[SignalInfo, Outcome]] = (), *, release: bool = False
    ) -> bool:
        """running → idle with ``cause``; if it applies, the session (and the hosting) ends."""
        if await self._fenced.transition(State.IDLE, cause, settles, release=release):
            self.end(cause)
            return True
        return False

    # -- runs ---------------------------------------------------------------------------------

    async def _started(self, message: Message) -> rt.WriteResult | None:
        """The run's STARTED record, if it applied. A message refused because the entity stopped
        starting runs meanwhile (e.g. paused) goes back to the head of the queue: it runs later."""
        seen = self._deliveries  # a delivery while the write is out may be the one it waits for
        started = await self._fenced.run(message, pb.RUN_STATUS_STARTED, self.SERVER_MAY_ABORT)
        if started is not None and started.applied:
            return started
        if started is not None and not STATE_RULES[self.state].starts_runs:
            self._queue.insert(0, message)
        elif started is not None and started.reason == "MESSAGE_BEHIND":
            # A message sent ahead of the queue runs first, and this host has not seen it yet: it
            # goes back behind those this host has, and waits for it (or for its cancel).
            at = next((i for i, m in enumerate(self._queue) if not m.ahead), len(self._queue))
            self._queue.insert(at, message)
            self._behind, self._behind_key = seen, message.key
        return None

    def _enqueue(self, message: Message) -> None:
        """A delivered message joins the queue: at the back, or, sent ahead of the queue, in front
        of every message not started (the server refuses their runs until its run is done)."""
        if message.ahead:
            self._queue.insert(0, message)
        else:
            self._queue.append(message)

    def _runnable(self) -> bool:
        """Whether a queued message may start now (see ``_started`` for the wait)."""
        return bool(self._queue) and (
            self._behind != self._deliveries or self._queue[0].key != self._behind_key
        )

    async def take_steer(self, run: Message, step: int, wait: bool = False) -> Message | None:
        """``ctx.take_steer`` of ``run`` at ``step``: the oldest steering message queued (``wait``:
        once one arrives), recorded as taken (RUN_STATUS_STEERED) and so done; None when there is
        none, or it is done already."""
        while (taken := next((m for m in self._queue if m.steer and m.offset > run.offset), None)) is None:
            if not wait:
                return None
            await self._bell.wait()  # rung by each message's arrival
        self._queue.remove(taken)
        earlier = [run.offset, *(m.offset for m in self._queue if m.offset < taken.offset)]
        status = pb.RUN_STATUS_STEERED
        result = await self._fenced.run(
            taken, status, earlier=earlier, steered_into=run.key, steered_step=step
        )
        if result is None or not result.applied:
            return None
        self._fenced.ack(taken.offset)
        return taken

    async def _ended(self, message: Message, status: pb.RunStatus.ValueType, **fields: Any) -> None:
        """A run's last record; its message is then done with (acknowledged)."""
        await self._fenced.run(message, status, **fields)
        self._fenced.ack(message.offset)

    # -- deliveries ---------------------------------------------------------------------------

    def _on_delivery(self, event: pb.Event, attempt: int) -> None:
        self._deliveries += 1
        if self._behind >= 0:
            self._bell.ring()  # a run waiting for a message sent ahead may start now
        kind = event.WhichOneof("value")
        if kind == "message":
            self._on_message(event, attempt)  # acknowledged once its run has ended
            return
        if kind == "signal":
            self._on_signal(event)
        elif kind == "state" and (deadline := self._fenced.observe_state_event(event)) is not None:
            self._on_grace_deadline(deadline)
        self._fenced.ack(event.offset)

    @abstractmethod
    def _on_message(self, event: pb.Event, attempt: int) -> None:
        """A delivered message: queued, unless this host has seen it already."""

    def _on_grace_deadline(self, deadline: datetime) -> None:
        """The `stopping` event's deadline arrived: the cleanup ends then."""
        self.grace_deadline = deadline

    # -- signals ------------------------------------------------------------------------------

    def _on_signal(self, event: pb.Event) -> None:
        if (judged := self._signal_event(event)) is None:
            return
        info, pending, cell = judged
        scoped = info.signal in MESSAGE_SCOPED_SIGNALS and bool(info.message_key)
        if scoped and not pending:
            # The server settled it: it cancelled the message in the signal's own transaction (or
            # found it done, or aborted its run in progress). A copy still queued here is dropped;
            # a run of it would be refused.
            self._queue[:] = [m for m in self._queue if m.key != info.message_key]
            if event.signal.outcome == pb.SIGNAL_OUTCOME_ABORTED:
                self._aborted_by_server(event, info)
        elif scoped and not STATE_RULES[info.previous_state].shutting_down:
            # A SIGINT scoped to a message whose run started: that run alone is aborted, unless the
            # entity is shutting down (SIGKILL is the way out of a cleanup).
            self._scoped_sigint(info, pending)
        else:
            if (run_in_progress := self._run_in_progress(event, info, cell)) is None:
                return  # the host judges it again once it can tell
            if not run_in_progress and not pending and event.signal.outcome == pb.SIGNAL_OUTCOME_ABORTED:
                # The server aborted a run, and none is in progress here: one whose end was on
                # its way as the SIGINT committed, so recorded aborted (``_aborted_by_server``).
                self._aborted_by_server(event, info)
            decision = lifecycle.decide(
                info.previous_state, info.signal, run_in_progress and cell.runs_possible
            )
            action = decision.action
            if action is Action.KILL:
                self._kill(info, pending)
            elif action is Action.CLEANUP:
                self._start_cleanup(info, pending)
            elif action is Action.NONE:
                self._record_decision(info, pending, decision)
            else:
                self._enforce(info, pending, decision)
        self._bell.ring()

    @abstractmethod
    def _run_in_progress(self, event: pb.Event, info: SignalInfo, cell: lifecycle.Cell) -> bool | None:
        """Whether the signal finds a run (or a process) in progress; None: not known yet (the
        host keeps ``event`` and hands it to ``_on_signal`` again once it is)."""

    def _aborted_by_server(self, event: pb.Event, info: SignalInfo) -> None:
        """A SIGINT the server settled `aborted` (only a run started with ``SERVER_MAY_ABORT``):
        scoped, and the run it aborted is in progress here, that run is cancelled now; or no run
        is in progress here, and the one that ended as the SIGINT committed gets its handler."""
        return

    @abstractmethod
    def _scoped_sigint(self, info: SignalInfo, pending: bool) -> None:
        """A SIGINT scoped to one message: abort its run, or cancel it if it has not started."""

    @abstractmethod
    def _kill(self, info: SignalInfo, pending: bool) -> None:
        """SIGKILL (the server wrote `killed`): cancel everything now, no handler runs."""

    @abstractmethod
    def _enforce(self, info: SignalInfo, pending: bool, decision: lifecycle.Decision) -> None:
        """Act on ABORT_RUN, RELOAD, PAUSE, RESUME or DELIVER (ARCHITECTURE §3, §4)."""

    def _record_decision(self, info: SignalInfo, pending: bool, decision: lifecycle.Decision) -> None:
        """Write the decision's outcome if it is ours to write."""
        if pending and decision.outcome is not Outcome.PENDING:
            self._report(info, decision.outcome)

    def _report(self, info: SignalInfo, outcome: Outcome, detail: str = "") -> None:
        """A signal's outcome, written in its own task."""
        assert self._tg is not None
        self._tg.start_soon(self._fenced.outcome, info, outcome, detail)

    # -- SIGTERM ------------------------------------------------------------------------------

    def _start_cleanup(self, info: SignalInfo | None, pending: bool) -> None:
        if self._cleanup_started:
            if info is not None and pending:
                # The SIGTERM reached us after a cleanup resumed on a lease taken mid-stopping.
                self._report(info, _CLEANING_UP)
            return
        self._cleanup_started = True
        self._term = info
        assert self._tg is not None
        self._tg.start_soon(self._cleanup, info, pending)

    async def _cleanup(self, info: SignalInfo | None, pending: bool) -> None:
        """SIGTERM's cleanup: stopping → stopped (cleanup_complete) if it ends in time; the
        hosting ends either way."""
        try:
            cleaned = await self._clean_up(info, pending)
            if cleaned and (stopped := lifecycle.runtime_target(self.state, "cleanup_complete")) is not None:
                await self._fenced.transition(stopped, "cleanup_complete")
        finally:
            self._cleanup_ended()

    @abstractmethod
    async def _clean_up(self, info: SignalInfo | None, pending: bool) -> bool:
        """The host's own cleanup; True if it ran to its end."""

    def _cleanup_ended(self) -> None:
        """The cleanup is over, however it ended: the hosting ends with it."""
        self.end("stopped")

    async def _cleanup_requested(self, info: SignalInfo | None, pending: bool) -> None:
        """The SIGTERM's outcome, once the cleanup has begun."""
        if info is not None and pending:
            await self._fenced.outcome(info, _CLEANING_UP)
