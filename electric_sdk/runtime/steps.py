"""Recorded steps: ``await ctx.step(name, fn, *args, retry=..., timeout=..., key=...)``.

A recorded step's outcome is one ``electric.step`` event in the entity's
stream, written as a fenced runtime write together with the state changes its
run made since the previous step (``durable_state``)::

    {"run": message key, "attempt": n, "index": i, "name": ..., "outcome": ok | error,
     "try": k, "result": JSON, "type": tag | "error": {"type", "message"}, "ops": [...], "snap": S}

(``key``: a parallel step's identity in its group, below; ``type``: the
codec's tag for a result that is not plain JSON, codec.py.) Each failed try
that will be retried is recorded too (``outcome: retry``), so the count of
tries survives a crash. A run delivered again (attempt >= 2 of the same
message) replays: the step at position ``i`` returns the recorded result (or
raises the recorded error as ``StepFailed``) without running, as long as it
has the recorded name; another name there is ``NonDeterministicRun``, recorded
(``outcome: nondeterministic``) and raised. A step cut short (SIGINT, SIGKILL,
a crash) has no outcome record: it runs again. A plain (not ``async``)
function runs in a worker thread: a SIGINT aborts its run at once and the
thread is abandoned, running on to its end unobserved. A step called from
inside another is part of it (as in DBOS). ``ctx.patched(id)`` (patches.py)
lets new code take a run recorded on older code: its markers (``outcome:
patched``) are read here with the steps, and answered there.

Parallel steps. The run's own task (running ``on_message``) takes positions
one step at a time. A step called from a task the run started is a parallel
step: those between two positions of the run's own task form a group holding
one position ``g``, each known in it by ``key`` (its place in ``ctx.gather``,
its ``key=``, else its name), so ``(g, key)`` does not depend on which task
reaches ``ctx.step`` first. Two of one group with the same key are refused,
naming both. Each has its own tries and outcome. The run's own task taking a
position (a step, ``ctx.patched``, a state change) ends the group, refused
while some are in flight. A parallel step's ``ctx.state`` changes are held
and applied with its record, so the state follows the records' order (the
order of a replay and a rebuild); one from a task the run started, outside a
step, is refused. ``ctx.step_key``: a step's identity as an idempotency key.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import inspect
import json
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.to_thread

from ..client._options import DurationLike
from ..durable_state import STATE_EVENT, STEP_EVENT, Op, StateError
from ..durations import parse_ms
from ..errors import InvalidStepResult, NonDeterministicRun, StepFailed, StepTimeout
from ..models import Event
from .codec import MAX_RESULT_BYTES, decode_result, encode_result

if TYPE_CHECKING:
    from ..models import EntityRef
    from .codec import Codec
    from .patches import RunPatches

__all__ = [
    "FINAL_OUTCOMES",
    "MAX_KEY_CHARS",
    "MAX_RESULT_BYTES",
    "PATCHED",
    "Member",
    "Retry",
    "RunSteps",
    "StepRecorder",
    "current_member",
    "current_step_key",
    "gather_steps",
    "in_step",
    "run_step",
    "seconds",
]

# A step's outcomes; ``retry`` and ``nondeterministic`` records are not outcomes.
FINAL_OUTCOMES = ("ok", "error")
# A parallel step's key is a name in the code and in the records: short, like a step's name.
MAX_KEY_CHARS = 128
# A patch marker's outcome: ``ctx.patched(id)`` answered True before the step at its index.
PATCHED = "patched"


def seconds(value: DurationLike) -> float:
    if isinstance(value, str):
        return parse_ms(value) / 1000
    if isinstance(value, (int, float)):
        return float(value)
    return value.total_seconds()


@dataclass(frozen=True, slots=True)
class Retry:
    """A step's retry policy: ``attempts`` tries in all; before try n+1 the step waits ``backoff``
    times ``multiplier`` ** (n - 1), at most ``max_backoff``, each wait spread by +-``jitter`` (a
    fraction) so that many entities retrying together do not retry in step; only exceptions of
    the ``on`` types are retried."""

    attempts: int = 3
    backoff: DurationLike = "100ms"
    multiplier: float = 2.0
    max_backoff: DurationLike = "30s"
    jitter: float = 0.2
    on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("Retry.attempts must be >= 1")
        if not 0 <= self.jitter <= 1 or self.multiplier < 1:
            raise ValueError("Retry.jitter must be within 0..1 and Retry.multiplier >= 1")
        for duration in (self.backoff, self.max_backoff):
            seconds(duration)  # a bad duration fails here, not mid-run

    def retries(self, exc: BaseException, failed_tries: int) -> bool:
        return failed_tries < self.attempts and isinstance(exc, self.on)

    def delay_s(self, failed_tries: int) -> float:
        base = min(seconds(self.backoff) * self.multiplier ** (failed_tries - 1), seconds(self.max_backoff))
        return max(0.0, base * (1 + random.uniform(-self.jitter, self.jitter)))


NO_RETRY = Retry(attempts=1)
# The run whose recorded step the current task is running (tasks it starts inherit it).
_inside: contextvars.ContextVar[RunSteps | None] = contextvars.ContextVar("electric_step", default=None)
# The parallel step the current task runs: its ctx.state changes are held until its record.
_member: contextvars.ContextVar[Member | None] = contextvars.ContextVar("electric_member", default=None)
# The place of the current task in a ``ctx.gather`` call: its steps are known by it.
_place: contextvars.ContextVar[int | None] = contextvars.ContextVar("electric_place", default=None)
# ``ctx.step_key`` of the step the current task runs.
_step_key: contextvars.ContextVar[tuple[StepRecorder, Slot] | None] = contextvars.ContextVar(
    "electric_step_key", default=None
)
_NONE: Mapping[Any, Any] = MappingProxyType({})
# A step's identity in its run's records: (position, key); key None for a step of the run's own task.
Slot = tuple[int, str | None]


class Member:
    """A parallel step in flight, with the ctx.state changes its code made (written with its
    record, and applied to the live state then)."""

    __slots__ = ("key", "name", "ops", "size", "steps")

    def __init__(self, steps: RunSteps, name: str, key: str) -> None:
        self.steps, self.name, self.key = steps, name, key
        self.ops: list[Op] = []
        self.size = 0


class RunSteps:
    """One run's recorded steps: what earlier attempts of its message recorded, and where this
    attempt is (``index``: the position of the next step of the run's own task, or of the open
    group of parallel steps)."""

    __slots__ = (
        "body",
        "body_step",
        "committed_segments",
        "final",
        "group",
        "groups",
        "index",
        "markers",
        "names",
        "patches",
        "positions",
        "running",
        "tries",
    )  # fmt: skip

    def __init__(self, records: Sequence[tuple[str, dict[str, Any]]] = ()) -> None:
        self.index = 0
        # The task running on_message (None: every caller counts as it, as in a signal handler).
        self.body: int | None = None
        # The step of the run's own task running now; the open group's keys, and those in flight.
        self.body_step: str | None = None
        self.group: dict[str, str] = {}
        self.running: dict[str, str] = {}
        # Every run has one and most have no records: they share empty tables then.
        self.final: Mapping[Slot, dict[str, Any]] = _NONE
        self.names: Mapping[Slot, str] = _NONE
        self.tries: Mapping[Slot, int] = _NONE
        self.positions: AbstractSet[int] = frozenset()
        self.groups: Mapping[int, str] = _NONE
        # Segments whose state changes are in the stream already (a replay does not make them again).
        self.committed_segments: AbstractSet[int] = frozenset()
        # The patch markers earlier attempts recorded, and this attempt's answers (patches.py
        # makes them at the run's first ``ctx.patched``: most runs never ask).
        self.markers: Sequence[dict[str, Any]] = ()
        self.patches: RunPatches | None = None
        if records:
            self._read(records)

    def _read(self, records: Sequence[tuple[str, dict[str, Any]]]) -> None:
        final: dict[Slot, dict[str, Any]] = {}
        names: dict[Slot, str] = {}
        tries: dict[Slot, int] = {}
        committed: set[int] = set()
        markers: list[dict[str, Any]] = []
        for kind, data in records:
            if kind == STATE_EVENT:
                committed.add(int(data.get("seg", -1)))
                continue
            if data.get("outcome") == PATCHED:
                markers.append(data)
                continue
            index = int(data["index"])
            key = data.get("key")
            slot = (index, None if key is None else str(key))
            outcome = data.get("outcome")
            if outcome in FINAL_OUTCOMES:
                final[slot] = data
                # The first outcome at a position carried the run's changes made before it.
                committed.add(index)
            if outcome in (*FINAL_OUTCOMES, "retry"):
                names[slot] = str(data["name"])
                tries[slot] = max(tries.get(slot, 0), int(data.get("try", 1)))
        self.final, self.names, self.tries, self.committed_segments = final, names, tries, committed
        self.positions = {index for index, _ in names}
        groups: dict[int, list[str]] = {}
        for (index, key), name in names.items():
            if key is not None:
                groups.setdefault(index, []).append(name)
        self.groups = {index: f"parallel steps {_listed(found)}" for index, found in groups.items()}
        self.markers = markers

    @classmethod
    def of(cls, message_key: str, events: Sequence[Event]) -> RunSteps:
        """From the events after a message: the records of its earlier attempts."""
        return cls(cls.records(message_key, events))

    @staticmethod
    def records(message_key: str, events: Sequence[Event]) -> list[tuple[str, dict[str, Any]]]:
        """The step and state records of run ``message_key`` among ``events``, in stream order."""
        records: list[tuple[str, dict[str, Any]]] = []
        for event in events:
            data = event.value.get("data")
            if (
                event.type in (STEP_EVENT, STATE_EVENT)
                and isinstance(data, dict)
                and data.get("run") == message_key
            ):
                records.append((event.type, data))
        return records

    def bind(self) -> None:
        """The calling task runs the run's body (``on_message``): steps from other tasks are parallel."""
        self.body = anyio.get_current_task().id

    @property
    def current(self) -> str | None:
        """A recorded step running now (None: none is)."""
        return self.body_step or next(iter(self.running.values()), None)

    @property
    def replaying(self) -> bool:
        """Whether the run's state changes here were recorded by an earlier attempt."""
        return self.index in self.committed_segments

    def recorded_at(self, position: int) -> bool:
        """Whether an earlier attempt recorded a step (or a group) at ``position``."""
        return position in self.positions

    def in_body(self) -> bool:
        return self.body is None or anyio.get_current_task().id == self.body

    def settle(self, what: str) -> None:
        """The run's own task takes a position: the open group of parallel steps ends (it is
        refused while some of them are in flight: where they end would depend on timing)."""
        if not self.group:
            return
        if self.running:
            raise RuntimeError(
                f"{what} while parallel steps {_listed(self.running.values())} run in other tasks: "
                "await them first (asyncio.gather, a task group), so every attempt of the run "
                "orders its steps the same way"
            )
        # A recorded member of this group that this attempt never called: the code path changed
        # (a parallel step renamed or dropped). Told only now, when the group is known whole; a
        # member this attempt added ran already (nothing recorded says which ones were started).
        recorded = {key for index, key in self.names if index == self.index and key is not None}
        if missing := recorded - self.group.keys():
            raise NonDeterministicRun(
                f"parallel step{'s' if len(missing) > 1 else ''} "
                f"{_listed(self.names[(self.index, k)] for k in missing)} recorded at position "
                f"{self.index} of this run {'were' if len(missing) > 1 else 'was'} not called by this "
                f"attempt, whose steps there were {_listed(self.group.values())}: the run's code path "
                "changed since its first attempt"
            )
        self.group = {}
        self.index += 1

    def lane(self) -> Member | None:
        """Whose ctx.state change this is: a parallel step's (held until its record), or None for
        the run's own (written with its next record)."""
        member = _member.get()
        if member is not None and member.steps is self:
            return member
        if _inside.get() is self:
            return None
        if self.in_body():
            self.settle("ctx.state changed")
            return None
        raise StateError(
            "ctx.state changed from a task the run started, outside a recorded step: it would "
            "belong to no step's record; change it inside the step, or in the run's own task"
        )

    def _described(self, slot: Slot) -> str | None:
        """What an earlier attempt recorded at ``slot``'s position, if it is not ``slot``'s kind."""
        index, key = slot
        if key is None:
            return self.groups.get(index)
        return self.names.get((index, None))


def _listed(names: Any) -> str:
    return ", ".join(repr(n) for n in sorted(names))


async def gather_steps(steps: RunSteps, aws: Sequence[Awaitable[Any]]) -> list[Any]:
    """``ctx.gather``: ``aws`` side by side, in a group of their own, each task's steps known by
    its place in the call (and their names); the first failure cancels the others and is raised."""
    if not steps.in_body() or _inside.get() is steps:
        raise RuntimeError("ctx.gather is called from the run's own task, between its steps")
    steps.settle("ctx.gather called")
    results: list[Any] = [None] * len(aws)
    failed: list[BaseException] = []

    async def one(place: int, aw: Awaitable[Any], scope: anyio.CancelScope) -> None:
        _place.set(place)  # this task's own context: its steps see it
        try:
            results[place] = await aw
        except Exception as exc:
            failed.append(exc)
            scope.cancel()

    async with anyio.create_task_group() as tg:
        for place, aw in enumerate(aws):
            tg.start_soon(one, place, aw, tg.cancel_scope)
    if failed:
        raise failed[0]
    steps.settle("ctx.gather returned")
    return results


def in_step(steps: RunSteps) -> bool:
    """Whether the calling task runs inside one of the run's recorded steps (its code runs once,
    and its result is what a replay sees)."""
    return _inside.get() is steps


def current_member(steps: RunSteps) -> Member | None:
    """The parallel step of ``steps`` the calling task runs, if any."""
    member = _member.get()
    return member if member is not None and member.steps is steps else None


def current_step_key() -> str | None:
    """``ctx.step_key``: the key of the recorded step the calling task runs (None: outside one)."""
    running = _step_key.get()
    if running is None:
        return None
    run, slot = running
    # A digest, made when asked: message keys and step keys are free text, and a joined string
    # could collide.
    identity = json.dumps([run.ref.url, run.message_key, slot[0], slot[1]])
    return "step-" + hashlib.sha256(identity.encode()).hexdigest()[:40]


class StepRecorder(Protocol):
    """What a step needs from its run (the Context implements it)."""

    @property
    def steps(self) -> RunSteps: ...
    @property
    def message_key(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def ref(self) -> EntityRef: ...
    @property
    def codec(self) -> Codec: ...
    async def step_boundary(self) -> None: ...
    async def record_step(self, data: dict[str, Any]) -> None: ...


def _failed(name: str, error: dict[str, Any], tries: int) -> StepFailed:
    cls = StepTimeout if error.get("type") == StepTimeout.__name__ else StepFailed
    text = f"step {name!r} failed after {tries} tr{'y' if tries == 1 else 'ies'}: {error['type']}: {error['message']}"
    return cls(text, step=name, error_type=str(error["type"]), attempts=tries)


async def _try(
    codec: Codec,
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    timeout_s: float | None,
) -> tuple[Any, str | None]:
    """One try: ``fn``'s encoded result, within ``timeout_s`` (StepTimeout past it; a TimeoutError
    the step raises itself stays what it is)."""
    with anyio.move_on_after(timeout_s):
        if inspect.iscoroutinefunction(fn):
            result = await fn(*args, **kwargs)
        else:
            # A plain function may block (a CPU loop, a blocking HTTP call): it runs in a worker
            # thread, so the event loop keeps serving signals; on SIGINT, SIGKILL or its timeout
            # the thread is abandoned and its late result discarded.
            call = functools.partial(fn, *args, **kwargs)
            result = await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
            if inspect.isawaitable(result):  # a plain function that returned a coroutine
                result = await result
        return encode_result(codec, name, result)
    assert timeout_s is not None  # reached only when the timeout cancelled the try
    raise StepTimeout(
        f"step {name!r} ran past its timeout ({timeout_s * 1000:.0f} ms)",
        step=name,
        error_type=StepTimeout.__name__,
        attempts=1,
    )


async def run_step(
    run: StepRecorder,
    name: str,
    fn: Callable[..., Awaitable[Any] | Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    retry: Retry | None,
    timeout: DurationLike | None,  # noqa: ASYNC109 - the step's own bound, recorded as its error
    key: str | None = None,
) -> Any:
    steps = run.steps
    if key is not None and not (isinstance(key, str) and 1 <= len(key) <= MAX_KEY_CHARS):
        raise ValueError(f"a step's key is a text of 1 to {MAX_KEY_CHARS} characters, got {key!r:.80}")
    if _inside.get() is steps:
        # Called from inside a recorded step (its task or one it started): part of that step, as a
        # DBOS step called from a step is; its result is recorded with the outer step's, if at all.
        value, tag = await _try(
            run.codec, name, fn, args, kwargs, seconds(timeout) if timeout is not None else None
        )
        return decode_result(run.codec, name, {"result": value, "type": tag}, "inside another step")
    if steps.in_body():
        steps.settle(f"recorded step {name!r} called")
        if steps.body_step is not None:
            raise RuntimeError(
                f"recorded step {name!r} called while {steps.body_step!r} runs in another task: "
                "this context's steps are matched by position, so they run one at a time"
            )
        slot: Slot = (steps.index, None)
    else:
        slot = _join_group(steps, name, key)
    base: dict[str, Any] = {"run": run.message_key, "attempt": run.attempt, "index": slot[0], "name": name}
    if slot[1] is not None:
        base["key"] = slot[1]
    recorded_name = steps.names.get(slot) or steps._described(slot)
    if recorded_name is not None and recorded_name != name:
        await run.record_step({**base, "outcome": "nondeterministic", "expected": recorded_name})
        what = f"step {slot[0]}" + (f" (parallel, key {slot[1]!r})" if slot[1] is not None else "")
        raise NonDeterministicRun(
            f"{what} of this run was recorded as {recorded_name!r}, and the code now asks for "
            f"{name!r}: the run's code path changed since its first attempt"
        )
    if (final := steps.final.get(slot)) is not None:
        if slot[1] is None:
            steps.index += 1
        if final["outcome"] == "ok":
            return decode_result(run.codec, name, final, f"position {slot[0]} of run {run.message_key}")
        raise _failed(name, final["error"], int(final.get("try", 1)))
    member: Member | None = None
    if slot[1] is None:
        steps.body_step = name
    else:
        member = Member(steps, name, slot[1])
        steps.running[slot[1]] = name
    tokens = (_inside.set(steps), _member.set(member), _step_key.set((run, slot)))
    try:
        return await _tries(run, steps, slot, base, fn, args, kwargs, retry or NO_RETRY, timeout)
    finally:
        if slot[1] is None:
            steps.body_step = None
        else:
            steps.running.pop(slot[1], None)
        _step_key.reset(tokens[2])
        _member.reset(tokens[1])
        _inside.reset(tokens[0])


def _join_group(steps: RunSteps, name: str, key: str | None) -> Slot:
    """A parallel step's slot in the open group (opened by the first): refused beside a step of
    the run's own task, or beside a step of the group it cannot be told apart from."""
    if steps.body_step is not None:
        raise RuntimeError(
            f"recorded step {name!r} called from another task while {steps.body_step!r} runs in "
            "the run's own task: start parallel steps together (asyncio.gather, a task group) "
            "between the run's own steps"
        )
    place = _place.get()
    member_key = key if key is not None else name if place is None else f"{place}:{name}"
    if (earlier := steps.group.get(member_key)) is not None:
        same = f"named {name!r}" if key is None else f"with key {key!r} ({earlier!r} and {name!r})"
        # A finished one means two batches: every parallel step since the run's own task last
        # took a position is one group (nothing tells when the run's task started the second).
        batches = (
            ""
            if member_key in steps.running
            else " (the first has ended: parallel steps started one batch after another, such as "
            "two asyncio.gather calls in a row, are one group until the run's own task takes a "
            "position)"
        )
        raise RuntimeError(
            f"two parallel steps {same} at position {steps.index} of this run cannot be told "
            f"apart{batches}, so a replay could not answer each from its own record: give each its "
            "own key (ctx.step(name, fn, ..., key=...)), or start them with ctx.gather(...), which "
            "knows each by its place and makes each call a group of its own"
        )
    steps.group[member_key] = name
    return steps.index, member_key


async def _tries(
    run: StepRecorder,
    steps: RunSteps,
    slot: Slot,
    base: dict[str, Any],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    policy: Retry,
    timeout: DurationLike | None,  # noqa: ASYNC109 - the step's own bound, recorded as its error
) -> Any:
    """Run the step until it succeeds or its policy gives up, recording each try's failure."""
    name = str(base["name"])
    timeout_s = seconds(timeout) if timeout is not None else None
    failed_tries = steps.tries.get(slot, 0)
    await run.step_boundary()
    while True:
        attempt_no = failed_tries + 1
        try:
            value, tag = await _try(run.codec, name, fn, args, kwargs, timeout_s)
            data = {**base, "outcome": "ok", "try": attempt_no, "result": value}
            if tag is not None:
                data["type"] = tag
            result = decode_result(run.codec, name, data, "as just encoded")  # what a replay returns
        except InvalidStepResult as exc:
            error = {"type": type(exc).__name__, "message": str(exc)}
            await _record_final(
                run, steps, slot, {**base, "outcome": "error", "try": attempt_no, "error": error}
            )
            raise
        except Exception as exc:
            error = {"type": type(exc).__name__, "message": str(exc)}
            if policy.retries(exc, attempt_no):
                await run.record_step({**base, "outcome": "retry", "try": attempt_no, "error": error})
                failed_tries = attempt_no
                await anyio.sleep(policy.delay_s(attempt_no))
                await run.step_boundary()
                continue
            await _record_final(
                run, steps, slot, {**base, "outcome": "error", "try": attempt_no, "error": error}
            )
            raise _failed(name, error, attempt_no) from exc
        await _record_final(run, steps, slot, data)
        return result


async def _record_final(run: StepRecorder, steps: RunSteps, slot: Slot, data: dict[str, Any]) -> None:
    await run.record_step(data)
    if slot[1] is None:
        steps.index += 1
