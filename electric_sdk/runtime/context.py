"""What entity code sees: ``Context`` (state, steps, output, emit, history), ``Message`` and ``SignalInfo``.

A ``Context`` is made for each run (one message) and for each signal handler
call. ``await ctx.step("tool:search", fn, *args)`` is a recorded step
(steps.py): its result is written in the stream, and a run delivered again
after a crash replays it instead of running it. ``async with ctx.step(name)``
only marks a step. Steps started side by side (``asyncio.gather``, a task
group) are recorded and replayed each by its name or ``key=`` (steps.py);
``ctx.step_key`` is the running step's key for an external side effect. Either way a step's start is the step boundary at which
SIGTERM stops a run (a run that returns first is completed); SIGSTOP, SIGCONT
and SIGHUP act between runs; SIGINT, SIGKILL and SIGUSR act at once, mid-step,
even while the run is blocked in a thread. ``ctx.state`` is the
entity's durable state (state.py), shared by its runs and signal handlers.
``ctx.patched(id)`` lets new code take a run recorded on older code (patches.py).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, overload

from ..client._options import DurationLike
from ..durable_state import MAX_PENDING_BYTES, RESERVED_PREFIX, Op, StateError, apply
from ..errors import InvalidArgument, RunAborted
from ..event_types import custom_type_problem
from ..lifecycle import Signal, State
from ..models import Entity, EntityRef, Event
from .a2a_calls import A2AAgent
from .a2a_calls import call_agent as a2a_call
from .children import send_step, spawn_step
from .codec import Codec
from .mcp import McpServer
from .mcp import call_tool as mcp_call
from .patches import deprecate_patch, patched, unwritten_markers
from .state import LeaseState, StateView
from .steps import Member, Retry, RunSteps, current_member, current_step_key, gather_steps, run_step, seconds

if TYPE_CHECKING:
    from ..client import AsyncClient

T = TypeVar("T")

__all__ = ["Context", "InputRequired", "Message", "Output", "Reply", "RetryOf", "SignalInfo"]


@dataclass(frozen=True, slots=True)
class Message:
    """A message event delivered to ``on_message``."""

    key: str
    offset: int
    text: str
    data: Any
    sender: str
    # 1 on first delivery, +1 for each redelivery after a lost lease.
    attempt: int
    # Set when the message runs a failed or aborted run again (``electric retry``), or resumes a
    # run that asked for input (then ``reply`` is what was sent: ``ctx.ask`` returns its text).
    retry_of: RetryOf | None = None
    reply: Reply | None = None
    # Sent with the "steer" policy while a run was in progress: offered to it (``ctx.take_steer``).
    steer: bool = False
    # Sent ahead of the queue (an interrupt or rollback, a reply): it runs before those queued.
    ahead: bool = False


@dataclass(frozen=True, slots=True)
class Reply:
    """The reply to a run's ``ctx.ask``: the asking run's message key, and what was sent."""

    ask_key: str
    text: str
    data: Any = None


class InputRequired(BaseException):
    """Raised by ``ctx.ask`` to end the run asking for input (a BaseException, so entity code's
    ``except Exception`` lets it through); the host records the run ``input_required``."""

    def __init__(self, question: str, step: int) -> None:
        super().__init__(question)
        self.question, self.step = question, step


@dataclass(frozen=True, slots=True)
class RetryOf:
    """The run a retried message runs again: its message's key and offset, and the first step
    executed (the steps before it answer from that run's records)."""

    key: str
    offset: int
    from_step: int


@dataclass(frozen=True, slots=True)
class SignalInfo:
    """A signal delivered to ``on_signal``."""

    signal: Signal
    key: str
    offset: int
    reason: str
    sender: str
    payload: Any
    previous_state: State
    new_state: State
    message_key: str = ""
    # SIGINT, SIGTERM: what the run it stopped had written to ctx.output (None: no run stopped).
    partial_output: str | None = None
    # SIGTERM: when the grace period ends (the cleanup is cancelled then).
    deadline: datetime | None = None
    # SIGTERM: its sender asked it to interrupt the step in progress (``terminate(interrupt=True)``).
    interrupt: bool = False


class Output:
    """The run's output so far; recorded with the run's end (partial output when aborted)."""

    __slots__ = ("_closed", "_parts")

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._closed = False

    def write(self, text: str) -> None:
        if not self._closed:  # written after the run's end (an abandoned body): not recorded
            self._parts.append(text)

    def close(self) -> None:
        self._closed = True

    append = write

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def __str__(self) -> str:
        return self.text

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts)


class _Host(Protocol):
    """The part of an EntityHost a Context calls (host.py implements it)."""

    @property
    def entity(self) -> Entity: ...
    @property
    def grace_deadline(self) -> datetime | None: ...
    @property
    def stop_requested(self) -> bool: ...
    @property
    def instance(self) -> Any: ...
    @property
    def codec(self) -> Codec: ...
    async def step_boundary(self, ctx: Context) -> None: ...
    async def record_step(self, ctx: Context, name: str) -> None: ...
    def declared_timeout(self, step: str, timeout_s: float) -> None: ...
    async def emit(self, type: str, data: Any) -> None: ...
    async def history(self) -> list[Event]: ...
    def lease_state(self) -> LeaseState: ...
    async def write_step(self, ctx: Context, data: dict[str, Any]) -> None: ...
    def client(self) -> AsyncClient: ...  # the worker's, for ctx.spawn and ctx.send


class Context:
    """The runtime, as seen from one run or one signal handler call."""

    def __init__(self, host: _Host, *, message: Message | None = None) -> None:
        self._host = host
        self.message = message
        self.output = Output()
        self.current_step: str | None = None
        # This context's state changes not written yet (state.py), and its run's recorded steps.
        self.pending_ops: list[Op] = []
        self._pending_bytes = 0
        self.steps = RunSteps()
        self._closed = False

    @property
    def ref(self) -> EntityRef:
        return self._host.entity.ref

    @property
    def entity(self) -> Entity:
        """The entity as last seen by the runtime (state, profile, offsets)."""
        return self._host.entity

    @property
    def lifecycle(self) -> State:
        """The entity's lifecycle state (running, stopping, ...) as last seen by the runtime."""
        return self._host.entity.state

    @property
    def state(self) -> StateView:
        """The entity's durable state: named collections of JSON values, kept in its stream."""
        return StateView(self)

    @property
    def instance(self) -> Any:
        """The entity object (``self`` of a class-style entity type)."""
        return self._host.instance

    @property
    def attempt(self) -> int:
        return self.message.attempt if self.message is not None else 0

    @property
    def deadline(self) -> datetime | None:
        """The grace deadline while the entity is stopping, else None."""
        return self._host.grace_deadline

    grace_deadline = deadline

    @property
    def stop_requested(self) -> bool:
        """Whether a SIGTERM asked the entity to stop: the run is stopped at its next step
        boundary, so a loop that checks this between its steps can return cleanly (its run is
        then recorded completed) and leave the rest to the SIGTERM handler, before ``deadline``."""
        return self._host.stop_requested

    def close(self) -> None:
        """The run ended: what its code does from now on (an abandoned body whose thread
        returned late) is discarded or refused."""
        self._closed = True
        self.output.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RunAborted(
                "this run has ended (aborted while blocked in a thread): its late work is discarded"
            )

    @overload
    def step(self, name: str, /) -> _Step: ...
    @overload
    def step(
        self,
        name: str,
        fn: Callable[..., Awaitable[T]],
        /,
        *args: Any,
        retry: Retry | None = None,
        timeout: DurationLike | None = None,
        key: str | None = None,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, T]: ...
    @overload
    def step(
        self,
        name: str,
        fn: Callable[..., T],
        /,
        *args: Any,
        retry: Retry | None = None,
        timeout: DurationLike | None = None,
        key: str | None = None,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, T]: ...
    def step(
        self,
        name: str,
        fn: Callable[..., Any] | None = None,
        /,
        *args: Any,
        retry: Retry | None = None,
        timeout: DurationLike | None = None,
        key: str | None = None,
        **kwargs: Any,
    ) -> _Step | Coroutine[Any, Any, Any]:
        """One step of a run (a model call, a tool call). Recorded::

            answer = await ctx.step("model:answer", call_model, prompt, retry=Retry(3), timeout="30s")

        runs ``fn(*args, **kwargs)`` (awaited if it returns an awaitable) and records its result;
        a run delivered again replays it. Steps started side by side are each recorded::

            found = await asyncio.gather(*(ctx.step("tool:search", search, q, key=q) for q in queries))

        each known by its ``key``, or its name when the names differ (two that cannot be told
        apart are refused); ``fn`` may return a dataclass or a pydantic model (the app's codec,
        codec.py). Unrecorded (a boundary only)::

            async with ctx.step("tool:search"):
                ...
        """
        if fn is None:
            return _Step(self, name)
        if timeout is not None and self.message is not None:
            self._host.declared_timeout(name, seconds(timeout))
        return run_step(self, name, fn, args, kwargs, retry=retry, timeout=timeout, key=key)

    async def ask(self, question: str) -> str:
        """Ask for input: the run ends now, recorded ``input_required`` with ``question`` (its state
        and steps kept, no lease held); the next message sent to the entity is the reply, and its
        run runs this code again, replaying the steps before the ask, where ``ask`` returns the
        reply's text (a recorded step, ``electric:ask``; its data is ``message.reply.data``)."""
        self._check_open()
        message = self.message
        if message is None:
            raise InvalidArgument("ctx.ask is for a run's code, not a signal handler", code="USAGE")
        position = self.steps.index
        reply = message.reply
        answering = (
            reply is not None and message.retry_of is not None and message.retry_of.from_step == position
        )
        if answering or self.steps.recorded_at(position):
            text = reply.text if answering and reply is not None else ""
            return str(await self.step(ASK_STEP, _answer, text))
        raise InputRequired(question, position)

    async def take_steer(self, *, wait: bool = False) -> Message | None:
        """The oldest steering message (sent with the "steer" policy while this run was in
        progress) not taken yet, or None (``wait``: until one arrives); a step boundary of the
        code's choosing, recorded as the step ``electric:steer`` (a replay answers it from the
        record). A message taken here is done: recorded ``steered`` into this run at this step,
        never run on its own; one no run takes runs as any other message once this run ends."""
        self._check_open()
        message = self.message
        if message is None:
            raise InvalidArgument("ctx.take_steer is for a run's code, not a signal handler", code="USAGE")
        take = getattr(self._host, "take_steer", None)
        position = self.steps.index

        async def offered() -> dict[str, Any] | None:
            taken = await take(message, position, wait) if take is not None else None
            if taken is None:
                return None
            return {
                "key": taken.key,
                "offset": taken.offset,
                "text": taken.text,
                "data": taken.data,
                "sender": taken.sender,
            }

        found = await self.step(STEER_STEP, offered)
        if found is None:
            return None
        return Message(
            found["key"], found["offset"], found["text"], found["data"], found["sender"], 1, steer=True
        )

    async def gather(self, *aws: Awaitable[Any]) -> list[Any]:
        """Run ``aws`` side by side and return their results in order, their recorded steps in a
        group of their own, each known by its place in this call (and its name)::

            pages = await ctx.gather(*(ctx.step("tool:fetch", fetch, url) for url in urls))

        so steps of the same name need no key. The first to fail cancels the others (their steps
        cut short have no record) and its error is raised."""
        return await gather_steps(self.steps, aws)

    async def call_tool(
        self,
        server: McpServer,
        tool: str,
        arguments: dict[str, Any] | None = None,
        *,
        timeout: DurationLike | None = None,  # noqa: ASYNC109 - the step's own bound
    ) -> list[Any]:
        """Call an MCP tool as the recorded step ``mcp:<server>/<tool>`` (mcp.py)::

            found = await ctx.call_tool(search, "search", {"q": "electric"}, timeout="30s")

        returns the result's content as JSON (a replay answers it from the record); a signal that
        ends the run cancels the call at the server."""
        timeout_s = seconds(timeout) if timeout is not None else None
        return await self.step(
            f"mcp:{server.name}/{tool}", mcp_call, self, server, tool, arguments, timeout_s
        )

    async def call_agent(
        self,
        agent: A2AAgent,
        text: str,
        *,
        data: Any = None,
        timeout: DurationLike | None = None,  # noqa: ASYNC109 - the step's own bound
    ) -> dict[str, Any]:
        """Send another A2A agent a message as the recorded step ``a2a:<agent>`` (a2a_calls.py)::

            found = await ctx.call_agent(researcher, "find the paper", timeout="5m")

        returns ``{"task", "context", "state", "text", "artifacts"}`` once the task ends (a replay
        answers it from the record); a signal that ends the run sends the agent ``CancelTask``."""
        timeout_s = seconds(timeout) if timeout is not None else None
        return await self.step(f"a2a:{agent.name}", a2a_call, self, agent, text, data, timeout_s)

    async def spawn(
        self,
        ref: str | EntityRef,
        /,
        *,
        grace_period: DurationLike | None = None,
        idle_timeout: DurationLike | None = None,
    ) -> EntityRef:
        """Spawn a child entity of this one, as a recorded step (a run delivered again does not
        spawn it twice); this entity's SIGTERM and SIGKILL cascade to it::

            helper = await ctx.spawn("researcher/r1")
        """
        return await spawn_step(self, ref, grace_period, idle_timeout)

    async def send(
        self,
        ref: str | EntityRef,
        text: str = "",
        /,
        *,
        data: Any = None,
        wait: Literal["run"] | None = None,
        timeout: DurationLike | None = None,  # noqa: ASYNC109 - the wait's bound, as client.send's
        wake: bool = False,
    ) -> dict[str, Any]:
        """Send an entity (a child, say) a message, as a recorded step; with ``wait="run"``, wait
        for the run it starts. Answers the receipt's, or the run result's, JSON (as recorded)::

            answer = await ctx.send(helper, "find sources", wait="run", timeout="5m")
            text = answer["output"]

        ``wake=True`` instead: this run goes on (and may end); when the run the message starts
        ends, its end is delivered to this entity as a message from ``electric:child``, data
        ``{"child", "message", "status", "output", "error"}`` (docs/runtime.md, "Child entities").
        """
        return await send_step(self, ref, text, data, wait, timeout, wake)

    @property
    def step_key(self) -> str:
        """The recorded step the calling code runs in, as a key for an external side effect (an
        idempotency key): the same across attempts of that step (retries, redeliveries), distinct
        for every step of every run, repeated and parallel names included::

            await ctx.step("pay", lambda: stripe.charge(..., idempotency_key=ctx.step_key))
        """
        key = current_step_key()
        if key is None:
            raise RuntimeError("ctx.step_key is read inside a recorded step (ctx.step(name, fn, ...))")
        return key

    @property
    def codec(self) -> Codec:
        """How step results are recorded and rebuilt (the app's, ``App(codec=...)``)."""
        return self._host.codec

    def patched(self, patch_id: str, /) -> bool:
        """Whether this run takes the new path of the patch ``patch_id``::

            if ctx.patched("check-sources"):
                facts = await ctx.step("tool:check", check, facts)

        False while replaying a run whose steps recorded here predate the patch (its old code
        path was taken), True in a new run or past the recorded steps; a True answer is
        recorded, so the run's next attempts answer True here again. See docs/patches.md."""
        return patched(self.steps, patch_id, run_key=self._run_key, attempt=self.attempt)

    def deprecate_patch(self, patch_id: str, /) -> None:
        """The patch ``patch_id`` once no run that took its old path can be delivered again: the
        new path always, with or without a recorded marker (nothing fails, nothing is recorded)."""
        deprecate_patch(self.steps, patch_id, run_key=self._run_key)

    @property
    def _run_key(self) -> str | None:
        return self.message.key if self.message is not None else None

    async def emit(self, type: str, data: Any = None) -> None:
        """Append a custom event to the stream: ``type`` is 1-128 characters, none a control
        character, not a built-in event type (``INVALID_EVENT_TYPE``) and not starting with
        ``electric.``, the runtime's own records (``RESERVED_EVENT_TYPE``)."""
        if type.startswith(RESERVED_PREFIX):
            raise InvalidArgument(
                f"custom event types starting with {RESERVED_PREFIX!r} are the runtime's own",
                code="RESERVED_EVENT_TYPE",
            )
        problem = custom_type_problem(type)
        if problem is not None:  # the server's rule, checked here too: the harness has no server
            raise InvalidArgument(problem, code="INVALID_EVENT_TYPE")
        self._check_open()
        await self._host.emit(type, data)

    # -- what steps.py and state.py call -------------------------------------------------------

    @property
    def message_key(self) -> str:
        return self.message.key if self.message is not None else ""

    async def step_boundary(self) -> None:
        self._check_open()
        if self.message is not None:
            await self._host.step_boundary(self)

    async def record_step(self, data: dict[str, Any]) -> None:
        self._check_open()
        if self.message is not None:  # a signal handler's steps run, but are not run records
            for marker in unwritten_markers(self.steps):  # ctx.patched's answers, before the step
                await self._host.write_step(self, marker)
            await self._host.write_step(self, data)

    def _state(self) -> LeaseState:
        return self._host.lease_state()

    def _change(self, op: Op) -> None:
        self._check_open()
        member = self.steps.lane()
        if member is not None:
            self._held(member, op)
            return
        if self.message is not None and self.steps.replaying:
            return  # an earlier attempt of this run wrote this change: the state holds it already
        size = len(json.dumps(op))
        if self._pending_bytes + size > MAX_PENDING_BYTES:
            raise StateError(
                f"the state changes not yet written would exceed {MAX_PENDING_BYTES} bytes: they are "
                "written with the run's next recorded step, at its end, or when a handler returns"
            )
        apply(self._state().live, op)
        self.pending_ops.append(op)
        self._pending_bytes += size

    def _held(self, member: Member, op: Op) -> None:
        """A parallel step's change: checked against the state now, applied with its record."""
        live = self._state().live
        name = op[1] if len(op) > 1 and isinstance(op[1], str) else ""
        scratch = {name: copy.copy(live[name])} if name in live else {}
        apply(scratch, op)  # a change that does not fit fails here, in the step's code
        size = len(json.dumps(op))
        if member.size + size > MAX_PENDING_BYTES:
            raise StateError(
                f"parallel step {member.name!r}: its state changes would exceed {MAX_PENDING_BYTES} "
                "bytes: they are written with its record"
            )
        member.ops.append(op)
        member.size += size

    def take_ops(self) -> list[Op]:
        """The changes not yet written, now to be written (with a parallel step's record: its own
        too, applied to the state now, so the state follows the records' order)."""
        ops, self.pending_ops, self._pending_bytes = self.pending_ops, [], 0
        member = current_member(self.steps)
        if member is not None and member.ops:
            live = self._state().live
            for op in member.ops:
                apply(live, op)
            ops, member.ops, member.size = ops + member.ops, [], 0
        return ops

    def return_ops(self, ops: list[Op]) -> None:
        """Changes taken to be written whose write did not apply: unwritten again, first."""
        self.pending_ops[:0] = ops
        self._pending_bytes += len(json.dumps(ops))

    async def history(self) -> list[Event]:
        """The entity's stream so far, oldest first."""
        return await self._host.history()


class _Step:
    """``ctx.step(name)``: a small object rather than a generator-based context manager, because
    ten thousand runs may each be waiting inside one."""

    __slots__ = ("_ctx", "_name")

    def __init__(self, ctx: Context, name: str) -> None:
        self._ctx, self._name = ctx, name

    async def __aenter__(self) -> None:
        ctx = self._ctx
        if ctx.message is None:  # a signal handler's steps are not run steps
            return
        await ctx.step_boundary()
        await ctx._host.record_step(ctx, self._name)
        ctx.current_step = self._name

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        # No stop is checked here: a SIGTERM stops the run before its next step, so a run whose
        # last step has ended returns, and is recorded completed.
        if self._ctx.message is not None:
            self._ctx.current_step = None


# The recorded step an answered ``ctx.ask`` is: its result is the reply's text.
ASK_STEP = "electric:ask"
# The recorded step a ``ctx.take_steer`` is: its result is the message taken, or None.
STEER_STEP = "electric:steer"


def _answer(text: str) -> str:
    return text
