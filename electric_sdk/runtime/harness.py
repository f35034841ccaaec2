"""A harness for unit tests of entity code: its handlers, called directly, without a server.

``EntityHarness`` hosts one entity of an app's type in the test's own event
loop and plays the runtime's part: each run gets a real ``Context`` (its
``ctx.state``, recorded ``ctx.step``s, ``ctx.output``, ``ctx.emit``), and
``signal()`` judges a signal with ``lifecycle.decide`` and acts as the
worker would (SIGINT aborts the run at once, SIGUSR calls the handler,
SIGTERM stops the run at its next step and runs the cleanup within the
grace, SIGSTOP/SIGCONT/SIGHUP act between runs). Nothing is written
anywhere: what the worker would append to the stream is kept in ``events``,
as the ``Event``s a client reads (``Client.events()``, ``watch()``), built from
the wire messages the server would store: one model, one shape (``to_json()``
is the HTTP stream's), and a run's records are replayed from them by the
runtime's own ``RunSteps.records``.

Time is a ``ManualClock``: the grace and idle timeouts count on it, and a
test moves it with ``clock.advance(seconds)``, so a 30 s grace takes no time.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from .. import lifecycle
from .._proto.electric.v1 import types_pb2 as pb
from .._wire.enums import OUTCOME_TO_PB, SIGNAL_TO_PB, STATE_TO_PB
from .._wire.json_values import json_to_value
from .._wire.times import timestamp_from_datetime
from ..arguments import json_argument
from ..client._options import DurationLike
from ..durable_state import STATE_EVENT, STEP_EVENT, SnapshotPolicy, apply
from ..lifecycle import OPT_IN_TIMING, STATE_RULES, Action, Decision, Signal, SignalRejected, State, Timing
from ..models import Entity, EntityRef, Event

if TYPE_CHECKING:
    from ..client import AsyncClient
from ..state_read import Loaded
from .app import App
from .context import Context, InputRequired, Message, SignalInfo
from .entity_type import EntityType
from .state import LeaseState
from .steps import RunSteps, seconds

__all__ = ["EntityHarness", "HarnessRun", "ManualClock"]

_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
# A run's end as its RUN event records it (a lost run has none: its worker died).
_RUN_STATUS = {
    "completed": pb.RUN_STATUS_COMPLETED,
    "failed": pb.RUN_STATUS_FAILED,
    "aborted": pb.RUN_STATUS_ABORTED,
    "input_required": pb.RUN_STATUS_INPUT_REQUIRED,
}


def _duration(value: DurationLike | None, default_ms: int) -> timedelta:
    return timedelta(seconds=seconds(value)) if value is not None else timedelta(milliseconds=default_ms)


class ManualClock:
    """A clock that moves only when the test says so.

    It is also a server's clock (``TestServer(clock=ManualClock())``: grace deadlines,
    worker sessions' liveness and the writes' timestamps count on it), so ``advance`` may be
    called from the test's thread while the server's loop runs in another: the server's
    sleepers are woken through ``on_advance``, which they make thread-safe.
    """

    def __init__(self, start: datetime = _EPOCH) -> None:
        self._now = start
        self._waiters: list[tuple[datetime, anyio.Event]] = []
        self._on_advance: list[Callable[[], None]] = []

    def now(self) -> datetime:
        return self._now

    def now_ms(self) -> int:
        return int(self._now.timestamp() * 1000)

    def monotonic(self) -> float:
        return self._now.timestamp()

    def on_advance(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` after each ``advance``; returns the way to stop."""
        self._on_advance.append(callback)
        return lambda: self._on_advance.remove(callback) if callback in self._on_advance else None

    def advance(self, seconds: float) -> None:
        """Move the clock on; whatever waits for a time now past is woken."""
        if seconds < 0:
            raise ValueError("a clock only moves forward")
        self._now += timedelta(seconds=seconds)
        due = [w for w in self._waiters if w[0] <= self._now]
        self._waiters = [w for w in self._waiters if w[0] > self._now]
        for _, event in due:
            event.set()
        for callback in list(self._on_advance):
            callback()

    async def sleep_until(self, when: datetime) -> None:
        if when <= self._now:
            return
        event = anyio.Event()
        self._waiters.append((when, event))
        await event.wait()


@dataclass(slots=True)
class HarnessRun:
    """One run of ``on_message``: ``await run.wait()`` for its ``status`` (completed, failed,
    aborted or input_required: then ``question``, what ``ctx.ask`` asked), ``output`` and ``error``."""

    message: Message
    ctx: Context
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    status: str = ""
    output: str = ""
    error: str = ""
    question: str = ""
    stopped_by: SignalInfo | None = None
    ended: anyio.Event = field(default_factory=anyio.Event)

    async def wait(self) -> HarnessRun:
        await self.ended.wait()
        return self


class EntityHarness:
    """``async with EntityHarness(app, "assistant") as h:`` — one entity of type ``"assistant"``,
    ``running``, with its runs and signals driven by the test::

        run = await h.send("hello")                      # runs on_message to its end
        run = h.start("long task")                       # or in the background...
        await h.signal("SIGINT")                         # ...and aborted at once
        assert (await run.wait()).status == "aborted"
    """

    def __init__(
        self,
        app: App | EntityType,
        type_name: str | None = None,
        *,
        id: str = "test",
        clock: ManualClock | None = None,
        grace_period: timedelta | None = None,
        idle_timeout: timedelta | None = None,
    ) -> None:
        if isinstance(app, App):
            if type_name is None or type_name not in app.types:
                raise ValueError(f"name one of the app's entity types: {', '.join(app.types)}")
            self.etype = app.types[type_name]
        else:
            self.etype = app
        self.clock = clock or ManualClock()
        # The type's profile, as a worker announces it, unless the test names its own.
        grace = grace_period or _duration(self.etype.grace_period, lifecycle.DEFAULT_GRACE_MS)
        idle = idle_timeout or _duration(self.etype.idle_timeout, lifecycle.DEFAULT_IDLE_TIMEOUT_MS)
        now = self.clock.now()
        self.entity = Entity(
            EntityRef(self.etype.name, id),
            State.RUNNING,
            grace,
            idle,
            now,
            now,
            0,
            False,
            None,
            0,
            pb.Entity(),
        )
        self.instance: Any = self.etype.factory()
        self.codec = self.etype.codec
        self._lease_state = LeaseState(Loaded({}, -1, -1, 0, 0), SnapshotPolicy())
        # What the worker and the server would append to the stream, in order (see _append).
        self.events: list[Event] = []
        self.causes: list[str] = []  # the causes of the lifecycle's transitions, in order
        self.grace_deadline: datetime | None = None
        self._run: HarnessRun | None = None
        self._keys = itertools.count(1)
        self._tg: TaskGroup | None = None
        self._changed = anyio.Event()
        self._reload = False
        self._cleanup_scope: anyio.CancelScope | None = None
        self._term_output: str | None = None
        self._idle_since = self.clock.now()

    async def __aenter__(self) -> EntityHarness:
        self._tg = await anyio.create_task_group().__aenter__()
        self._tg.start_soon(self._idle_timer)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        return await self._tg.__aexit__(exc_type, exc, tb)

    # -- what the test reads -----------------------------------------------------------------

    @property
    def lifecycle(self) -> State:
        return self.entity.state

    @property
    def state(self) -> dict[str, Any]:
        """The entity's durable state as its code sees it (a copy)."""
        return copy.deepcopy(self._lease_state.live)

    async def wait_lifecycle(self, *states: State) -> State:
        while self.entity.state not in states:
            await self._changed.wait()
        return self.entity.state

    # -- runs --------------------------------------------------------------------------------

    def start(
        self, text: str = "", data: Any = None, *, key: str | None = None, attempt: int = 1
    ) -> HarnessRun:
        """Start a run of ``text`` in the background. ``key`` and ``attempt`` > 1: the message
        delivered again, replaying the steps recorded under that key."""
        if self._tg is None:
            raise RuntimeError("use the harness as `async with EntityHarness(...) as h`")
        if self._run is not None:
            raise RuntimeError("a run is in progress: an entity runs one message at a time")
        if not STATE_RULES[self.entity.state].accepts_messages:
            raise RuntimeError(f"an entity in {self.entity.state.value!r} takes no message")
        key = key or f"m{next(self._keys)}"
        sent = next((e for e in self.events if e.type == "message" and e.key == key), None)
        if sent is None:  # a redelivery's message is the one already in the stream
            value = pb.MessageValue(text=text, sender="test")
            if data is not None:
                value.data.CopyFrom(json_argument(data, "data"))
            sent = self._append(pb.Event(type="message", message=value), key)
        message = Message(key, sent.offset, text, data, "test", attempt)
        run = HarnessRun(message, Context(self, message=message))
        if attempt > 1:  # as a worker loads them: the records of the run's earlier attempts
            run.ctx.steps = RunSteps(RunSteps.records(message.key, self.events))
        self._run = run
        self._tg.start_soon(self._execute, run)
        return run

    async def send(self, text: str = "", data: Any = None, **kw: Any) -> HarnessRun:
        """Run ``text`` to its end."""
        return await self.start(text, data, **kw).wait()

    async def _execute(self, run: HarnessRun) -> None:
        while not STATE_RULES[self.entity.state].starts_runs:  # paused or idle: it waits (or wakes)
            if self.entity.state is State.IDLE:
                self._move(State.RUNNING, "wake")
                continue
            await self._changed.wait()
        self._run_event(run, pb.RUN_STATUS_STARTED)
        done = anyio.Event()

        async def body() -> None:
            try:
                with run.scope:
                    run.ctx.steps.bind()
                    result = await self.etype.on_message(self.instance, run.ctx, run.message)
                    if isinstance(result, str) and result and not len(run.ctx.output):
                        run.ctx.output.write(result)
                    run.status = "completed"
            except InputRequired as asked:  # ctx.ask ended it (the harness has no reply to give)
                run.status, run.question = "input_required", asked.question
            except Exception as exc:
                run.status, run.error = "failed", f"{type(exc).__name__}: {exc}"
            finally:
                done.set()
                self._ring()

        assert self._tg is not None
        self._tg.start_soon(body)
        await self._wait(done, run)
        run.ctx.close()
        if run.stopped_by is not None and not run.status:
            run.status, run.error = "aborted", run.stopped_by.signal.value
        run.output = run.ctx.output.text
        if (
            run.stopped_by is not None
            and run.stopped_by.signal is Signal.SIGTERM
            and self._term_output is None
        ):
            self._term_output = run.output  # stopped at a step boundary (a cut took it at the cut)
        if run.stopped_by is None or run.stopped_by.reason != "crash":  # a dead worker writes nothing
            await self._flush(run.ctx, run.message.key)
            self._run_event(run, _RUN_STATUS[run.status])
        self._run = None
        run.ended.set()
        if run.stopped_by is not None and run.stopped_by.signal is Signal.SIGINT:
            handler = self.etype.handler_for(Signal.SIGINT)
            if handler is not None:
                info = replace(run.stopped_by, partial_output=run.output, message_key=run.message.key)
                await self._call(handler, info)
        if self._reload and STATE_RULES[self.entity.state].starts_runs:
            self._reload = False
            self._move(State.IDLE, "reload")
        self._idle_since = self.clock.now()
        self._ring()

    async def _wait(self, done: anyio.Event, run: HarnessRun) -> None:
        """Until the body ends, or a signal aborts it (a body stuck in a thread is abandoned, as
        the worker abandons it; SIGTERM stops it at a step's start, so that one is waited for)."""
        while not done.is_set():
            if run.stopped_by is not None and run.stopped_by.signal is not Signal.SIGTERM:
                await anyio.lowlevel.checkpoint()  # a body that can be cancelled unwinds first
                return
            await self._changed.wait()  # the body rings when it ends

    async def crash(self) -> HarnessRun | None:
        """The worker dies: the run in progress ends with no record (status "lost") and the
        state goes back to what was written; ``send(..., key=run.message.key, attempt=2)`` is
        its redelivery."""
        run = self._run
        if run is None:
            return None
        run.stopped_by = SignalInfo(Signal.SIGKILL, "", 0, "crash", "", None, State.RUNNING, State.RUNNING)
        run.scope.cancel()
        run.ctx.take_ops()  # never written
        self._ring()
        await run.wait()
        run.status = "lost"
        live: dict[str, Any] = {}
        for event in self.events:
            data = event.value.get("data") if event.type in (STEP_EVENT, STATE_EVENT) else None
            for op in data.get("ops", ()) if isinstance(data, dict) else ():
                apply(live, op)
        self._lease_state.live = live
        return run

    # -- signals -----------------------------------------------------------------------------

    async def signal(self, signal: Signal | str, payload: Any = None, reason: str = "test") -> Decision:
        """Send a signal, judged as the server and the runtime would; returns once it has acted
        (a SIGTERM's cleanup and a SIGHUP's reload go on in the background)."""
        sig = Signal.parse(signal)
        previous = self.entity.state
        if STATE_RULES[previous].terminal:
            raise SignalRejected(previous, sig)
        decision = lifecycle.decide(previous, sig, self._run is not None)
        info = SignalInfo(sig, "", len(self.events), reason, "test", payload, previous, decision.new_state)
        value = pb.SignalValue(
            signal=SIGNAL_TO_PB[sig],
            sender="test",
            reason=reason,
            outcome=OUTCOME_TO_PB[decision.outcome],
            previous_state=STATE_TO_PB[previous],
            new_state=STATE_TO_PB[decision.new_state],
        )
        if payload is not None:
            value.payload.CopyFrom(json_argument(payload, "payload"))
        self._append(pb.Event(type="signal", signal=value), f"sig_{len(self.events)}")
        if decision.new_state is not previous:
            self._move(decision.new_state, sig.value)
        action, run = decision.action, self._run
        if action is Action.ABORT_RUN and run is not None:
            run.stopped_by = info
            run.scope.cancel()
        elif action is Action.KILL:
            if run is not None:
                run.stopped_by = info
                run.scope.cancel()
            if self._cleanup_scope is not None:
                self._cleanup_scope.cancel()
        elif action is Action.DELIVER:
            if (handler := self.etype.handler_for(sig)) is not None:
                await self._call(handler, info)
        elif action is Action.CLEANUP:
            self.grace_deadline = self.clock.now() + (self.entity.grace_period or timedelta())
            option, timing = OPT_IN_TIMING[Signal.SIGTERM]
            if run is not None and timing is Timing.AT_ONCE and getattr(self.etype, option):
                run.stopped_by = info  # the type opted in: the step in progress is cut now
                # The cleanup gets the output at the cut, as a worker's does (what the body
                # writes unwinding is in the run's record only).
                self._term_output = run.ctx.output.text
                run.scope.cancel()
            assert self._tg is not None
            self._tg.start_soon(self._cleanup, info)
        elif action is Action.RELOAD:
            self._reload = True
            if run is None and STATE_RULES[self.entity.state].starts_runs:
                self._reload = False
                self._move(State.IDLE, "reload")
        elif action is Action.RESUME and (handler := self.etype.handler_for(sig)) is not None:
            await self._call(handler, info)
        self._ring()
        await anyio.lowlevel.checkpoint()
        return decision

    async def _cleanup(self, term: SignalInfo) -> None:
        deadline = self.grace_deadline
        assert deadline is not None
        with anyio.CancelScope() as scope:
            self._cleanup_scope = scope
            async with anyio.create_task_group() as tg:

                async def expire() -> None:
                    await self.clock.sleep_until(deadline)
                    scope.cancel()

                tg.start_soon(expire)
                while self._run is not None:
                    await self._changed.wait()
                handler = self.etype.handler_for(Signal.SIGTERM)
                if handler is not None:
                    await self._call(
                        handler, replace(term, partial_output=self._term_output, deadline=deadline)
                    )
                tg.cancel_scope.cancel()
            if self.entity.state is State.STOPPING:
                self._move(State.STOPPED, "cleanup_complete")
                return
        if self.entity.state is State.STOPPING:  # the grace ran out: what is left is cancelled
            if self._run is not None:
                self._run.stopped_by = term
                self._run.scope.cancel()
            self._move(State.STOPPED, "grace_expired")

    async def _call(
        self, handler: Callable[[Any, Context, SignalInfo], Awaitable[Any]], info: SignalInfo
    ) -> None:
        ctx = Context(self)
        try:
            await handler(self.instance, ctx, info)
        finally:
            await self._flush(ctx, "")

    # -- the lifecycle and the idle timeout --------------------------------------------------

    def _move(self, new: State, cause: str) -> None:
        previous = self.entity.state
        self.entity = replace(self.entity, state=new, updated_at=self.clock.now())
        self.causes.append(cause)
        value = pb.StateValue(state=STATE_TO_PB[new], previous_state=STATE_TO_PB[previous], cause=cause)
        self._append(pb.Event(type="state", state=value), f"state_{len(self.events)}")
        self._ring()

    def _run_event(self, run: HarnessRun, status: pb.RunStatus.ValueType) -> None:
        message = run.message
        value = pb.RunValue(
            message_key=message.key,
            message_offset=message.offset,
            status=status,
            attempt=message.attempt,
            output=run.output,
            error=run.error,
            question=run.question,
        )
        started = status == pb.RUN_STATUS_STARTED
        operation = pb.OPERATION_INSERT if started else pb.OPERATION_UPDATE
        self._append(pb.Event(type="run", run=value), f"run_{message.key}", operation)

    def _append(
        self, event: pb.Event, key: str, operation: pb.Operation.ValueType = pb.OPERATION_INSERT
    ) -> Event:
        """The event as the server would store it (offset, key, headers on the clock) and as a client
        reads it back: an ``Event``, its ``value`` the wire's JSON shape."""
        event.offset = len(self.events)
        event.key = key
        event.headers.operation = operation
        event.headers.timestamp.CopyFrom(timestamp_from_datetime(self.clock.now()))
        event.headers.txid = len(self.events) + 1
        self.events.append(Event.from_pb(event))
        return self.events[-1]

    def _custom(self, type: str, data: Any) -> None:
        custom = pb.CustomValue()
        if data is not None:
            custom.data.CopyFrom(json_to_value(data))
        self._append(pb.Event(type=type, custom=custom), f"rt_{len(self.events)}")

    def _ring(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _idle_timer(self) -> None:
        self._idle_since = self.clock.now()
        while True:
            if self._run is None and STATE_RULES[self.entity.state].starts_runs:
                idle = self.entity.idle_timeout or timedelta()
                due = self._idle_since + idle
                if self.clock.now() >= due:
                    self._move(State.IDLE, "idle_timeout")
                    continue
                async with anyio.create_task_group() as tg:

                    async def timer(due: datetime = due, tg: TaskGroup = tg) -> None:
                        await self.clock.sleep_until(due)
                        tg.cancel_scope.cancel()

                    async def changed(tg: TaskGroup = tg) -> None:
                        await self._changed.wait()
                        tg.cancel_scope.cancel()

                    tg.start_soon(timer)
                    tg.start_soon(changed)
            else:
                await self._changed.wait()

    # -- the Context's side (context._Host) ----------------------------------------------------

    @property
    def stop_requested(self) -> bool:
        rules = STATE_RULES[self.entity.state]
        return rules.cleanup or rules.terminal

    async def step_boundary(self, ctx: Context) -> None:
        run = self._run
        if (
            run is not None
            and run.ctx is ctx
            and STATE_RULES[self.entity.state].cleanup
            and run.stopped_by is None
        ):
            run.stopped_by = SignalInfo(Signal.SIGTERM, "", 0, "", "", None, State.RUNNING, State.STOPPING)
            run.scope.cancel()
            await anyio.lowlevel.checkpoint()

    async def record_step(self, ctx: Context, name: str) -> None:
        run = self._run
        message = ctx.message
        if message is None:
            return
        value = pb.RunValue(
            message_key=message.key,
            message_offset=message.offset,
            status=pb.RUN_STATUS_STEP,
            step=name,
            attempt=message.attempt,
            output=run.ctx.output.text if run is not None and run.ctx is ctx else "",
        )
        self._append(pb.Event(type="run", run=value), f"run_{message.key}", pb.OPERATION_UPDATE)

    def declared_timeout(self, step: str, timeout_s: float) -> None:
        return None  # the worker's warning (host.py): the harness's SIGTERM is the test's own

    def client(self) -> AsyncClient:
        # The harness has no server (ctx.spawn and ctx.send need one: test them with a TestServer).
        raise RuntimeError("ctx.spawn and ctx.send need a server: run the entity under a TestServer's worker")

    async def emit(self, type: str, data: Any) -> None:
        custom = pb.CustomValue()
        if data is not None:
            custom.data.CopyFrom(json_argument(data, "data"))  # refused as the worker refuses it
        self._append(pb.Event(type=type, custom=custom), f"rt_{len(self.events)}")

    async def history(self) -> list[Event]:
        return list(self.events)

    def lease_state(self) -> LeaseState:
        return self._lease_state

    async def write_step(self, ctx: Context, data: dict[str, Any]) -> None:
        if data.get("outcome") in ("ok", "error"):
            ops = ctx.take_ops()
            if ops:
                data["ops"] = ops
        self._custom(STEP_EVENT, data)

    async def _flush(self, ctx: Context, run_key: str) -> None:
        if ctx.pending_ops:
            data = {"run": run_key, "seg": ctx.steps.index, "ops": ctx.take_ops()}
            self._custom(STATE_EVENT, data)
