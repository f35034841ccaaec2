"""Recorded steps: ``await ctx.step(name, fn, *args, retry=..., timeout=...)``.

A recorded step's outcome is one ``electric.step`` event in the entity's
stream, written as a fenced runtime write together with the state changes its
run made since the previous step (``durable_state``)::

    {"run": message key, "attempt": n, "index": i, "name": ..., "outcome": ok | error,
     "try": k, "result": JSON | "error": {"type", "message"}, "ops": [...], "snap": S}

Each failed try that will be retried is recorded too (``outcome: retry``), so
the count of tries survives a crash. A run delivered again (attempt >= 2 of
the same message) replays: the step at position ``i`` returns the recorded
result (or raises the recorded error as ``StepFailed``) without running, as
long as it has the recorded name; another name there is ``NonDeterministicRun``,
recorded (``outcome: nondeterministic``) and raised. A step cut short (SIGINT,
SIGKILL, a crash) has no outcome record: it runs again. A plain (not
``async``) function runs in a worker thread: a SIGINT aborts its run at once
and the thread is abandoned, running on to its end unobserved. Since steps are
matched by position, a run's steps run one at a time: a step called from
inside another is part of it (as in DBOS), one called beside it from another
task of the run is refused. ``ctx.patched(id)`` (patches.py) lets new code take
a run recorded on older code: its markers (``outcome: patched``) are read here
with the steps, and answered there.
"""

from __future__ import annotations

import contextvars
import functools
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

from .._wire.json_values import nests_too_deep
from ..client._options import DurationLike
from ..durable_state import MAX_VALUE_DEPTH, STATE_EVENT, STEP_EVENT
from ..durations import parse_ms
from ..errors import InvalidStepResult, NonDeterministicRun, StepFailed, StepTimeout
from ..models import Event

if TYPE_CHECKING:
    from .patches import RunPatches

__all__ = [
    "FINAL_OUTCOMES",
    "MAX_RESULT_BYTES",
    "PATCHED",
    "Retry",
    "RunSteps",
    "StepRecorder",
    "in_step",
    "run_step",
    "seconds",
]

# A step's result, as JSON, is at most this many bytes: a step event must stay far below the
# transport's message bound (4 MiB), and a replay reads every result of its run.
MAX_RESULT_BYTES = 256 * 1024
# A step's outcomes; ``retry`` and ``nondeterministic`` records are not outcomes.
FINAL_OUTCOMES = ("ok", "error")
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
_NONE: Mapping[int, Any] = MappingProxyType({})


class RunSteps:
    """One run's recorded steps: what earlier attempts of its message recorded, and where this
    attempt is (``index``: the position of the next recorded step)."""

    __slots__ = ("committed_segments", "current", "final", "index", "markers", "names", "patches", "tries")

    def __init__(self, records: Sequence[tuple[str, dict[str, Any]]] = ()) -> None:
        self.index = 0
        # The recorded step running now: steps are matched by position, so they run one at a time.
        self.current: str | None = None
        # Every run has one and most have no records: they share empty tables then.
        self.final: Mapping[int, dict[str, Any]] = _NONE
        self.names: Mapping[int, str] = _NONE
        self.tries: Mapping[int, int] = _NONE
        # Segments whose state changes are in the stream already (a replay does not make them again).
        self.committed_segments: AbstractSet[int] = frozenset()
        # The patch markers earlier attempts recorded, and this attempt's answers (patches.py
        # makes them at the run's first ``ctx.patched``: most runs never ask).
        self.markers: Sequence[dict[str, Any]] = ()
        self.patches: RunPatches | None = None
        if records:
            self._read(records)

    def _read(self, records: Sequence[tuple[str, dict[str, Any]]]) -> None:
        final: dict[int, dict[str, Any]] = {}
        names: dict[int, str] = {}
        tries: dict[int, int] = {}
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
            outcome = data.get("outcome")
            if outcome in FINAL_OUTCOMES:
                final[index] = data
                committed.add(index)
            if outcome in (*FINAL_OUTCOMES, "retry"):
                names[index] = str(data["name"])
                tries[index] = max(tries.get(index, 0), int(data.get("try", 1)))
        self.final, self.names, self.tries, self.committed_segments = final, names, tries, committed
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

    @property
    def replaying(self) -> bool:
        """Whether the run's state changes here were recorded by an earlier attempt."""
        return self.index in self.committed_segments


def in_step(steps: RunSteps) -> bool:
    """Whether the calling task runs inside one of the run's recorded steps (its code runs once,
    and its result is what a replay sees)."""
    return _inside.get() is steps


class StepRecorder(Protocol):
    """What a step needs from its run (the Context implements it)."""

    @property
    def steps(self) -> RunSteps: ...
    @property
    def message_key(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    async def step_boundary(self) -> None: ...
    async def record_step(self, data: dict[str, Any]) -> None: ...


def _result_json(name: str, result: Any) -> Any:
    try:
        text = json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidStepResult(f"step {name!r}: its result must be JSON: {exc}") from None
    if len(text.encode()) > MAX_RESULT_BYTES:
        raise InvalidStepResult(
            f"step {name!r}: its result is {len(text.encode())} bytes as JSON; at most {MAX_RESULT_BYTES}"
        )
    copied = json.loads(text)
    if nests_too_deep(copied, MAX_VALUE_DEPTH):
        raise InvalidStepResult(f"step {name!r}: its result nests more than {MAX_VALUE_DEPTH} deep")
    return copied


def _failed(name: str, error: dict[str, Any], tries: int) -> StepFailed:
    cls = StepTimeout if error.get("type") == StepTimeout.__name__ else StepFailed
    text = f"step {name!r} failed after {tries} tr{'y' if tries == 1 else 'ies'}: {error['type']}: {error['message']}"
    return cls(text, step=name, error_type=str(error["type"]), attempts=tries)


async def _try(
    name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], timeout_s: float | None
) -> Any:
    """One try: ``fn``'s JSON result, within ``timeout_s`` (StepTimeout past it; a TimeoutError the
    step raises itself stays what it is)."""
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
        return _result_json(name, result)
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
) -> Any:
    steps = run.steps
    if _inside.get() is steps:
        # Called from inside a recorded step (its task or one it started): part of that step, as a
        # DBOS step called from a step is; its result is recorded with the outer step's, if at all.
        return await _try(name, fn, args, kwargs, seconds(timeout) if timeout is not None else None)
    if steps.current is not None:
        raise RuntimeError(
            f"recorded step {name!r} called while {steps.current!r} runs in another task: a run's "
            "recorded steps are matched by position, so they run one at a time"
        )
    index = steps.index
    recorded_name = steps.names.get(index)
    base = {"run": run.message_key, "attempt": run.attempt, "index": index, "name": name}
    if recorded_name is not None and recorded_name != name:
        await run.record_step({**base, "outcome": "nondeterministic", "expected": recorded_name})
        raise NonDeterministicRun(
            f"step {index} of this run was recorded as {recorded_name!r}, and the code now asks for "
            f"{name!r}: the run's code path changed since its first attempt"
        )
    if (final := steps.final.get(index)) is not None:
        steps.index += 1
        if final["outcome"] == "ok":
            return final.get("result")
        raise _failed(name, final["error"], int(final.get("try", 1)))
    steps.current, token = name, _inside.set(steps)
    try:
        return await _tries(run, steps, base, fn, args, kwargs, retry or NO_RETRY, timeout)
    finally:
        steps.current = None
        _inside.reset(token)


async def _tries(
    run: StepRecorder,
    steps: RunSteps,
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
    failed_tries = steps.tries.get(int(base["index"]), 0)
    await run.step_boundary()
    while True:
        attempt_no = failed_tries + 1
        try:
            result = await _try(name, fn, args, kwargs, timeout_s)
        except InvalidStepResult as exc:
            error = {"type": type(exc).__name__, "message": str(exc)}
            await _record_final(run, steps, {**base, "outcome": "error", "try": attempt_no, "error": error})
            raise
        except Exception as exc:
            error = {"type": type(exc).__name__, "message": str(exc)}
            if policy.retries(exc, attempt_no):
                await run.record_step({**base, "outcome": "retry", "try": attempt_no, "error": error})
                failed_tries = attempt_no
                await anyio.sleep(policy.delay_s(attempt_no))
                await run.step_boundary()
                continue
            await _record_final(run, steps, {**base, "outcome": "error", "try": attempt_no, "error": error})
            raise _failed(name, error, attempt_no) from exc
        await _record_final(run, steps, {**base, "outcome": "ok", "try": attempt_no, "result": result})
        return result


async def _record_final(run: StepRecorder, steps: RunSteps, data: dict[str, Any]) -> None:
    await run.record_step(data)
    steps.index += 1
