"""The lifecycle table, cell by cell, against the RFC.

The expectations here are written out independently of ``electric_sdk.lifecycle``:
``RFC_TABLE`` is the RFC's "Signal handling by state" table pasted verbatim
(seed 000), and ``BEHAVIOUR`` spells out, from ARCHITECTURE §2-3, what the
runtime does and which outcome the signal record gets, for the server's view
(run in progress unknown), with no run, and with a run in progress. Nothing
below is derived from ``lifecycle.TABLE``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import runpy
from pathlib import Path
from typing import Literal

import pytest

from electric_sdk import lifecycle
from electric_sdk.lifecycle import (
    RUNTIME_TRANSITIONS,
    TABLE,
    TERMINAL_STATES,
    Action,
    Decision,
    InvalidTransition,
    LifecycleError,
    MessageProgress,
    Outcome,
    Signal,
    SignalRejected,
    State,
    cell,
    check_runtime_transition,
    decide,
    valid_signals,
)

# The RFC's table, verbatim. Where the RFC's diagram and its table differ, the table wins.
RFC_TABLE = """
| Current State | SIGINT | SIGHUP | SIGTERM | SIGKILL | SIGSTOP | SIGCONT | SIGUSR |
|---|---|---|---|---|---|---|---|
| `spawning` | ignored | ignored | ignored | → `killed` | ignored | ignored | ignored |
| `running` | aborts current run | shuts down runtime after current run | → `stopping` | → `killed` | → `paused` | ignored | delivered |
| `idle` | ignored (not processing) | ignored (new code picked up on next wake) | → `stopped` | → `killed` | → `paused` | ignored | ignored (not processing) |
| `paused` | ignored (not processing) | ignored (new code picked up on next wake) | → `stopping` | → `killed` | ignored | → `running` | ignored (not processing) |
| `stopping` | ignored | ignored | ignored | → `killed` | ignored | ignored | ignored |
| `stopped` | server rejects | server rejects | server rejects | server rejects | server rejects | server rejects | server rejects |
| `killed` | server rejects | server rejects | server rejects | server rejects | server rejects | server rejects | server rejects |
"""


def _parse_markdown_table(text: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """(column names, {row name: {column: cell text}}) of the first Markdown table in text."""
    rows: list[list[str]] = []
    for line in text.strip().splitlines():
        if not line.startswith("|"):
            if rows:
                break
            continue
        rows.append([part.strip() for part in line.strip().strip("|").split("|")])
    header, body = rows[0][1:], rows[2:]
    return header, {row[0].strip("`"): dict(zip(header, row[1:], strict=True)) for row in body}


RFC_SIGNALS, RFC_CELLS = _parse_markdown_table(RFC_TABLE)
RFC_STATES = list(RFC_CELLS)
RFC_TERMINAL = {state for state, row in RFC_CELLS.items() if set(row.values()) == {"server rejects"}}


def _rfc_new_state(state: str, signal: str) -> str | None:
    """The state an RFC cell moves to, or None when the state is unchanged."""
    text = RFC_CELLS[state][signal]
    if text.startswith("→ "):
        return text.removeprefix("→ ").strip("`")
    return None


# What the runtime does and which outcome the record gets (ARCHITECTURE §2-3), as
# (action, outcome) string values, for the three views a caller can have:
#   server: run_in_progress=None. The action is None where it depends on the run;
#           the outcome is "pending" wherever the runtime reports it.
#   no_run: run_in_progress=False.
#   run:    run_in_progress=True; None means a run cannot be in progress in that
#           state, so decide() must raise InvalidTransition.
Expect = tuple[str | None, str]
Mode = Literal["server", "no_run", "run"]
IGNORED: Expect = ("none", "ignored")
KILLED: Expect = ("kill", "transitioned")  # the runtime cancels everything; no report needed
QUIET_MOVE: Expect = ("none", "transitioned")  # a transition with nothing for the runtime to do

BEHAVIOUR: dict[tuple[str, str], dict[Mode, Expect | None]] = {
    # spawning: no run yet; only SIGKILL does anything.
    ("spawning", "SIGINT"): {"server": IGNORED, "no_run": IGNORED, "run": None},
    ("spawning", "SIGHUP"): {"server": IGNORED, "no_run": IGNORED, "run": None},
    ("spawning", "SIGTERM"): {"server": IGNORED, "no_run": IGNORED, "run": None},
    ("spawning", "SIGKILL"): {"server": KILLED, "no_run": KILLED, "run": None},
    ("spawning", "SIGSTOP"): {"server": IGNORED, "no_run": IGNORED, "run": None},
    ("spawning", "SIGCONT"): {"server": IGNORED, "no_run": IGNORED, "run": None},
    ("spawning", "SIGUSR"): {"server": IGNORED, "no_run": IGNORED, "run": None},
    # running: SIGINT aborts only a run that is in progress; SIGHUP, SIGTERM and
    # SIGUSR are reported by the runtime, so the server leaves them pending.
    ("running", "SIGINT"): {
        "server": (None, "pending"),
        "no_run": IGNORED,
        "run": ("abort_run", "aborted"),
    },
    ("running", "SIGHUP"): {
        "server": ("reload", "pending"),
        "no_run": ("reload", "shutdown_requested"),
        "run": ("reload", "shutdown_requested"),
    },
    ("running", "SIGTERM"): {
        "server": ("cleanup", "pending"),
        "no_run": ("cleanup", "shutdown_requested"),
        "run": ("cleanup", "shutdown_requested"),
    },
    ("running", "SIGKILL"): {"server": KILLED, "no_run": KILLED, "run": KILLED},
    ("running", "SIGSTOP"): {
        "server": ("pause", "transitioned"),
        "no_run": ("pause", "transitioned"),
        "run": ("pause", "transitioned"),
    },
    ("running", "SIGCONT"): {"server": IGNORED, "no_run": IGNORED, "run": IGNORED},
    ("running", "SIGUSR"): {
        "server": ("deliver", "pending"),
        "no_run": ("deliver", "delivered"),
        "run": ("deliver", "delivered"),
    },
    # idle: the session has ended, so no run and nothing for a runtime to enforce.
    ("idle", "SIGINT"): {"server": IGNORED, "no_run": IGNORED, "run": None},
    ("idle", "SIGHUP"): {"server": IGNORED, "no_run": IGNORED, "run": None},
    ("idle", "SIGTERM"): {"server": QUIET_MOVE, "no_run": QUIET_MOVE, "run": None},
    ("idle", "SIGKILL"): {"server": QUIET_MOVE, "no_run": QUIET_MOVE, "run": None},
    ("idle", "SIGSTOP"): {"server": QUIET_MOVE, "no_run": QUIET_MOVE, "run": None},
    ("idle", "SIGCONT"): {"server": IGNORED, "no_run": IGNORED, "run": None},
    ("idle", "SIGUSR"): {"server": IGNORED, "no_run": IGNORED, "run": None},
    # paused: a run caught by SIGSTOP may still be finishing; SIGINT aborts it and
    # SIGUSR reaches the handler, as in running (ARCHITECTURE §2 clarifications).
    ("paused", "SIGINT"): {
        "server": (None, "pending"),
        "no_run": IGNORED,
        "run": ("abort_run", "aborted"),
    },
    ("paused", "SIGHUP"): {"server": IGNORED, "no_run": IGNORED, "run": IGNORED},
    ("paused", "SIGTERM"): {
        "server": ("cleanup", "pending"),
        "no_run": ("cleanup", "shutdown_requested"),
        "run": ("cleanup", "shutdown_requested"),
    },
    ("paused", "SIGKILL"): {"server": KILLED, "no_run": KILLED, "run": KILLED},
    ("paused", "SIGSTOP"): {"server": IGNORED, "no_run": IGNORED, "run": IGNORED},
    ("paused", "SIGCONT"): {
        "server": ("resume", "transitioned"),
        "no_run": ("resume", "transitioned"),
        "run": ("resume", "transitioned"),
    },
    ("paused", "SIGUSR"): {
        "server": (None, "pending"),
        "no_run": IGNORED,
        "run": ("deliver", "delivered"),
    },
    # stopping: no new run starts, only the cleanup; SIGINT stays ignored, SIGKILL is the way out.
    ("stopping", "SIGINT"): {"server": IGNORED, "no_run": IGNORED, "run": None},
    ("stopping", "SIGHUP"): {"server": IGNORED, "no_run": IGNORED, "run": None},
    ("stopping", "SIGTERM"): {"server": IGNORED, "no_run": IGNORED, "run": None},
    ("stopping", "SIGKILL"): {"server": KILLED, "no_run": KILLED, "run": None},
    ("stopping", "SIGSTOP"): {"server": IGNORED, "no_run": IGNORED, "run": None},
    ("stopping", "SIGCONT"): {"server": IGNORED, "no_run": IGNORED, "run": None},
    ("stopping", "SIGUSR"): {"server": IGNORED, "no_run": IGNORED, "run": None},
}

RUN_IN_PROGRESS: dict[Mode, bool | None] = {"server": None, "no_run": False, "run": True}
ALL_CELLS = [(state, signal) for state in RFC_STATES for signal in RFC_SIGNALS]
LIVE_CELLS = [(state, signal) for state, signal in ALL_CELLS if state not in RFC_TERMINAL]
TERMINAL_CELLS = [(state, signal) for state, signal in ALL_CELLS if state in RFC_TERMINAL]


def _ids(cells: list[tuple[str, str]]) -> list[str]:
    return [f"{state}-{signal}" for state, signal in cells]


# --- the shape of the table -------------------------------------------------


def test_rfc_table_is_seven_by_seven() -> None:
    assert len(RFC_STATES) == 7
    assert len(RFC_SIGNALS) == 7
    assert len(ALL_CELLS) == 49
    assert {"stopped", "killed"} == RFC_TERMINAL
    assert set(BEHAVIOUR) == set(LIVE_CELLS)


def test_enums_match_the_rfc() -> None:
    assert [s.value for s in Signal] == RFC_SIGNALS
    assert [s.value for s in State] == RFC_STATES
    assert {s.value for s in TERMINAL_STATES} == RFC_TERMINAL
    assert {s.value for s in State if s.terminal} == RFC_TERMINAL


def test_table_has_every_live_cell_and_no_terminal_row() -> None:
    assert {s.value for s in TABLE} == set(RFC_STATES) - RFC_TERMINAL
    for state, row in TABLE.items():
        assert list(row) == list(Signal)
        for signal, c in row.items():
            assert (c.state, c.signal) == (state, signal)


# --- every cell ---------------------------------------------------------------


@pytest.mark.parametrize(("state", "signal"), LIVE_CELLS, ids=_ids(LIVE_CELLS))
def test_cell(state: str, signal: str) -> None:
    c = cell(State(state), Signal(signal))
    want = _rfc_new_state(state, signal)
    assert (c.new_state.value if c.new_state else None) == want
    # The RFC's words, without the Markdown backticks.
    assert c.text == RFC_CELLS[state][signal].replace("`", "")
    assert c.runs_possible is (state in {"running", "paused"})


@pytest.mark.parametrize("mode", ["server", "no_run", "run"])
@pytest.mark.parametrize(("state", "signal"), LIVE_CELLS, ids=_ids(LIVE_CELLS))
def test_decide(state: str, signal: str, mode: Mode) -> None:
    expected = BEHAVIOUR[state, signal][mode]
    run_in_progress = RUN_IN_PROGRESS[mode]
    if expected is None:
        with pytest.raises(InvalidTransition, match=f"no run can be in progress in {state}") as err:
            decide(State(state), Signal(signal), run_in_progress)
        assert err.value.reason == "INVALID_TRANSITION"
        return
    d = decide(State(state), Signal(signal), run_in_progress)
    want_state = _rfc_new_state(state, signal) or state
    assert d.previous_state.value == state
    assert d.new_state.value == want_state
    assert d.transitions is (want_state != state)
    assert d.cell is cell(State(state), Signal(signal))
    assert (d.action.value if d.action else None, d.outcome.value) == expected


@pytest.mark.parametrize("mode", ["server", "no_run", "run"])
@pytest.mark.parametrize(("state", "signal"), TERMINAL_CELLS, ids=_ids(TERMINAL_CELLS))
def test_terminal_cell_is_rejected(state: str, signal: str, mode: Mode) -> None:
    with pytest.raises(SignalRejected) as err:
        decide(State(state), Signal(signal), RUN_IN_PROGRESS[mode])
    assert str(err.value) == f"Cannot signal a {state} entity"
    assert err.value.reason == "INVALID_SIGNAL"
    assert (err.value.state, err.value.signal) == (State(state), Signal(signal))
    assert isinstance(err.value, LifecycleError)
    with pytest.raises(SignalRejected, match=f"^Cannot signal a {state} entity$"):
        cell(State(state), Signal(signal))


def test_terminal_messages_are_the_rfc_wording() -> None:
    assert str(SignalRejected(State.STOPPED, Signal.SIGTERM)) == "Cannot signal a stopped entity"
    assert str(SignalRejected(State.KILLED, Signal.SIGINT)) == "Cannot signal a killed entity"
    assert SignalRejected.reason == "INVALID_SIGNAL"


# --- ARCHITECTURE §2 clarifications, by name ---------------------------------------


def test_paused_sigterm_goes_to_stopping() -> None:
    assert decide(State.PAUSED, Signal.SIGTERM).new_state is State.STOPPING


def test_paused_sigcont_goes_to_running() -> None:
    d = decide(State.PAUSED, Signal.SIGCONT)
    assert (d.new_state, d.outcome) == (State.RUNNING, Outcome.TRANSITIONED)


def test_paused_sigint_aborts_a_run_still_in_progress() -> None:
    d = decide(State.PAUSED, Signal.SIGINT, run_in_progress=True)
    assert (d.new_state, d.action, d.outcome) == (State.PAUSED, Action.ABORT_RUN, Outcome.ABORTED)


def test_paused_sigint_without_a_run_is_ignored() -> None:
    d = decide(State.PAUSED, Signal.SIGINT, run_in_progress=False)
    assert (d.new_state, d.action, d.outcome) == (State.PAUSED, Action.NONE, Outcome.IGNORED)


def test_paused_sigusr_reaches_the_handler_only_during_a_run() -> None:
    assert decide(State.PAUSED, Signal.SIGUSR, True).outcome is Outcome.DELIVERED
    assert decide(State.PAUSED, Signal.SIGUSR, False).outcome is Outcome.IGNORED


@pytest.mark.parametrize("run_in_progress", [None, False])
def test_stopping_sigint_is_ignored(run_in_progress: bool | None) -> None:
    d = decide(State.STOPPING, Signal.SIGINT, run_in_progress)
    assert (d.new_state, d.action, d.outcome) == (State.STOPPING, Action.NONE, Outcome.IGNORED)


def test_server_view_outcomes() -> None:
    """run_in_progress=None: pending where the runtime reports, else final."""
    pending = {
        ("running", "SIGINT"),
        ("running", "SIGHUP"),
        ("running", "SIGTERM"),
        ("running", "SIGUSR"),
        ("paused", "SIGTERM"),
        ("paused", "SIGINT"),
        ("paused", "SIGUSR"),
    }
    moves = {c for c in LIVE_CELLS if _rfc_new_state(*c) is not None}
    by_outcome: dict[Outcome, set[tuple[str, str]]] = {}
    for state, signal in LIVE_CELLS:
        outcome = decide(State(state), Signal(signal)).outcome
        by_outcome.setdefault(outcome, set()).add((state, signal))
    assert by_outcome[Outcome.PENDING] == pending
    assert by_outcome[Outcome.TRANSITIONED] == moves - pending
    assert by_outcome[Outcome.IGNORED] == set(LIVE_CELLS) - moves - pending
    assert set(by_outcome) == {Outcome.PENDING, Outcome.TRANSITIONED, Outcome.IGNORED}
    # SIGKILL is final at once everywhere; so are SIGSTOP running → paused and idle SIGTERM.
    for state in ("spawning", "running", "idle", "paused", "stopping"):
        assert (state, "SIGKILL") in by_outcome[Outcome.TRANSITIONED]
    assert ("running", "SIGSTOP") in by_outcome[Outcome.TRANSITIONED]
    assert ("idle", "SIGTERM") in by_outcome[Outcome.TRANSITIONED]


# --- valid_signals: what the widgets enable ---------------------------------------

VALID: dict[tuple[str, bool], set[str]] = {
    ("spawning", False): {"SIGKILL"},
    ("running", False): {"SIGHUP", "SIGTERM", "SIGKILL", "SIGSTOP", "SIGUSR"},
    ("running", True): {"SIGINT", "SIGHUP", "SIGTERM", "SIGKILL", "SIGSTOP", "SIGUSR"},
    ("idle", False): {"SIGTERM", "SIGKILL", "SIGSTOP"},
    ("paused", False): {"SIGTERM", "SIGKILL", "SIGCONT"},
    ("paused", True): {"SIGINT", "SIGTERM", "SIGKILL", "SIGCONT", "SIGUSR"},
    ("stopping", False): {"SIGKILL"},
    ("stopped", False): set(),
    ("killed", False): set(),
}


@pytest.mark.parametrize("run_in_progress", [False, True], ids=["no_run", "run"])
@pytest.mark.parametrize("state", RFC_STATES)
def test_valid_signals(state: str, run_in_progress: bool) -> None:
    # Where no run can be in progress, a stale "run in progress" flag is read as "no run".
    key = (state, run_in_progress) if (state, run_in_progress) in VALID else (state, False)
    valid = valid_signals(State(state), run_in_progress)
    assert {s.value for s in valid} == VALID[key]
    for signal, d in valid.items():
        assert isinstance(d, Decision)
        assert d == decide(State(state), signal, key[1])
        assert d.transitions or d.action not in (None, Action.NONE)


def test_valid_signals_defaults_to_no_run() -> None:
    assert valid_signals(State.RUNNING) == valid_signals(State.RUNNING, False)
    assert Signal.SIGINT not in valid_signals(State.PAUSED)


# --- transitions not driven by a signal (ARCHITECTURE §2, §4) ----------------------

ALLOWED = [
    ("spawning", "running", "started"),
    ("running", "idle", "idle_timeout"),
    ("running", "idle", "reload"),
    ("running", "idle", "runtime_lost"),
    ("running", "idle", "process_exited"),
    ("idle", "running", "wake"),
    ("stopping", "stopped", "cleanup_complete"),
    ("stopping", "stopped", "grace_expired"),
]

REFUSED = [
    ("running", "idle", "wake"),  # right edge, wrong cause
    ("stopping", "stopped", "idle_timeout"),
    ("spawning", "running", "wake"),
    ("running", "stopped", "cleanup_complete"),  # a runtime write never skips stopping
    ("paused", "running", "wake"),  # only SIGCONT resumes
    ("paused", "idle", "idle_timeout"),
    ("stopping", "idle", "idle_timeout"),  # a finishing run never undoes SIGTERM
    ("stopping", "running", "wake"),
    ("stopped", "running", "wake"),  # terminal is final
    ("killed", "running", "started"),
    ("running", "paused", "started"),  # signal-driven transitions are the server's
    ("running", "killed", "grace_expired"),
    ("idle", "idle", "idle_timeout"),
]


@pytest.mark.parametrize(("previous", "new", "cause"), ALLOWED)
def test_runtime_transition_allowed(previous: str, new: str, cause: str) -> None:
    check_runtime_transition(State(previous), State(new), cause)


@pytest.mark.parametrize(("previous", "new", "cause"), REFUSED)
def test_runtime_transition_refused(previous: str, new: str, cause: str) -> None:
    with pytest.raises(InvalidTransition) as err:
        check_runtime_transition(State(previous), State(new), cause)
    assert err.value.reason == "INVALID_TRANSITION"
    assert f"{previous} → {new}" in str(err.value)


def test_runtime_transitions_are_exactly_the_documented_ones() -> None:
    table = {(a.value, b.value, cause) for (a, b), causes in RUNTIME_TRANSITIONS.items() for cause in causes}
    assert table == set(ALLOWED)
    edges = {(a, b) for a, b, _ in ALLOWED}
    for previous in State:
        for new in State:
            if (previous.value, new.value) not in edges:
                with pytest.raises(InvalidTransition, match="is not a runtime transition"):
                    check_runtime_transition(previous, new, "started")


# --- what each state allows (ARCHITECTURE §2-§4) -----------------------------------

# The states with each property, written out from ARCHITECTURE (not from lifecycle.STATE_RULES).
ACCEPTS_MESSAGES = {"spawning", "running", "idle", "paused", "stopping"}  # closing is final at once
DELIVERS_MESSAGES = {"spawning", "running", "idle"}  # paused: they queue; stopping: never delivered
STARTS_RUNS = {"running"}
RUNS_POSSIBLE = {"running", "paused"}  # paused: the run SIGSTOP caught may still be finishing
NEEDS_RUNTIME = {"spawning", "running", "stopping"}  # stopping: for its cleanup
WAKES_FOR_MESSAGE = {"idle"}  # a message wakes it; one sent to a paused entity only queues
START_CAUSES = {"spawning": "started", "idle": "wake"}
CLEANUP = {"stopping"}
SHUTTING_DOWN = {"stopping", "stopped", "killed"}


def _states_where(flag: str) -> set[str]:
    return {state.value for state, rules in lifecycle.STATE_RULES.items() if getattr(rules, flag)}


def test_state_rules_cover_every_state() -> None:
    assert list(lifecycle.STATE_RULES) == list(State)


@pytest.mark.parametrize(
    ("flag", "want"),
    [
        ("accepts_messages", ACCEPTS_MESSAGES),
        ("delivers_messages", DELIVERS_MESSAGES),
        ("starts_runs", STARTS_RUNS),
        ("runs_possible", RUNS_POSSIBLE),
        ("needs_runtime", NEEDS_RUNTIME),
        ("wakes_for_message", WAKES_FOR_MESSAGE),
        ("cleanup", CLEANUP),
        ("shutting_down", SHUTTING_DOWN),
        ("terminal", RFC_TERMINAL),
    ],
)
def test_state_rule(flag: str, want: set[str]) -> None:
    assert _states_where(flag) == want


def test_start_causes_are_the_runtime_transitions_to_running() -> None:
    causes = {s.value: r.start_cause for s, r in lifecycle.STATE_RULES.items() if r.start_cause}
    assert causes == START_CAUSES
    for state, cause in causes.items():
        assert lifecycle.runtime_target(State(state), cause) is State.RUNNING


def test_the_rules_agree_with_each_other_and_the_table() -> None:
    for state, r in lifecycle.STATE_RULES.items():
        assert r.terminal is state.terminal is (state in TERMINAL_STATES)
        assert r.accepts_messages is not r.terminal
        assert r.shutting_down is (r.cleanup or r.terminal)
        assert not (r.starts_runs and not r.runs_possible)
        assert not (r.starts_runs and not r.delivers_messages)
        if state in TABLE:
            assert all(c.runs_possible is r.runs_possible for c in TABLE[state].values())
    # SIGTERM's cleanup runs in the state SIGTERM moves a running entity to.
    stopping = cell(State.RUNNING, Signal.SIGTERM).new_state
    assert {s for s in State if lifecycle.STATE_RULES[s].cleanup} == {stopping}


def test_initial_and_hosted_states() -> None:
    assert lifecycle.INITIAL_STATE is State.SPAWNING
    assert [s.value for s in lifecycle.HOSTED_STATES] == ["spawning", "running", "idle", "stopping"]


@pytest.mark.parametrize("message_waiting", [False, True])
@pytest.mark.parametrize("state", RFC_STATES)
def test_needs_runtime(state: str, message_waiting: bool) -> None:
    want = state in NEEDS_RUNTIME or (message_waiting and state in WAKES_FOR_MESSAGE)
    assert lifecycle.needs_runtime(State(state), message_waiting) is want


# --- runtime transitions by cause -------------------------------------------------


@pytest.mark.parametrize(("previous", "new", "cause"), ALLOWED)
def test_runtime_target(previous: str, new: str, cause: str) -> None:
    assert lifecycle.runtime_target(State(previous), cause) is State(new)


@pytest.mark.parametrize(("previous", "new", "cause"), REFUSED)
def test_runtime_target_refused(previous: str, new: str, cause: str) -> None:
    target = lifecycle.runtime_target(State(previous), cause)
    assert target is None or target is not State(new)


def test_runtime_target_of_a_lease_ending() -> None:
    assert lifecycle.runtime_target(State.RUNNING, "runtime_lost") is State.IDLE
    assert lifecycle.runtime_target(State.PAUSED, "runtime_lost") is None
    assert lifecycle.runtime_target(State.RUNNING, "released") is None


# --- message-scoped SIGINT: it touches its own message only (ARCHITECTURE §5) ----------

# (state, how far the message got) → (outcome, whether the server cancels the message now),
# written out: a message that has not started is cancelled at once in every state; one whose
# run started is the runtime's to abort where a run may be in progress, ignored while stopping
# (the cleanup's), and cancelled where no run can be in progress (idle: its run was lost).
SCOPED: dict[tuple[str, str], tuple[str, bool]] = {
    ("spawning", "queued"): ("aborted", True),
    ("running", "queued"): ("aborted", True),
    ("idle", "queued"): ("aborted", True),
    ("paused", "queued"): ("aborted", True),
    ("stopping", "queued"): ("aborted", True),
    ("spawning", "started"): ("aborted", True),
    ("running", "started"): ("pending", False),
    ("idle", "started"): ("aborted", True),
    ("paused", "started"): ("pending", False),
    ("stopping", "started"): ("ignored", False),
    **{
        (state, "ended"): ("ignored", False)
        for state in ("spawning", "running", "idle", "paused", "stopping")
    },
}


@pytest.mark.parametrize(("state", "progress"), sorted(SCOPED))
def test_scoped_sigint(state: str, progress: str) -> None:
    decision = decide(State(state), Signal.SIGINT, message=MessageProgress(progress))
    assert (decision.outcome.value, decision.cancels_message) == SCOPED[state, progress]
    assert decision.new_state is decision.previous_state is State(state)  # never a transition


@pytest.mark.parametrize("state", sorted(RFC_TERMINAL))
def test_scoped_sigint_to_a_terminal_entity_is_rejected(state: str) -> None:
    with pytest.raises(lifecycle.SignalRejected):
        decide(State(state), Signal.SIGINT, message=MessageProgress.QUEUED)


def test_only_a_scoped_signal_looks_at_its_message() -> None:
    for state, signal in LIVE_CELLS:
        plain = decide(State(state), Signal(signal))
        for progress in MessageProgress:
            scoped = decide(State(state), Signal(signal), message=progress)
            if Signal(signal) not in lifecycle.MESSAGE_SCOPED_SIGNALS:
                assert scoped == plain
            elif not scoped.cancels_message:
                assert scoped.outcome in (plain.outcome, Outcome.IGNORED)


# --- what the runtime records (ARCHITECTURE §1 outcomes, §3-§4) ----------------------

# (action, what the runtime did) → outcome, written out from ARCHITECTURE.
RUNTIME: dict[tuple[str, str], str] = {
    ("abort_run", "acted"): "aborted",  # SIGINT cancelled the run
    ("abort_run", "delivered"): "delivered",  # an exec entity's process got SIGINT
    ("abort_run", "no_target"): "ignored",  # the scoped run had already ended
    ("reload", "acted"): "shutdown_requested",
    ("reload", "delivered"): "delivered",  # SIGHUP passed on to a process
    ("reload", "no_target"): "ignored",
    ("cleanup", "acted"): "shutdown_requested",
    ("deliver", "acted"): "delivered",
    ("deliver", "delivered"): "delivered",  # on_signal ran (or none was registered)
    ("deliver", "no_target"): "ignored",
    ("kill", "acted"): "transitioned",
    ("pause", "delivered"): "transitioned",  # the state change is the outcome; the freeze its means
    ("pause", "no_target"): "transitioned",
    ("resume", "delivered"): "transitioned",
    ("resume", "no_target"): "transitioned",
}


@pytest.mark.parametrize(("action", "effect"), list(RUNTIME), ids=[f"{a}-{e}" for a, e in RUNTIME])
def test_runtime_outcome(action: str, effect: str) -> None:
    assert (
        lifecycle.runtime_outcome(Action(action), lifecycle.Effect(effect)).value == RUNTIME[action, effect]
    )


@pytest.mark.parametrize("action", [a for a in Action if a is not Action.NONE])
def test_failed_and_unsupported(action: Action) -> None:
    assert lifecycle.runtime_outcome(action, lifecycle.Effect.FAILED) is Outcome.FAILED
    assert lifecycle.runtime_outcome(action, lifecycle.Effect.UNSUPPORTED) is Outcome.IGNORED


def test_decide_reports_what_the_runtime_records_when_it_acts() -> None:
    for state, signal in LIVE_CELLS:
        for run in (False, True) if state in RUNS_POSSIBLE else (False,):
            d = decide(State(state), Signal(signal), run)
            if d.action not in (None, Action.NONE):
                assert d.outcome is lifecycle.runtime_outcome(d.action, lifecycle.Effect.ACTED)


# --- handlers, defaults, the widgets' table -----------------------------------------


def test_handleable_signals() -> None:
    # "on_signal may be registered for every signal but SIGKILL and SIGSTOP" (ARCHITECTURE §3).
    assert {s.value for s in lifecycle.HANDLEABLE} == set(RFC_SIGNALS) - {"SIGKILL", "SIGSTOP"}


def test_default_durations() -> None:
    # ARCHITECTURE §1: grace period default 30 s; the idle timeout's default is 60 s.
    assert (lifecycle.DEFAULT_GRACE_MS, lifecycle.DEFAULT_IDLE_TIMEOUT_MS) == (30_000, 60_000)


POSSIBLE: dict[str, set[str]] = {
    "spawning": {"SIGKILL"},
    "running": {"SIGINT", "SIGHUP", "SIGTERM", "SIGKILL", "SIGSTOP", "SIGUSR"},
    "idle": {"SIGTERM", "SIGKILL", "SIGSTOP"},
    "paused": {"SIGINT", "SIGTERM", "SIGKILL", "SIGCONT", "SIGUSR"},
    "stopping": {"SIGKILL"},
    "stopped": set(),
    "killed": set(),
}


@pytest.mark.parametrize("state", RFC_STATES)
def test_possible_signals(state: str) -> None:
    assert {s.value for s in lifecycle.possible_signals(State(state))} == POSSIBLE[state]


# --- the rendered table agrees with the RFC ----------------------------------------


def test_markdown_table_agrees_with_the_rfc() -> None:
    # The Markdown rendering lives in the docs generator, a script outside the package.
    gendocs = runpy.run_path(str(Path(__file__).resolve().parent.parent / "scripts" / "gendocs.py"))
    signals, cells = _parse_markdown_table(gendocs["markdown_table"]())
    assert signals == RFC_SIGNALS
    assert list(cells) == RFC_STATES
    for state, signal in ALL_CELLS:
        rfc, ours = RFC_CELLS[state][signal], cells[state][signal]
        if rfc.startswith("→ ") or state in RFC_TERMINAL:
            assert ours == rfc
        else:
            assert ours.startswith(rfc)
    # The run-dependent paused cells say what happens when a run is still finishing.
    assert "abort" in cells["paused"]["SIGINT"]
    assert "deliver" in cells["paused"]["SIGUSR"]


# --- no I/O ---------------------------------------------------------------------


def test_module_imports_nothing_that_does_io() -> None:
    tree = ast.parse(inspect.getsource(lifecycle))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import"
            imported.add(node.module or "")
    # lifecycle_names holds the vocabulary (enums), _signal_names parses signal names (text only).
    assert imported == {"__future__", "dataclasses", "electric_sdk.lifecycle_names"}
    names = ast.parse(inspect.getsource(importlib.import_module("electric_sdk.lifecycle_names")))
    assert {n.module for n in ast.walk(names) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(names) if isinstance(n, ast.Import) for a in n.names
    } == {"__future__", "enum", "electric_sdk._signal_names"}
    parser = ast.parse(inspect.getsource(importlib.import_module("electric_sdk._signal_names")))
    assert {n.module for n in ast.walk(parser) if isinstance(n, ast.ImportFrom)} == {
        "__future__",
        "collections.abc",
        "typing",
    }
    # No dynamic imports or file access either; print() appears only under __main__.
    main_guard = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    body = [n for n in tree.body if n not in main_guard]
    names = {n.id for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    assert not names & {"open", "print", "input", "exec", "eval", "__import__", "compile"}
