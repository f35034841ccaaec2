"""EntityHost: one leased entity, hosted as one anyio task group.

It runs messages one at a time, each in its own cancel scope, and enforces
every signal (ARCHITECTURE §3) as ``lifecycle.decide`` answers from the state
the server judged the signal against and whether a run is in progress
(host_base.py judges and dispatches; this module says how each action acts):
ABORT_RUN (SIGINT) cancels the run's scope now and records it ABORTED with its
partial output; KILL (SIGKILL) cancels the whole task group, no handler runs;
DELIVER (SIGUSR) runs the handler as its own task beside the run; CLEANUP
(SIGTERM) stops the run at its next step boundary, then runs the handler
within the rest of the grace and writes stopping → stopped if it returns in
time; PAUSE/RESUME (SIGSTOP/SIGCONT) take effect between runs (a run starts only
in ``running``); RELOAD (SIGHUP) writes running → idle after the run. Writes are
fenced (fenced.py): a refusal meaning the entity moved on ends it."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.lowlevel

from .. import lifecycle
from .._proto.electric.v1 import runtime_service_pb2 as rt
from .._proto.electric.v1 import types_pb2 as pb
from ..arguments import json_argument
from ..errors import EntityTerminal, InvalidArgument
from ..lifecycle import (
    OPT_IN_TIMING,
    STATE_RULES,
    Action,
    Effect,
    Outcome,
    Signal,
    State,
    Timing,
    runtime_outcome,
)
from ..models import Event
from .codec import Codec
from .context import Context, InputRequired, Message, SignalInfo
from .entity_type import EntityType
from .fenced import (
    DEFAULT_GRACE,
    FINAL_WRITE_TIMEOUT_S,
    WorkerLink,
    loop_deadline,
    message_of,
)
from .host_base import HostBase
from .loop_callback import in_loop_callback
from .mcp import settle
from .records import LeaseRecords
from .run_in_flight import RunInFlight
from .state import LeaseState

__all__ = ["EntityHost"]

log = logging.getLogger("electric.runtime")

# Scoped SIGINTs remembered for messages not yet delivered (a bound against a flood of bad keys).
_MAX_SCOPED = 1000
_RECENT = 32
# A scoped SIGINT whose message's run had already ended, or was cancelled.
_SCOPED_MISSED = runtime_outcome(Action.ABORT_RUN, Effect.NO_TARGET)
_ABORTED = runtime_outcome(Action.ABORT_RUN, Effect.ACTED)


class EntityHost(HostBase):
    __slots__ = (
        "_cleanup_scope",
        "_delivered",
        "_ended_run",
        "_handler_writes",
        "_landing",
        "_recent",
        "_records",
        "_reload",
        "_reload_settles",
        "_resume_offset",
        "_run",
        "_scoped",
        "_term_output",
        "etype",
        "instance",
    )  # fmt: skip
    # A SIGINT cancels the run's scope here, so the server may judge it and abort the run in the
    # SIGINT's own commit; this host then cancels the run and records its partial output.
    SERVER_MAY_ABORT = True

    def __init__(self, session: WorkerLink, etype: EntityType, grant: rt.LeaseGranted) -> None:
        super().__init__(session, grant)
        self._resume_offset = grant.resume_offset  # older events predate this lease
        self.etype = etype
        self.instance: Any = etype.factory()
        # The offset of the newest message delivered to this lease: the server delivers them in
        # stream order, once each, so this one number stands for every message seen so far.
        self._delivered = -1
        # The keys of the last few messages delivered: a scoped SIGINT for one of them is answered at once.
        self._recent: list[str] = []
        # Pending SIGINTs scoped to a message that has not reached this host yet: it is cancelled
        # on arrival (the signal can overtake its message on the way to the worker).
        self._scoped: dict[str, tuple[SignalInfo, bool]] | None = None
        self._run: RunInFlight | None = None
        self._reload: SignalInfo | None = None
        # Pending SIGHUPs that found no run: their outcome goes into the reload's own commit.
        self._reload_settles: list[tuple[SignalInfo, Outcome]] | None = None
        self._cleanup_scope: anyio.CancelScope | None = None
        # Set once the last run's end records are written (None: no run ended yet).
        self._ended_run: anyio.Event | None = None
        # The cleanup's handler may start before the stopped run's records and the SIGTERM's
        # outcome land; what it writes waits for them (set then), so the stream keeps that order.
        self._handler_writes: anyio.Event | None = None
        # The partial output of the run a SIGTERM stopped: its cleanup handler receives it.
        self._term_output: str | None = None
        # The last run if it ended by itself, as (message key, output, STARTED offset): its end may
        # land after a SIGINT the server settled, which records that run aborted (the end lands
        # as ABORTED), and the SIGINT handler is owed this output (``_aborted_by_server``).
        self._landing: tuple[str, str, int] | None = None
        self._records = LeaseRecords(self._fenced, etype.snapshots)

    async def _prepare(self) -> None:
        if self.etype.uses_state:  # the rebuild reads the stream: only for types that keep state
            await self._records.load_state()

    # -- lifetime ---------------------------------------------------------------------------

    async def _loop(self) -> None:
        while self.end_reason is None:
            state = self.state
            if state.terminal:
                self.end(state.value)
                return
            rules = STATE_RULES[state]
            if self._reload is not None and rules.starts_runs:
                await self._do_reload(self._reload)
                continue
            if self._draining and not rules.cleanup:
                self.end("drained")
                return
            if rules.starts_runs and self._runnable():
                await self._run_message(self._queue.pop(0))
                continue
            timeout = math.inf
            if rules.starts_runs:
                timeout = self._idle_left_s()
                if timeout <= 0:
                    if await self._go_idle("idle_timeout", release=True):
                        return
                    self._idle_since = self._fenced.session.now_s()
                    continue
            await self._bell.wait(max(timeout, 0.0))

    async def _do_reload(self, info: SignalInfo) -> None:
        handler = self.etype.handler_for(Signal.SIGHUP)
        if handler is not None:
            await self._call_handler(handler, info)
        settles, self._reload_settles = self._reload_settles or [], None
        if await self._go_idle("reload", settles, release=True):
            return
        for pending, outcome in settles:  # refused (e.g. SIGTERM came first): they are still owed
            self._report(pending, outcome)
        if STATE_RULES[self.state].starts_runs:
            self._reload = None  # refused for another reason than a state change: do not loop on it

    # -- Context's side ---------------------------------------------------------------------

    @property
    def stop_requested(self) -> bool:
        return self._cleanup_started or STATE_RULES[self.state].cleanup

    async def step_boundary(self, ctx: Context) -> None:
        run = self._run
        if run is None or run.ctx is not ctx or run.stopped_by is not None:
            return
        if STATE_RULES[self.state].cleanup:  # SIGTERM: stop the run here, the cleanup follows
            run.stopped_by = self._term_info()
            run.scope.cancel()
            await anyio.lowlevel.checkpoint()

    async def record_step(self, ctx: Context, name: str) -> None:
        run = self._run
        if run is not None and run.ctx is ctx:
            await self._fenced.run(run.message, pb.RUN_STATUS_STEP, step=name, output=ctx.output.text)

    def declared_timeout(self, step: str, timeout_s: float) -> None:
        """A step declared ``timeout_s``: longer than the grace, a SIGTERM's deadline may cut it with
        no cleanup (SIGTERM waits for the step to end), unless the type opted in to interrupt it."""
        grace = (self.entity.grace_period or DEFAULT_GRACE).total_seconds()
        if timeout_s <= grace or self._interrupts() or step in self.etype.warned_steps:
            return
        self.etype.warned_steps.add(step)  # once per worker, type and step
        log.warning(
            "%s: step %r may run %g s, longer than the %g s grace: a SIGTERM during it stops the entity "
            "at the deadline without its cleanup (its state changes are kept); "
            "app.entity(..., sigterm_interrupts=True) interrupts the step so the cleanup runs",
            self.etype.name,
            step,
            timeout_s,
            grace,
        )

    async def emit(self, type: str, data: Any) -> None:
        await self._writes_open()
        custom = rt.CustomEvent(type=type)
        if data is not None:
            custom.data.CopyFrom(json_argument(data, "data"))
        result = await self._fenced.write(retry=True, custom=custom)
        if result is not None and result.reason == EntityTerminal.default_code:
            # A handler that outlived the end (shielded, or blocking) learns its event was not kept.
            raise EntityTerminal(result.message, status="FAILED_PRECONDITION")
        if result is None and (ended := self._fenced.entity).state.terminal:
            # Past the settle the lease is gone too (the write refused as stale, the stream closed):
            # still the end's doing, and the handler is told so, not left to believe it wrote.
            raise EntityTerminal(
                f"the entity is {ended.state.value}: the event was not appended", status="FAILED_PRECONDITION"
            )
        if result is not None and result.reason == "INVALID_EVENT_TYPE":
            # The server's rule (validation.py): the handler learns its event was not kept.
            raise InvalidArgument(result.message, code=result.reason, status="INVALID_ARGUMENT")

    async def history(self) -> list[Event]:
        return await self._fenced.session.history(self.lease.ref)

    def lease_state(self) -> LeaseState:
        return self._records.lease_state()

    @property
    def codec(self) -> Codec:
        return self.etype.codec

    async def write_step(self, ctx: Context, data: dict[str, Any]) -> None:
        await self._records.write_step(ctx, data)

    # -- runs -------------------------------------------------------------------------------

    async def _run_message(self, message: Message) -> None:
        run = RunInFlight(message, Context(self, message=message), anyio.CancelScope())
        self._run = run
        status: pb.RunStatus.ValueType | None = None
        error = ""
        try:
            if (started := await self._started(message)) is None:
                return
            run.started_offset = started.entity.head_offset - 1
            run.state_before = self._records.state_copy() if self.etype.may_roll_back else None
            self._judge_deferred(run)
            # Delivered again, or a retry: what its (or the retried run's) attempts recorded is replayed.
            if message.attempt > 1 or message.retry_of is not None:
                run.ctx.steps = await self._records.load_steps(message, run.started_offset)
            status, error = await self._execute(run)
        finally:
            self._run = None
            run.ctx.close()  # an abandoned body that comes back later changes nothing
            self._judge_deferred(run)  # STARTED refused: they found no run
            if run.stopped_by is not None and run.stopped_by.signal is Signal.SIGTERM:
                self._term_output = run.ctx.output.text
            if status is None and run.stopped_by is not None:
                status = pb.RUN_STATUS_ABORTED
                error = run.stopped_by.signal.value + (f" ({run.how})" if run.how else "")
            elif status is None and self.state.terminal and run.started_offset is not None:
                # The end reached this host before its own deadline did: the run ended with it.
                status, error = pb.RUN_STATUS_ABORTED, f"the entity is {self.state.value}"
            if status is not None:  # else the session ended: no record, the message is delivered again
                self._landing = None
                if run.stopped_by is None and run.started_offset is not None:
                    self._landing = (run.message.key, run.ctx.output.text, run.started_offset)
                ended = self._ended_run = anyio.Event()
                self._bell.ring()  # a cleanup waiting for the run starts now (its writes wait for these)
                try:
                    await anyio.lowlevel.cancel_shielded_checkpoint()  # and first: these need no haste
                    with anyio.CancelScope(shield=True), anyio.move_on_after(FINAL_WRITE_TIMEOUT_S):
                        await self._finish_run(run, status, error)
                finally:
                    ended.set()
            self._idle_since = self._fenced.session.now_s()
            self._bell.ring()

    async def _execute(self, run: RunInFlight) -> tuple[pb.RunStatus.ValueType | None, str]:
        """The run's body, in a task of its own, and its status (None: stopped, or the session
        ended). The host waits for the body, or only until a signal aborts it: a body blocked in
        a thread that cannot be cancelled (``anyio.to_thread.run_sync`` without
        ``abandon_on_cancel``) is abandoned there, and whatever it does once the thread returns
        is discarded (its context is closed)."""
        done = anyio.Event()
        ended: list[tuple[pb.RunStatus.ValueType, str]] = []

        async def body() -> None:
            try:
                with run.scope:
                    try:
                        run.ctx.steps.bind()  # steps from tasks the body starts are parallel steps
                        result = await self.etype.on_message(self.instance, run.ctx, run.message)
                        if isinstance(result, str) and result and not len(run.ctx.output):
                            run.ctx.output.write(result)
                        ended.append((pb.RUN_STATUS_COMPLETED, ""))
                    except InputRequired as asked:  # ctx.ask: the run ends waiting for its reply
                        run.asked = asked
                        ended.append((pb.RUN_STATUS_INPUT_REQUIRED, ""))
                    except Exception as exc:
                        # Abandoned, or fenced out (not its run any more): what it raised is moot.
                        if run.stopped_by is None and not self.left_behind(f"run of {run.message.key}", exc):
                            log.exception("%s: on_message failed", self.entity.ref)
                            ended.append((pb.RUN_STATUS_FAILED, f"{type(exc).__name__}: {exc}"))
            finally:
                run.body_done = True
                done.set()
                run.wake.set()
                self._bell.ring()  # an interrupting SIGTERM's cleanup starts once the body unwound

        assert self._tg is not None
        self._tg.start_soon(body)
        await run.wake.wait()
        if not done.is_set():
            # Aborted: one pass of the loop lets a body that can be cancelled unwind first (its finally's output counts).
            await anyio.lowlevel.cancel_shielded_checkpoint()
        return ended[0] if ended and run.stopped_by is None else (None, "")

    async def _finish_run(self, run: RunInFlight, status: pb.RunStatus.ValueType, error: str) -> None:
        output = run.ctx.output.text
        await settle(self)  # a cut MCP call's record comes before the run's end
        await self._records.flush(run.ctx, run.message.key)
        await self._records.restore(run)  # a rollback policy's SIGINT: after the run's own changes
        await self._ended(run.message, status, output=output, error=error, **run.asked_fields())
        info = run.stopped_by
        if info is not None and info.signal is Signal.SIGINT:
            if run.outcome_pending:
                await self._fenced.outcome(info, _ABORTED)
            self._sigint_handled(info, run.message.key, output, counted=run.outcome_pending)

    def _sigint_handled(self, info: SignalInfo, message_key: str, output: str, counted: bool = False) -> None:
        """A SIGINT's run is aborted and recorded: its handler is called, with the run's partial
        output. ``counted``: the outcome this host wrote counted it already; else the server
        recorded it, and the metrics count it here."""
        if not counted and (metrics := self._fenced.session.metrics) is not None:
            metrics.carried_out(Signal.SIGINT, _ABORTED)
        handler = self.etype.handler_for(Signal.SIGINT)
        if handler is not None and self._tg is not None and self.end_reason is None:
            # The handler learns which run it aborted, whether or not the SIGINT named it.
            aborted = replace(info, partial_output=output, message_key=message_key)
            self._tg.start_soon(self._call_handler, handler, aborted)

    # -- signals ----------------------------------------------------------------------------

    def _on_message(self, event: pb.Event, attempt: int) -> None:
        if event.offset > self._delivered:
            self._delivered = event.offset
            self._recent.append(event.key)
            if len(self._recent) > _RECENT:
                del self._recent[0]
            self._enqueue(message_of(event, attempt))
            if self._scoped:
                self._settle_scoped(event)
            self._bell.ring()

    def _on_grace_deadline(self, deadline: datetime) -> None:
        super()._on_grace_deadline(deadline)
        if self._cleanup_scope is not None:
            self._cleanup_scope.deadline = loop_deadline(deadline)

    def _run_in_progress(self, event: pb.Event, info: SignalInfo, cell: lifecycle.Cell) -> bool | None:
        run = self._run
        if run is None:
            return False
        if run.started_offset is None and cell.action_running is not cell.action_not_running:
            run.deferred.append(event)  # whether it was aimed at this run shows once STARTED is written
            return None
        # A signal appended before the run's STARTED record was not aimed at it.
        return run.started_offset is None or run.started_offset <= info.offset

    def _kill(self, info: SignalInfo, pending: bool) -> None:
        if self._run is not None:
            self._run.stopped_by = info
        self.end("killed")

    def _enforce(self, info: SignalInfo, pending: bool, decision: lifecycle.Decision) -> None:
        action = decision.action
        if action is Action.ABORT_RUN and (run := self._run) is not None:
            run.abort(info, pending)
        elif action is Action.DELIVER:
            assert self._tg is not None
            self._tg.start_soon(self._deliver, info, pending)
        elif action is Action.RELOAD:
            if info.offset >= self._resume_offset:  # an older one was for the session before this lease
                self._reload = info
            if pending and self._reload is not None and self._run is None:
                # No run to wait for: the reload follows at once, and its commit carries the outcome.
                self._reload_settles = [*(self._reload_settles or ()), (info, decision.outcome)]
            elif pending:
                self._report(info, decision.outcome)
        else:  # PAUSE, RESUME: the server wrote the state; runs start only in `running`
            if action is Action.RESUME and (handler := self.etype.handler_for(info.signal)) is not None:
                assert self._tg is not None
                self._tg.start_soon(self._call_handler, handler, info)
            self._record_decision(info, pending, decision)

    def _judge_deferred(self, run: RunInFlight) -> None:
        deferred, run.deferred = run.deferred, []
        for event in deferred:
            self._on_signal(event)

    def _settle_scoped(self, message: pb.Event) -> None:
        """A message arrived: a remembered scoped SIGINT for it cancels it; one sent after an older
        message that never came in this lease found that message already done."""
        assert self._scoped is not None
        assert self._tg is not None
        if (scoped := self._scoped.pop(message.key, None)) is not None:
            self._scoped_sigint(*scoped)
        for key, (info, _pending) in list(self._scoped.items()):
            if info.offset < message.offset:
                del self._scoped[key]
                self._report(info, _SCOPED_MISSED, "its run already ended")

    def _aborted_by_server(self, event: pb.Event, info: SignalInfo) -> None:
        run = self._run
        if run is None or run.message.key != info.message_key or not info.message_key:
            landing = self._landing
            # The SIGINT aborted the run in progress when it committed. None is here: the last
            # run had ended, and its end landed after the SIGINT (the server recorded it
            # aborted, with all it wrote as the partial output), if that run had started by then
            # and no later one had (a later one would be in progress here, or be the last run).
            if landing is not None and landing[2] < info.offset and info.message_key in ("", landing[0]):
                self._landing = None
                self._sigint_handled(info, landing[0], landing[1])
            return
        if run.stopped_by is not None:
            return
        if run.started_offset is None:
            run.deferred.append(event)  # its STARTED result is on the way: judged again then
            return
        run.abort(info, False)

    def _scoped_sigint(self, info: SignalInfo, pending: bool) -> None:
        """A SIGINT scoped to one message (headless runs) that the server left to us: that
        message's run had started. Its run is aborted if it is in progress; if the run was lost
        with a worker and the message comes again, it is cancelled while queued, or on arrival."""
        assert self._tg is not None
        key = info.message_key
        run = self._run
        if run is not None and run.message.key == key:
            if run.stopped_by is None:
                run.abort(info, pending)
            elif pending:
                self._report(info, _SCOPED_MISSED, "its run is already ending")
            return
        queued = next((m for m in self._queue if m.key == key), None)
        if queued is None:
            if key in self._recent or self._delivered > info.offset or not pending:  # it came and went
                if pending:
                    self._report(info, _SCOPED_MISSED, "its run already ended")
            else:
                self._scoped = self._scoped or {}
                if len(self._scoped) < _MAX_SCOPED:
                    self._scoped[key] = (info, pending)
            return
        self._queue.remove(queued)
        run = RunInFlight(queued, Context(self, message=queued), anyio.CancelScope(), stopped_by=info)
        run.outcome_pending = pending
        self._tg.start_soon(self._finish_run, run, pb.RUN_STATUS_ABORTED, "cancelled before it started")

    def _too_late(self) -> str:
        """Why no handler may start now ("" if one may): none starts after the end, nor once the
        grace deadline of a cleanup has passed (the server is writing `stopped`), whatever this
        host has seen of it yet."""
        state = self.state
        if state.terminal or self.end_reason is not None:
            return f"the entity's hosting ended ({self.end_reason or state.value})"
        deadline = self.grace_deadline
        if STATE_RULES[state].cleanup and deadline is not None and datetime.now(UTC) >= deadline:
            return "the grace period ended"
        return ""

    async def _call_handler(self, handler: Any, info: SignalInfo) -> tuple[Effect, str]:
        await self._records.loaded()  # a handler may be called while the lease loads the state
        if too_late := self._too_late():
            # Checked right before the call: a handler's first step (blocking code, a shielded
            # block) runs before any cancellation can reach it.
            return Effect.NO_TARGET, f"on_signal not called: {too_late}"
        ctx = Context(self)
        called, result = time.perf_counter(), "cancelled"
        try:
            await handler(self.instance, ctx, info)
            result = "returned"
        except Exception as exc:
            result = "failed"
            if not self.left_behind(f"on_signal({info.signal.value})", exc):
                log.exception("%s: on_signal(%s) failed", self.entity.ref, info.signal.value)
            return Effect.FAILED, f"{type(exc).__name__}: {exc}"
        finally:
            if (metrics := self._fenced.session.metrics) is not None:
                metrics.handler_returned(info.signal, time.perf_counter() - called, result)
            # Its state changes were applied at once (the run sees them); now they are written.
            with anyio.CancelScope(shield=True), anyio.move_on_after(FINAL_WRITE_TIMEOUT_S):
                await self._writes_open()
                await self._records.flush(ctx, "")
        return Effect.DELIVERED, ""

    async def _deliver(self, info: SignalInfo, pending: bool) -> None:
        handler = self.etype.handler_for(info.signal)
        effect, detail = (Effect.DELIVERED, "no on_signal handler")
        if handler is not None:
            effect, detail = await self._call_handler(handler, info)
        if pending:
            await self._fenced.outcome(info, runtime_outcome(Action.DELIVER, effect), detail)

    # -- SIGTERM ----------------------------------------------------------------------------

    async def _writes_open(self) -> None:
        """Until a handler may write: after the records its cleanup's start owes (``_clean_up``)."""
        if (gate := self._handler_writes) is not None:
            await gate.wait()

    async def _owed_before_cleanup(self, term: SignalInfo | None, pending: bool, gate: anyio.Event) -> None:
        """The stopped run's end records, then the SIGTERM's outcome; then the handler's writes."""
        try:
            while self._run is not None:  # an interrupted run's own task has its end to write
                await self._bell.wait()
            if (ended := self._ended_run) is not None:
                await ended.wait()
            await self._cleanup_requested(term, pending)
        finally:
            gate.set()

    def _start_owed(self, term: SignalInfo | None, pending: bool, gate: anyio.Event) -> None:
        """``_owed_before_cleanup`` in its own task (from a loop callback); if the hosting ended,
        nothing is owed any more and the handler's writes are let go (they find it ended)."""
        try:
            assert self._tg is not None
            with in_loop_callback():
                self._tg.start_soon(self._owed_before_cleanup, term, pending, gate)
        except RuntimeError:  # the task group has closed
            gate.set()

    def _interrupts(self, term: SignalInfo | None = None) -> bool:
        """Whether SIGTERM interrupts the step in progress (``OPT_IN_TIMING``): opted in, or asked."""
        option, timing = OPT_IN_TIMING[Signal.SIGTERM]
        asked = term is not None and term.interrupt
        return timing is Timing.AT_ONCE and (asked or bool(getattr(self.etype, option)))

    def _term_info(self) -> SignalInfo:
        stopping, why = State.STOPPING, "cleanup resumed after a lost lease"
        return self._term or SignalInfo(Signal.SIGTERM, "", 0, why, "", None, stopping, stopping)

    def _start_cleanup(self, info: SignalInfo | None, pending: bool) -> None:
        run = self._run
        term = info or self._term_info()
        if (
            not self._cleanup_started
            and run is not None
            and run.stopped_by is None
            and self._interrupts(term)
        ):
            # The type opted in: the step is cut at once, as by SIGINT. The cleanup's task is queued
            # before the cut's cancel, so its handler starts while the body unwinds, with the output
            # the run had written when it was cut (what the body writes unwinding is in the run's
            # record); the handler's writes wait for the run's end (``_owed_before_cleanup``).
            run.how = "interrupted mid-step"
            self._term_output = run.ctx.output.text
            super()._start_cleanup(info, pending)
            run.cut_soon(term)
            return
        super()._start_cleanup(info, pending)

    async def _clean_up(self, info: SignalInfo | None, pending: bool) -> bool:
        """Stop the run at its next step boundary, then call on_signal(SIGTERM), all within the grace."""
        term = self._term_info()  # ``info``, or what stands for it when the cleanup resumed
        # The `stopping` event's deadline when it has arrived, else the signal's time + the grace.
        grace = self.entity.grace_period or DEFAULT_GRACE
        deadline = self.grace_deadline or term.deadline or datetime.now(UTC) + grace
        self.grace_deadline = deadline
        cleaned = False
        with anyio.CancelScope(deadline=loop_deadline(deadline)) as scope:
            self._cleanup_scope = scope
            if self._term_output is None:  # not cut (``_start_cleanup``): it stops at its next step boundary
                while self._run is not None:
                    await self._bell.wait()
            # The handler starts now, beside the records owed first (an interrupted step's cleanup
            # starts about as soon as a SIGUSR handler would); its writes wait for them. Their task
            # starts from a loop callback once the handler has begun: not on the handler's path.
            gate = self._handler_writes = anyio.Event()
            asyncio.get_running_loop().call_soon(self._start_owed, term, pending, gate)
            handler = self.etype.handler_for(Signal.SIGTERM)
            if handler is not None:
                effect, _ = await self._call_handler(handler, replace(term, partial_output=self._term_output))
                if effect is Effect.NO_TARGET:
                    return False  # too late to start it: the cleanup did not run
            await gate.wait()  # stopping → stopped follows them
            cleaned = not self._too_late()
        if not cleaned and (run := self._run) is not None:
            # The grace ran out mid-step: the run is cancelled, as SIGKILL would (its changes kept).
            run.stopped_by, run.how = term, "the grace period ran out mid-step; no cleanup ran"
        return cleaned
