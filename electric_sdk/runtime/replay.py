"""The replay check: new code run against recorded runs, before it ships (Temporal's ``Replayer``).

Each recorded run is replayed as a redelivery of its message would be: the
entity type's ``on_message`` runs with a ``Context`` whose recorded steps are
the run's, so every step recorded there returns its record (steps.py) and
``ctx.patched`` answers as in a real replay (patches.py). The replay stops at
the first step that is not recorded, before it runs: no step function ever
executes. A step asked for where another was recorded is the
``NonDeterministicRun`` a redelivery would raise: it is reported with the
entity, the run (its message's key), the position and both names, and the
check fails.

The code between steps does run, as it does on every redelivery: keep it free
of side effects (put them in steps), as Temporal's Replayer requires
deterministic workflow code. During the check ``ctx.emit`` and
``ctx.output`` are discarded, ``ctx.state`` is the entity's state rebuilt from
the stream it reads, and ``ctx.history()`` is that stream. A run whose code
waits longer than ``run_timeout_s`` between two steps (for an event a signal
handler sets, say) is reported unchecked; signal handlers are not run.

Which runs: by default those in flight (started, not ended) of entities not
stopped or killed, the runs a redelivery would give the new code; with
``all_runs``, every started run. Streams come from a server or an
``electric export`` file (replay_sources.py).
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.lowlevel

from .._proto.electric.v1 import types_pb2 as pb
from ..durable_state import SnapshotPolicy, StateError
from ..errors import InvalidArgument, NonDeterministicRun, StepFailed
from ..lifecycle import STATE_RULES
from ..models import Entity, Event, EventPage

if TYPE_CHECKING:
    from ..client import AsyncClient
from ..state_read import Loaded, load_state
from .app import App
from .context import Context, InputRequired, Message
from .entity_type import EntityType
from .exec.spec import ExecType
from .fenced import message_of
from .state import LeaseState
from .steps import RunSteps

__all__ = [
    "DEFAULT_RUN_TIMEOUT_S",
    "RecordedRun",
    "ReplayProblem",
    "ReplayResult",
    "recorded_runs",
    "replay_streams",
]

# How long the code of one run may wait between two steps before it is reported unchecked.
DEFAULT_RUN_TIMEOUT_S = 10.0
_ENDED = (pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_ABORTED, pb.RUN_STATUS_FAILED, pb.RUN_STATUS_INPUT_REQUIRED)


@dataclass(frozen=True, slots=True)
class ReplayProblem:
    """A run the new code would fail when replaying it.

    ``kind`` ``nondeterministic``: at step ``index`` the run recorded ``recorded`` and the new code
    asks for ``asked`` (a redelivery raises ``NonDeterministicRun``); ``raised``: the new code
    raised ``error`` while replaying the recorded steps (before step ``index``)."""

    entity: str
    run: str
    index: int
    kind: Literal["nondeterministic", "raised"]
    recorded: str = ""
    asked: str = ""
    error: str = ""

    def __str__(self) -> str:
        where = f"{self.entity} run {self.run}"
        if self.kind == "nondeterministic":
            return (
                f"{where}: step {self.index} was recorded as {self.recorded!r}; "
                f"the new code asks for {self.asked!r}"
            )
        return f"{where}: the new code raised {self.error} while replaying (before step {self.index})"


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What the check found: ``problems`` (empty: every run replays) over ``runs`` runs of
    ``entities`` entities; ``unchecked``: runs whose code waited past the bound between steps."""

    entities: int
    runs: int
    problems: tuple[ReplayProblem, ...] = ()
    unchecked: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        entities = f"{self.entities} entit{'y' if self.entities == 1 else 'ies'}"
        head = f"checked {self.runs} run{'' if self.runs == 1 else 's'} of {entities}"
        unchecked = f" ({len(self.unchecked)} unchecked)" if self.unchecked else ""
        if self.ok:
            return f"{head}: all replay{unchecked}"
        return f"{head}: {len(self.problems)} would fail{unchecked}"

    def assert_replays(self) -> None:
        """Raise AssertionError naming every problem (for pytest)."""
        if self.problems:
            raise AssertionError("\n".join([self.summary(), *map(str, self.problems)]))


@dataclass(frozen=True, slots=True)
class RecordedRun:
    """A started run in a stream: its message as the next delivery would bring it."""

    message: Message
    ended: bool
    # The events after the message: the records of its attempts are among them.
    after: list[Event] = field(repr=False)


def recorded_runs(events: Iterable[Event], *, all_runs: bool = False) -> list[RecordedRun]:
    """The started runs of a stream, in the order their messages came (only those not ended,
    unless ``all_runs``)."""
    stream = list(events)
    messages: dict[str, tuple[int, Event]] = {}
    attempts: dict[str, int] = {}
    ended: set[str] = set()
    for position, event in enumerate(stream):
        if event.type == "message":
            messages.setdefault(event.key, (position, event))
        elif event.type == "run":
            run = event.raw.run
            if run.status == pb.RUN_STATUS_STARTED:
                attempts[run.message_key] = max(attempts.get(run.message_key, 0), run.attempt)
            elif run.status in _ENDED:
                ended.add(run.message_key)
    found = []
    for key, (position, event) in messages.items():
        if key not in attempts or (key in ended and not all_runs):
            continue
        # The next delivery's attempt number; an ended run is replayed as if delivered again.
        message = message_of(event.raw, attempts[key] + 1)
        found.append(RecordedRun(message, key in ended, stream[position + 1 :]))
    return found


class _ReplayHost:
    """The part of a host a Context calls (context._Host), for one replayed run: nothing is
    written, and the first step that is not recorded stops the run before it executes."""

    def __init__(
        self, entity: Entity, etype: EntityType, events: list[Event], state: LeaseState | None
    ) -> None:
        self.entity = entity
        self.instance: Any = etype.factory()
        self.codec = etype.codec
        self._events = events
        self._state = state
        self.scope = anyio.CancelScope()
        self.stopped_at: int | None = None
        self.mismatch: dict[str, Any] | None = None

    grace_deadline: datetime | None = None
    stop_requested = False

    async def step_boundary(self, ctx: Context) -> None:
        # Reached by a recorded step about to execute (``current`` is set) or by an unrecorded
        # ``async with ctx.step(name)``, whose body a redelivery runs too.
        if ctx.steps.current is not None:
            self.stopped_at = ctx.steps.index
            self.scope.cancel()
            await anyio.lowlevel.checkpoint()

    async def record_step(self, ctx: Context, name: str) -> None:
        return None

    def declared_timeout(self, step: str, timeout_s: float) -> None:
        return None  # a replay check stops nothing

    def client(self) -> AsyncClient:
        # A replay runs no step that is recorded (ctx.spawn's, ctx.send's): it reaches no server.
        raise RuntimeError("a replay check does not reach the server: a spawn or send outside its record")

    async def emit(self, type: str, data: Any) -> None:
        return None

    async def history(self) -> list[Event]:
        return list(self._events)

    def lease_state(self) -> LeaseState:
        if self._state is None:
            # The rule a worker applies (records.py): a type not seen using ctx.state has none.
            raise StateError(
                "this entity type's code was not seen using ctx.state, so its state was not loaded: "
                "define it with app.entity(..., state=True)"
            )
        return self._state

    async def write_step(self, ctx: Context, data: dict[str, Any]) -> None:
        if data.get("outcome") == "nondeterministic":
            self.mismatch = data


async def _state_of(events: list[Event]) -> Loaded:
    """The entity's state, rebuilt from its stream as a worker rebuilds it at a lease."""
    by_offset = sorted(events, key=lambda e: e.offset)
    head = by_offset[-1].offset + 1 if by_offset else 0

    async def page(from_offset: int, limit: int) -> EventPage:
        chosen = tuple(e for e in by_offset if from_offset <= e.offset < from_offset + limit)
        next_offset = chosen[-1].offset + 1 if chosen else from_offset
        return EventPage(chosen, next_offset, head, False)

    return await load_state(page, head)


async def _replay_run(
    etype: EntityType,
    entity: Entity,
    events: list[Event],
    run: RecordedRun,
    run_timeout_s: float,
    loaded: Loaded | None,
) -> ReplayProblem | str | None:
    """One run replayed: its problem, "unchecked", or None (it replays)."""
    # Each run starts from the entity's state as loaded: what a replay changes is its own.
    state = (
        None
        if loaded is None
        else LeaseState(replace(loaded, state=copy.deepcopy(loaded.state)), SnapshotPolicy())
    )
    host = _ReplayHost(entity, etype, events, state)
    ctx = Context(host, message=run.message)
    ctx.steps = RunSteps.of(run.message.key, run.after)
    raised: BaseException | None = None
    with anyio.move_on_after(run_timeout_s) as bound:
        with host.scope:
            try:
                ctx.steps.bind()
                await etype.on_message(host.instance, ctx, run.message)
            except NonDeterministicRun:
                pass  # host.mismatch holds what it was recorded as
            except StepFailed:
                pass  # a failure replayed from its record: the old code met it too
            except InputRequired:
                pass  # it reached its ctx.ask, where its record ends (input_required)
            except Exception as exc:
                raised = exc
    ctx.close()
    ref = entity.ref.url.lstrip("/")
    if host.mismatch is not None:
        data = host.mismatch
        return ReplayProblem(
            ref,
            run.message.key,
            int(data["index"]),
            "nondeterministic",
            str(data["expected"]),
            str(data["name"]),
        )
    if raised is not None:
        error = f"{type(raised).__name__}: {raised}"
        return ReplayProblem(ref, run.message.key, ctx.steps.index, "raised", error=error)
    if bound.cancelled_caught and host.stopped_at is None:
        return "unchecked"
    return None


async def replay_streams(
    app: App,
    streams: AsyncIterable[tuple[Entity, list[Event]]],
    *,
    types: Iterable[str] | None = None,
    all_runs: bool = False,
    run_timeout_s: float = DEFAULT_RUN_TIMEOUT_S,
) -> ReplayResult:
    """Replay the recorded runs of ``streams`` (each an entity and its events) with ``app``'s
    code; entities of types the app does not define (or not in ``types``) are skipped."""
    hosted = checked_types(app, types)
    entities = runs = 0
    problems: list[ReplayProblem] = []
    unchecked: list[str] = []
    async for entity, events in streams:
        etype = hosted.get(entity.ref.type)
        if etype is None or (STATE_RULES[entity.state].terminal and not all_runs):
            continue
        found = recorded_runs(events, all_runs=all_runs)
        if not found:
            continue
        entities += 1
        loaded = await _state_of(events) if etype.uses_state else None
        for run in found:
            runs += 1
            verdict = await _replay_run(etype, entity, events, run, run_timeout_s, loaded)
            if isinstance(verdict, ReplayProblem):
                problems.append(verdict)
            elif verdict == "unchecked":
                unchecked.append(f"{entity.ref.url.lstrip('/')} run {run.message.key}")
    return ReplayResult(entities, runs, tuple(problems), tuple(unchecked))


def checked_types(app: App, types: Iterable[str] | None) -> dict[str, EntityType]:
    """The app's entity types to check, by name (exec types run no code of the app's: none)."""
    hosted = {name: t for name, t in app.types.items() if not isinstance(t, ExecType)}
    if types is None:
        return hosted
    wanted = list(types)
    unknown = [name for name in wanted if name not in hosted]
    if unknown:
        raise InvalidArgument(
            f"the app defines no entity type {', '.join(map(repr, unknown))} (it defines "
            f"{', '.join(hosted) or 'none'})",
            code="USAGE",
        )
    return {name: hosted[name] for name in wanted}
