"""The entity lifecycle: the RFC's signal table, and nothing else.

Two rules, as in h11's ``_state.py``:

1. Everything that decides a lifecycle transition lives in this module. The
   server, the runtime, the CLI and the widgets ask it; nobody re-encodes a
   rule.
2. This module does no I/O. It answers from facts it is given: the entity's
   state, the signal, and whether a run is in progress (``None`` when the
   caller cannot know, as the server cannot).

Signal-driven transitions follow the RFC's table cell for cell (ARCHITECTURE
§2: where the RFC's diagram and table differ, the table wins). The other
transitions (spawning → running, running ⇄ idle, stopping → stopped) are
written by the runtime or the server's reaper and are listed in
``RUNTIME_TRANSITIONS``. ``python -m electric_sdk.lifecycle`` prints the table
as Markdown; the docs are generated from it, never retyped.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "RUNTIME_TRANSITIONS",
    "TABLE",
    "TERMINAL_STATES",
    "Action",
    "Cell",
    "Decision",
    "InvalidSignal",
    "InvalidTransition",
    "LifecycleError",
    "Outcome",
    "Signal",
    "State",
    "cell",
    "check_runtime_transition",
    "decide",
    "markdown_table",
    "valid_signals",
]


class Signal(enum.Enum):
    SIGINT = "SIGINT"
    SIGHUP = "SIGHUP"
    SIGTERM = "SIGTERM"
    SIGKILL = "SIGKILL"
    SIGSTOP = "SIGSTOP"
    SIGCONT = "SIGCONT"
    SIGUSR = "SIGUSR"

    @classmethod
    def parse(cls, text: str | Signal) -> Signal:
        """``"SIGTERM"``, ``"sigterm"``, ``"TERM"`` → ``Signal.SIGTERM``; ValueError otherwise."""
        if isinstance(text, Signal):
            return text
        name = text.strip().upper()
        for prefix in ("SIGNAL_", ""):  # also the wire's enum names, e.g. SIGNAL_SIGTERM
            candidate = name.removeprefix(prefix)
            candidate = candidate if candidate.startswith("SIG") else f"SIG{candidate}"
            if candidate in cls.__members__:
                return cls[candidate]
        raise ValueError(f"unknown signal {text!r}; expected one of {', '.join(s.value for s in cls)}")


class State(enum.Enum):
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


TERMINAL_STATES = frozenset({State.STOPPED, State.KILLED})


class Action(enum.Enum):
    """What the runtime does for a cell (ARCHITECTURE §3)."""

    NONE = "none"
    ABORT_RUN = "abort_run"  # SIGINT: cancel the run in progress now
    RELOAD = "reload"  # SIGHUP: end the session after the run, next wake on new code
    CLEANUP = "cleanup"  # SIGTERM: run on_signal(SIGTERM) within the grace
    KILL = "kill"  # SIGKILL: cancel everything now, no handler
    PAUSE = "pause"  # SIGSTOP: finish the run, deliver nothing new
    RESUME = "resume"  # SIGCONT: deliver queued messages in order
    DELIVER = "deliver"  # SIGUSR: call on_signal(SIGUSR, payload) now


class Outcome(enum.Enum):
    """A signal record's handling outcome."""

    PENDING = "pending"
    TRANSITIONED = "transitioned"
    IGNORED = "ignored"
    DELIVERED = "delivered"
    ABORTED = "aborted"
    SHUTDOWN_REQUESTED = "shutdown_requested"
    FAILED = "failed"


class LifecycleError(Exception):
    """Base of the lifecycle's errors; ``reason`` is the wire's ErrorInfo reason."""

    reason = "LIFECYCLE_ERROR"


class InvalidSignal(LifecycleError):
    """A signal to a terminal entity: the server rejects it and writes nothing."""

    reason = "INVALID_SIGNAL"

    def __init__(self, state: State, signal: Signal) -> None:
        self.state, self.signal = state, signal
        super().__init__(f"Cannot signal a {state.value} entity")


class InvalidTransition(LifecycleError):
    """A runtime or reaper transition the lifecycle does not allow."""

    reason = "INVALID_TRANSITION"


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
        return self.state in _RUN_STATES


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

    @property
    def transitions(self) -> bool:
        return self.new_state is not self.previous_state


# States in which a run may be in progress. `paused`: SIGSTOP lets the current
# run finish, so a run can still be going (ARCHITECTURE §2 clarifications).
_RUN_STATES = frozenset({State.RUNNING, State.PAUSED})

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

# Outcome a cell gets once its action is known. KILL/PAUSE/RESUME/CLEANUP are
# transitions the server already wrote; the runtime enforces them, but the
# record's outcome is the transition itself, except SIGTERM's cleanup, whose
# outcome the runtime reports when the cleanup has been asked for.
_OUTCOME_OF_ACTION = {
    A.ABORT_RUN: Outcome.ABORTED,
    A.RELOAD: Outcome.SHUTDOWN_REQUESTED,
    A.CLEANUP: Outcome.SHUTDOWN_REQUESTED,
    A.DELIVER: Outcome.DELIVERED,
}


def cell(state: State, signal: Signal) -> Cell:
    """The table cell for a state and signal; terminal states raise InvalidSignal."""
    if state in TERMINAL_STATES:
        raise InvalidSignal(state, signal)
    return TABLE[state][signal]


def decide(state: State, signal: Signal, run_in_progress: bool | None = None) -> Decision:
    """Judge one signal against the entity's state.

    ``run_in_progress`` is ``None`` when the caller cannot know (the server).
    The outcome is then ``PENDING`` wherever the runtime acts or the action
    depends on the run, and final everywhere else (a plain transition, or
    ``ignored``).
    """
    c = cell(state, signal)
    if run_in_progress and not c.runs_possible:
        raise InvalidTransition(f"no run can be in progress in {state.value}")
    if run_in_progress is not None:
        possible = {c.action(run_in_progress)}
    elif c.runs_possible:
        possible = {c.action_running, c.action_not_running}
    else:
        possible = {c.action_not_running}
    action = next(iter(possible)) if len(possible) == 1 else None
    if action is None or (action in _OUTCOME_OF_ACTION and run_in_progress is None):
        outcome = Outcome.PENDING
    elif action in _OUTCOME_OF_ACTION:
        outcome = _OUTCOME_OF_ACTION[action]
    elif c.new_state is not None:
        outcome = Outcome.TRANSITIONED
    else:
        outcome = Outcome.IGNORED
    return Decision(c, state, c.new_state or state, action, outcome)


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


# Transitions not driven by a signal: (from, to) → causes that may write it.
RUNTIME_TRANSITIONS: dict[tuple[State, State], frozenset[str]] = {
    (S.SPAWNING, S.RUNNING): frozenset({"started"}),
    (S.RUNNING, S.IDLE): frozenset({"idle_timeout", "reload", "runtime_lost", "process_exited"}),
    (S.IDLE, S.RUNNING): frozenset({"wake"}),
    (S.STOPPING, S.STOPPED): frozenset({"cleanup_complete", "grace_expired"}),
}


def check_runtime_transition(previous: State, new: State, cause: str) -> None:
    """Raise InvalidTransition unless (previous → new, cause) is allowed."""
    causes = RUNTIME_TRANSITIONS.get((previous, new))
    if causes is None:
        raise InvalidTransition(f"{previous.value} → {new.value} is not a runtime transition")
    if cause not in causes:
        raise InvalidTransition(
            f"{previous.value} → {new.value} cannot have cause {cause!r} (allowed: {', '.join(sorted(causes))})"
        )


def markdown_table() -> str:
    """The RFC table, rendered from TABLE, for the docs."""
    signals = list(Signal)
    lines = [
        "| Current state | " + " | ".join(s.value for s in signals) + " |",
        "|---|" + "---|" * len(signals),
    ]
    for state in State:
        if state in TERMINAL_STATES:
            row = ["server rejects"] * len(signals)
        else:
            row = []
            for signal in signals:
                c = TABLE[state][signal]
                text = f"→ `{c.new_state.value}`" if c.new_state else c.text
                if c.action_running is not c.action_not_running and c.text.startswith("ignored"):
                    text += f"; run in progress: {c.action_running.value.replace('_', ' ')}"
                row.append(text)
        lines.append(f"| `{state.value}` | " + " | ".join(row) + " |")
    lines.append("")
    lines.append("Transitions not driven by a signal:")
    lines.append("")
    lines.append("| From | To | Causes |")
    lines.append("|---|---|---|")
    for (a, b), causes in RUNTIME_TRANSITIONS.items():
        lines.append(f"| `{a.value}` | `{b.value}` | {', '.join(sorted(causes))} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
