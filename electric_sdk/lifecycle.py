"""The entity lifecycle: the RFC's signal table and every rule about states.

Two rules, as in h11's ``_state.py``:

1. Every rule about states and signals lives in this module: what a state
   allows, what a signal does in it, what a runtime records. The server, the
   runtime, the CLI and the widgets ask it; nobody re-encodes a rule (a test
   fails on a group of states tested anywhere else).
2. This module does no I/O. It answers from facts it is given: the entity's
   state, the signal, and whether a run is in progress (``None`` when the
   caller cannot know, as the server cannot).

Signal-driven transitions follow the RFC's table cell for cell (ARCHITECTURE
§2: where the RFC's diagram and table differ, the table wins). The other
transitions (spawning → running, running ⇄ idle, stopping → stopped) are
written by the runtime or the server's reaper and are listed in
``RUNTIME_TRANSITIONS``. What each state allows besides (whether it takes
messages, starts runs, needs a runtime, how a runtime takes it up) is
``STATE_RULES``; the outcome a runtime records for what it did about a signal
is ``RUNTIME_OUTCOMES``; what a runtime may still append after the end is
``CLOSING_RECORDS``; the profile's default durations and the signals a
handler may see are here too, and so are the stop stages a signal's answer may
wait for (``STAGES``). The docs are generated from these tables, never
retyped (``scripts/gendocs.py`` renders them). The names the tables use
(signals, timings, stages, actions, outcomes, effects, records) are defined in
``lifecycle_names`` and re-exported here; they hold no rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from electric_sdk.lifecycle_names import (
    POSIX_SIGNAL_NUMBERS,
    Action,
    Effect,
    IdentityEnum,
    MessageProgress,
    Outcome,
    Record,
    Signal,
    Stage,
    Timing,
)

# fmt: off
__all__ = [
    # the tables and the constants
    "CLOSING_RECORDS", "DEFAULT_GRACE_MS", "DEFAULT_IDLE_TIMEOUT_MS", "HANDLEABLE", "HOSTED_STATES",
    "INITIAL_STATE", "MESSAGE_SCOPED_SIGNALS", "OPT_IN_TIMING", "PAYLOAD_SIGNALS", "POSIX_SIGNAL_NUMBERS",
    "RELOAD_SIGNALS", "RUNTIME_OUTCOMES", "RUNTIME_TRANSITIONS", "SERVER_ABORTED_SIGNALS",
    "SIGNAL_TIMING", "STAGES", "STATE_RULES", "TABLE", "TERMINAL_STATES",
    # the vocabulary, the table's cells and answers, the errors
    "Action", "Cell", "Decision", "Effect", "InvalidTransition", "LifecycleError", "MessageProgress",
    "Outcome", "Record", "Signal", "SignalRejected", "Stage", "StageUnavailable", "State", "StateRules", "Timing",
    # the questions
    "accepts_record", "cell", "check_runtime_transition", "check_stage", "decide", "decide_waiting",
    "needs_runtime", "possible_signals", "runtime_outcome", "runtime_target", "stages_of", "valid_signals",
]
# fmt: on

# An entity's profile when neither the spawn request nor its type names one; fixed at its first
# lease (ARCHITECTURE §1, amended: not at spawn).
DEFAULT_GRACE_MS = 30_000
DEFAULT_IDLE_TIMEOUT_MS = 60_000


# The signals entity code may register ``on_signal`` for: every one but the two the
# runtime enforces unconditionally (ARCHITECTURE §3).
HANDLEABLE = frozenset(Signal) - {Signal.SIGKILL, Signal.SIGSTOP}
# The one signal that carries a payload for its handler (the RFC's "user-provided payload").
PAYLOAD_SIGNALS = frozenset({Signal.SIGUSR})
# The one signal a caller may scope to a message it sent: `electric run` interrupts only its
# own message's run (ARCHITECTURE §5), and a message not yet started is cancelled instead
# (``decide(..., message=...)``).
MESSAGE_SCOPED_SIGNALS = frozenset({Signal.SIGINT})
# The signals the server judges against a run it knows is in progress: one its live runtime
# started and let the server abort (a Python host's run; an exec host's SIGINT goes to its
# process). SIGINT then aborts that run in its own commit, outcome `aborted` at once, as a
# cancel that the status shows at once (DBOS's, Temporal's); the runtime cancels the run when the
# SIGINT reaches it and records the run ABORTED with its partial output. With any doubt (no live
# runtime, an older worker) the runtime judges, as for every other signal.
SERVER_ABORTED_SIGNALS = frozenset({Signal.SIGINT})
# The signal that marks the entity for new code: whatever its state, the next wake is leased
# to a worker of the version selected for its type's new wakes (server runtime/versions.py).
RELOAD_SIGNALS = frozenset({Signal.SIGHUP})


# The RFC: SIGINT, SIGKILL and SIGUSR act as soon as they land, even mid-run; the others are
# checked between model calls, tool calls and messages (SIGTERM's stop at the next step, the
# rest once the run is over).
SIGNAL_TIMING: dict[Signal, Timing] = {
    Signal.SIGINT: Timing.AT_ONCE,
    Signal.SIGHUP: Timing.AFTER_RUN,
    Signal.SIGTERM: Timing.NEXT_STEP,
    Signal.SIGKILL: Timing.AT_ONCE,
    Signal.SIGSTOP: Timing.AFTER_RUN,
    Signal.SIGCONT: Timing.AFTER_RUN,
    Signal.SIGUSR: Timing.AT_ONCE,
}
# Per type, a signal may opt in to another timing (``app.entity(..., sigterm_interrupts=True)``:
# SIGTERM cuts the step in progress, as SIGINT does, so the cleanup runs within the grace).
OPT_IN_TIMING: dict[Signal, tuple[str, Timing]] = {Signal.SIGTERM: ("sigterm_interrupts", Timing.AT_ONCE)}


_STOPS = frozenset({Signal.SIGINT, Signal.SIGTERM, Signal.SIGKILL})
# Each stage: what reaching it means, and the signals that have it (in this order: a later stage
# is reached only with the earlier ones a signal has). Stop receipts (issue 48).
STAGES: dict[Stage, tuple[str, frozenset[Signal]]] = {
    Stage.ACCEPTED: ("committed (the answer without a wait)", frozenset(Signal)),
    Stage.HANDLED: ("its on_signal handler returned (or there is none)", frozenset({Signal.SIGUSR})),
    Stage.UNWOUND: (
        "the run in progress ended and is recorded (none: at once); for SIGTERM the run and the "
        "cleanup both ended",
        _STOPS,
    ),
    Stage.DOWNSTREAM: (
        "every MCP call and child entity of that run was told, and each ended or passed its bound",
        _STOPS,
    ),
    Stage.REAPED: (
        "an exec generation's processes are gone (none: at once)",
        frozenset({Signal.SIGTERM, Signal.SIGKILL}),
    ),
    Stage.TERMINAL: ("the entity is `stopped` or `killed`", frozenset({Signal.SIGTERM, Signal.SIGKILL})),
}


def stages_of(signal: Signal) -> tuple[Stage, ...]:
    """The stages ``signal`` has, in the order it reaches them."""
    return tuple(stage for stage, (_, signals) in STAGES.items() if signal in signals)


def check_stage(signal: Signal, stage: Stage) -> None:
    """``StageUnavailable`` when ``signal`` has no such stage (its answer cannot wait for it)."""
    if signal not in STAGES[stage][1]:
        have = ", ".join(s.value for s in stages_of(signal))
        raise StageUnavailable(f"{signal.value} has no stage {stage.value!r}; its stages: {have}")


class State(IdentityEnum):
    SPAWNING = "spawning"
    RUNNING = "running"
    IDLE = "idle"
    PAUSED = "paused"
    STOPPING = "stopping"
    STOPPED = "stopped"
    KILLED = "killed"

    @classmethod
    def parse(cls, text: str | State) -> State:
        """``"running"``, ``"RUNNING"``, ``"STATE_RUNNING"`` → ``State.RUNNING``; ValueError otherwise."""
        if isinstance(text, State):
            return text
        name = text.strip().lower().removeprefix("state_")
        try:
            return cls(name)
        except ValueError:
            raise ValueError(
                f"unknown state {text!r}; expected one of {', '.join(s.value for s in cls)}"
            ) from None

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


@dataclass(frozen=True, slots=True)
class StateRules:
    """What one state allows, besides what each signal does in it (``TABLE``)."""

    # The server appends messages sent to it (they may only queue).
    accepts_messages: bool
    # The server hands the entity's queued messages to its runtime.
    delivers_messages: bool
    # The runtime starts a run for a delivered message; the idle timeout runs meanwhile.
    starts_runs: bool
    # A run may be in progress: `paused` too, as SIGSTOP lets the current run finish.
    runs_possible: bool
    # A runtime is leased for it even with no message waiting.
    needs_runtime: bool
    # A runtime is leased for it when a message waits.
    wakes_for_message: bool
    # The cause of the → running transition a runtime writes when it takes the entity up.
    start_cause: str | None
    # SIGTERM's cleanup runs in it, until the grace deadline the state carries; a runtime
    # leased in it resumes the cleanup, and a draining one waits for it.
    cleanup: bool
    # On its way out or out: no run starts again (a message-scoped SIGINT leaves the run
    # in progress to the cleanup; it still cancels a message that never started).
    shutting_down: bool
    # Final: signals are rejected, messages refused, the stream closes.
    terminal: bool


_R = StateRules
# fmt: off
STATE_RULES: dict[State, StateRules] = {
    #                 accepts delivers starts runs   needs  wakes  start cause cleanup shutting terminal
    #                 messages messages runs  possible runtime msg
    State.SPAWNING: _R(True,   True,    False, False, True,  False, "started",  False, False,   False),
    State.RUNNING:  _R(True,   True,    True,  True,  True,  False, None,       False, False,   False),
    State.IDLE:     _R(True,   True,    False, False, False, True,  "wake",     False, False,   False),
    State.PAUSED:   _R(True,   False,   False, True,  False, False, None,       False, False,   False),
    State.STOPPING: _R(True,   False,   False, False, True,  False, None,       True,  True,    False),
    State.STOPPED:  _R(False,  False,   False, False, False, False, None,       False, True,    True),
    State.KILLED:   _R(False,  False,   False, False, False, False, None,       False, True,    True),
}
# fmt: on

INITIAL_STATE = State.SPAWNING  # where every entity starts (the `spawn` state event)
TERMINAL_STATES = frozenset(s for s, r in STATE_RULES.items() if r.terminal)
# The states in which an entity may need a runtime, in State order (for store queries).
HOSTED_STATES = tuple(s for s, r in STATE_RULES.items() if r.needs_runtime or r.wakes_for_message)


def needs_runtime(state: State, message_waiting: bool) -> bool:
    """Whether an entity in ``state`` wants a runtime leased to it now."""
    rules = STATE_RULES[state]
    return rules.needs_runtime or (message_waiting and rules.wakes_for_message)


class LifecycleError(Exception):
    """Base of the lifecycle's errors; ``reason`` is the wire's ErrorInfo reason."""

    reason = "LIFECYCLE_ERROR"


class SignalRejected(LifecycleError):
    """A signal to a terminal entity: the server rejects it and writes nothing."""

    reason = "INVALID_SIGNAL"

    def __init__(self, state: State, signal: Signal) -> None:
        self.state, self.signal = state, signal
        super().__init__(f"Cannot signal a {state.value} entity")


class InvalidTransition(LifecycleError):
    """A runtime or reaper transition the lifecycle does not allow."""

    reason = "INVALID_TRANSITION"


class StageUnavailable(LifecycleError):
    """A wait for a stage the signal does not have (``STAGES``): refused before it is sent."""

    reason = "STAGE_NOT_AVAILABLE"


@dataclass(frozen=True)
class Cell:
    """One cell of the RFC table: a non-terminal state and a signal."""

    state: State
    signal: Signal
    # The state the server writes together with the signal; None: unchanged.
    new_state: State | None
    # The runtime's action when a run is in progress, and when none is.
    action_running: Action
    action_not_running: Action
    # The RFC's words for the cell, shown in the generated docs.
    text: str

    def action(self, run_in_progress: bool) -> Action:
        return self.action_running if run_in_progress else self.action_not_running

    @property
    def runs_possible(self) -> bool:
        """Whether a run can be in progress in this state at all."""
        return STATE_RULES[self.state].runs_possible


@dataclass(frozen=True)
class Decision:
    """The answer for one signal: what to write and what the runtime must do."""

    cell: Cell
    previous_state: State
    new_state: State
    # None when the caller did not know whether a run is in progress and the
    # action depends on it (the runtime decides).
    action: Action | None
    outcome: Outcome
    # A scoped signal's message is cancelled before its run started, in the signal's own
    # transaction: its `aborted` run record is written with the signal, and it never runs.
    cancels_message: bool = False

    @property
    def transitions(self) -> bool:
        return self.new_state is not self.previous_state


S, G, A = State, Signal, Action
_N = A.NONE


def _c(state: State, signal: Signal, new: State | None, running: Action, idle: Action, text: str) -> Cell:
    return Cell(state, signal, new, running, idle, text)


# fmt: off
TABLE: dict[State, dict[Signal, Cell]] = {
    S.SPAWNING: {
        G.SIGINT:  _c(S.SPAWNING, G.SIGINT,  None,       _N,          _N,          "ignored"),
        G.SIGHUP:  _c(S.SPAWNING, G.SIGHUP,  None,       _N,          _N,          "ignored"),
        G.SIGTERM: _c(S.SPAWNING, G.SIGTERM, None,       _N,          _N,          "ignored"),
        G.SIGKILL: _c(S.SPAWNING, G.SIGKILL, S.KILLED,   A.KILL,      A.KILL,      "→ killed"),
        G.SIGSTOP: _c(S.SPAWNING, G.SIGSTOP, None,       _N,          _N,          "ignored"),
        G.SIGCONT: _c(S.SPAWNING, G.SIGCONT, None,       _N,          _N,          "ignored"),
        G.SIGUSR:  _c(S.SPAWNING, G.SIGUSR,  None,       _N,          _N,          "ignored"),
    },
    S.RUNNING: {
        G.SIGINT:  _c(S.RUNNING, G.SIGINT,  None,        A.ABORT_RUN, _N,          "aborts current run"),
        G.SIGHUP:  _c(S.RUNNING, G.SIGHUP,  None,        A.RELOAD,    A.RELOAD,    "shuts down runtime after current run"),
        G.SIGTERM: _c(S.RUNNING, G.SIGTERM, S.STOPPING,  A.CLEANUP,   A.CLEANUP,   "→ stopping"),
        G.SIGKILL: _c(S.RUNNING, G.SIGKILL, S.KILLED,    A.KILL,      A.KILL,      "→ killed"),
        G.SIGSTOP: _c(S.RUNNING, G.SIGSTOP, S.PAUSED,    A.PAUSE,     A.PAUSE,     "→ paused"),
        G.SIGCONT: _c(S.RUNNING, G.SIGCONT, None,        _N,          _N,          "ignored"),
        G.SIGUSR:  _c(S.RUNNING, G.SIGUSR,  None,        A.DELIVER,   A.DELIVER,   "delivered"),
    },
    S.IDLE: {
        G.SIGINT:  _c(S.IDLE, G.SIGINT,  None,           _N,          _N,          "ignored (not processing)"),
        G.SIGHUP:  _c(S.IDLE, G.SIGHUP,  None,           _N,          _N,          "ignored (new code picked up on next wake)"),
        G.SIGTERM: _c(S.IDLE, G.SIGTERM, S.STOPPED,      _N,          _N,          "→ stopped"),
        G.SIGKILL: _c(S.IDLE, G.SIGKILL, S.KILLED,       _N,          _N,          "→ killed"),
        G.SIGSTOP: _c(S.IDLE, G.SIGSTOP, S.PAUSED,       _N,          _N,          "→ paused"),
        G.SIGCONT: _c(S.IDLE, G.SIGCONT, None,           _N,          _N,          "ignored"),
        G.SIGUSR:  _c(S.IDLE, G.SIGUSR,  None,           _N,          _N,          "ignored (not processing)"),
    },
    S.PAUSED: {
        # A run that was in progress when SIGSTOP landed may still be
        # finishing: SIGINT aborts it and SIGUSR reaches the handler, as in
        # `running`; with no run these are "ignored (not processing)".
        G.SIGINT:  _c(S.PAUSED, G.SIGINT,  None,         A.ABORT_RUN, _N,          "ignored (not processing)"),
        G.SIGHUP:  _c(S.PAUSED, G.SIGHUP,  None,         _N,          _N,          "ignored (new code picked up on next wake)"),
        G.SIGTERM: _c(S.PAUSED, G.SIGTERM, S.STOPPING,   A.CLEANUP,   A.CLEANUP,   "→ stopping"),
        G.SIGKILL: _c(S.PAUSED, G.SIGKILL, S.KILLED,     A.KILL,      A.KILL,      "→ killed"),
        G.SIGSTOP: _c(S.PAUSED, G.SIGSTOP, None,         _N,          _N,          "ignored"),
        G.SIGCONT: _c(S.PAUSED, G.SIGCONT, S.RUNNING,    A.RESUME,    A.RESUME,    "→ running"),
        G.SIGUSR:  _c(S.PAUSED, G.SIGUSR,  None,         A.DELIVER,   _N,          "ignored (not processing)"),
    },
    S.STOPPING: {
        # SIGINT stays ignored in `stopping`: SIGKILL is the way out of a cleanup.
        G.SIGINT:  _c(S.STOPPING, G.SIGINT,  None,       _N,          _N,          "ignored"),
        G.SIGHUP:  _c(S.STOPPING, G.SIGHUP,  None,       _N,          _N,          "ignored"),
        G.SIGTERM: _c(S.STOPPING, G.SIGTERM, None,       _N,          _N,          "ignored"),
        G.SIGKILL: _c(S.STOPPING, G.SIGKILL, S.KILLED,   A.KILL,      A.KILL,      "→ killed"),
        G.SIGSTOP: _c(S.STOPPING, G.SIGSTOP, None,       _N,          _N,          "ignored"),
        G.SIGCONT: _c(S.STOPPING, G.SIGCONT, None,       _N,          _N,          "ignored"),
        G.SIGUSR:  _c(S.STOPPING, G.SIGUSR,  None,       _N,          _N,          "ignored"),
    },
}
# fmt: on

# The outcome a runtime records, by the cell's action and by what it did. KILL, PAUSE
# and RESUME come with a transition the server already wrote: that is their outcome,
# whatever means the runtime used. Whatever could not be done (UNSUPPORTED) is ignored.
E = Effect
_T, _I, _F, _D = Outcome.TRANSITIONED, Outcome.IGNORED, Outcome.FAILED, Outcome.DELIVERED
_AB, _SR = Outcome.ABORTED, Outcome.SHUTDOWN_REQUESTED


def _row(
    acted: Outcome, delivered: Outcome, no_target: Outcome, unsupported: Outcome
) -> dict[Effect, Outcome]:
    # fmt: off
    return {E.ACTED: acted, E.DELIVERED: delivered, E.NO_TARGET: no_target, E.UNSUPPORTED: unsupported, E.FAILED: _F}
    # fmt: on


# fmt: off
RUNTIME_OUTCOMES: dict[Action, dict[Effect, Outcome]] = {
    #                acted  delivered  no target  unsupported    (failed: always `failed`)
    A.ABORT_RUN: _row(_AB,  _D,        _I,        _I),
    A.RELOAD:    _row(_SR,  _D,        _I,        _I),
    A.CLEANUP:   _row(_SR,  _D,        _I,        _I),
    A.KILL:      _row(_T,   _T,        _T,        _I),
    A.PAUSE:     _row(_T,   _T,        _T,        _I),
    A.RESUME:    _row(_T,   _T,        _T,        _I),
    A.DELIVER:   _row(_D,   _D,        _I,        _I),
}
# fmt: on
# Actions whose outcome depends on the runtime: the server leaves their record `pending`.
_REPORTED_BY_RUNTIME = frozenset({A.ABORT_RUN, A.RELOAD, A.CLEANUP, A.DELIVER})


def runtime_outcome(action: Action, effect: Effect) -> Outcome:
    """The outcome a runtime records for a signal whose cell asked ``action``, given what it did."""
    return RUNTIME_OUTCOMES[action][effect]


def ignored_stops_nothing(state: State, signal: Signal) -> bool:
    """Whether a signal the table ignored in ``state`` leaves its later stages to nothing: what
    only it would have brought about never comes, and its answer says so at once. A SIGTERM to
    an entity already ``stopping`` is the one exception: the stop under way brings its stages."""
    return not (signal is Signal.SIGTERM and state is State.STOPPING)


def cell(state: State, signal: Signal) -> Cell:
    """The table cell for a state and signal; terminal states raise SignalRejected."""
    if state in TERMINAL_STATES:
        raise SignalRejected(state, signal)
    return TABLE[state][signal]


def decide(
    state: State,
    signal: Signal,
    run_in_progress: bool | None = None,
    *,
    message: MessageProgress | None = None,
) -> Decision:
    """Judge one signal against the entity's state.

    ``run_in_progress`` is ``None`` when the caller cannot know (the server).
    The outcome is then ``PENDING`` wherever the runtime acts or the action
    depends on the run, and final everywhere else (a plain transition, or
    ``ignored``). ``message``: the signal is scoped to one message (a headless
    run's SIGINT, ``MESSAGE_SCOPED_SIGNALS``), which has got that far; see
    ``_scoped``.
    """
    decision = _DECISIONS.get((state, signal, run_in_progress, message))
    return decision if decision is not None else _judge(state, signal, run_in_progress, message)


def _judge(
    state: State, signal: Signal, run_in_progress: bool | None, message: MessageProgress | None
) -> Decision:
    c = cell(state, signal)
    if run_in_progress and not c.runs_possible:
        raise InvalidTransition(f"no run can be in progress in {state.value}")
    if message is not None and signal in MESSAGE_SCOPED_SIGNALS:
        scoped = _scoped(c, message)
        if scoped is not None:
            return scoped
    if run_in_progress is not None:
        possible = {c.action(run_in_progress)}
    elif c.runs_possible:
        possible = {c.action_running, c.action_not_running}
    else:
        possible = {c.action_not_running}
    action = next(iter(possible)) if len(possible) == 1 else None
    if action is None or (action in _REPORTED_BY_RUNTIME and run_in_progress is None):
        outcome = Outcome.PENDING
    elif action is not _N:
        outcome = RUNTIME_OUTCOMES[action][Effect.ACTED]
    elif c.new_state is not None:
        outcome = Outcome.TRANSITIONED
    else:
        outcome = Outcome.IGNORED
    return Decision(c, state, c.new_state or state, action, outcome)


def _scoped(c: Cell, message: MessageProgress) -> Decision | None:
    """A signal scoped to one message touches that message alone (ARCHITECTURE §5).

    A message whose run has not started is cancelled at once, in any state: it
    cannot start while the signal is being written, and so never will. One
    whose run ended has nothing left to stop. One whose run started is the
    cell's business (the runtime aborts the run in progress; in `stopping` it
    is left to the cleanup) — unless no run can be in progress in the state at
    all (`idle`: its run was lost with its runtime), and then it is cancelled
    before it is delivered again. None: the cell decides.
    """
    rules = STATE_RULES[c.state]
    same = c.new_state or c.state
    if message is MessageProgress.ENDED:
        return Decision(c, c.state, same, _N, RUNTIME_OUTCOMES[A.ABORT_RUN][Effect.NO_TARGET])
    if message is MessageProgress.QUEUED or not (rules.runs_possible or rules.shutting_down):
        acted = RUNTIME_OUTCOMES[A.ABORT_RUN][Effect.ACTED]
        return Decision(c, c.state, same, A.ABORT_RUN, acted, cancels_message=True)
    return None


# Every decision the table allows, judged once: the server judges each signal in its write path.
_DECISIONS = {
    (state, signal, run, message): _judge(state, signal, run, message)
    for state, row in TABLE.items()
    for signal in row
    for run in ((None, False, True) if STATE_RULES[state].runs_possible else (None, False))
    for message in (None, *MessageProgress)
}


def valid_signals(state: State, run_in_progress: bool = False) -> dict[Signal, Decision]:
    """Every signal that has an effect now (not ignored): what widgets enable."""
    if state in TERMINAL_STATES:
        return {}
    result = {}
    for signal in Signal:
        d = decide(state, signal, run_in_progress if TABLE[state][signal].runs_possible else False)
        if d.transitions or d.action not in (None, A.NONE):
            result[signal] = d
    return result


def possible_signals(state: State) -> frozenset[Signal]:
    """Signals that have an effect in ``state`` with or without a run in progress.

    For views that do not follow each entity's runs (the widgets' table): a SIGINT
    to a `running` entity is worth sending, the runtime decides whether it aborts.
    """
    if not STATE_RULES[state].runs_possible:
        return frozenset(valid_signals(state))
    return frozenset(valid_signals(state, False)) | frozenset(valid_signals(state, True))


# Transitions not driven by a signal: (from, to) → causes that may write it.
RUNTIME_TRANSITIONS: dict[tuple[State, State], frozenset[str]] = {
    (S.SPAWNING, S.RUNNING): frozenset({"started"}),
    (S.RUNNING, S.IDLE): frozenset({"idle_timeout", "reload", "runtime_lost", "process_exited"}),
    (S.IDLE, S.RUNNING): frozenset({"wake"}),
    (S.STOPPING, S.STOPPED): frozenset({"cleanup_complete", "grace_expired"}),
}
_TARGETS = {(a, cause): b for (a, b), causes in RUNTIME_TRANSITIONS.items() for cause in causes}


def runtime_target(state: State, cause: str) -> State | None:
    """The state a runtime (or reaper) transition with ``cause`` leads to from ``state``; None: none does."""
    return _TARGETS.get((state, cause))


def decide_waiting(state: State, signal: Signal) -> Decision:
    """A signal to an entity whose run in flight waits for a worker of its code version (no lease
    holds it; idle since its runtime was lost, or paused): the server decides alone, in the
    signal's transaction. The run is in progress, so the cell is the one for a run in progress,
    in `running`'s row while the entity is idle (SIGTERM: → stopping, its cleanup on the version
    new wakes get). What no runtime may come to do is settled now: SIGINT aborts the run
    (`aborted`; it never resumes); SIGHUP has no runtime to shut down (`ignored`: the run still
    finishes on its version, the next wake takes the one selected)."""
    row = S.RUNNING if state is S.IDLE else state
    d = decide(row, signal, True if signal in SERVER_ABORTED_SIGNALS else None)
    new, action, outcome = (state if d.new_state is row else d.new_state), d.action, d.outcome
    if signal in RELOAD_SIGNALS and outcome is Outcome.PENDING:
        action, outcome = A.NONE, Outcome.IGNORED
    return Decision(d.cell, state, new, action, outcome)


def check_runtime_transition(previous: State, new: State, cause: str) -> None:
    """Raise InvalidTransition unless (previous → new, cause) is allowed."""
    causes = RUNTIME_TRANSITIONS.get((previous, new))
    if causes is None:
        raise InvalidTransition(f"{previous.value} → {new.value} is not a runtime transition")
    if cause not in causes:
        raise InvalidTransition(
            f"{previous.value} → {new.value} cannot have cause {cause!r} (allowed: {', '.join(sorted(causes))})"
        )


# The end (entering a terminal state) is final at once; the runtime may still close the story it
# was telling, within the server's settle: the outcome of a signal it was given, the end of the run
# in progress and the state changes its code made (seen, so kept), its process's receipts and the
# output it wrote before it was seen to exit. Nothing new begins (ARCHITECTURE §1).
CLOSING_RECORDS = frozenset(
    {Record.SIGNAL_OUTCOME, Record.RUN_END, Record.STATE_CHANGES, Record.EXEC_RECEIPT, Record.OUTPUT}
)


def accepts_record(state: State, record: Record) -> bool:
    """Whether an entity in ``state`` takes ``record`` from its runtime (the lease's own checks aside)."""
    return not STATE_RULES[state].terminal or record in CLOSING_RECORDS
