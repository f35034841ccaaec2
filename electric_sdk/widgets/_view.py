"""What the widgets show, computed from facts: no widget, no I/O.

``EntityView`` folds an entity's stream into the facts a control panel needs
(state, whether a run is in progress, the grace deadline, the last events);
which signals are worth a button comes from ``lifecycle.valid_signals`` for
those facts, never from a rule of our own.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from .._wire.times import from_iso
from ..errors import ElectricError
from ..event_text import event_line
from ..lifecycle import STATE_RULES, Signal, Stage, State, stages_of, valid_signals
from ..models import Entity, EntityRef, Event, SignalManyResult, SignalResult

# The six lifecycle buttons: label, what it does (the tooltip), ipywidgets button style.
# SIGUSR has its own row (a payload box), so it is not here.
SIGNAL_BUTTONS: dict[Signal, tuple[str, str, str]] = {
    Signal.SIGINT: ("Interrupt", "SIGINT: abort the run in progress; the entity stays alive", ""),
    Signal.SIGSTOP: ("Pause", "SIGSTOP: finish the current run, start no new one", ""),
    Signal.SIGCONT: ("Resume", "SIGCONT: deliver the queued messages again", ""),
    Signal.SIGHUP: ("Reload", "SIGHUP: finish the run, then pick up new code on the next wake", ""),
    Signal.SIGTERM: ("Stop", "SIGTERM: stop gracefully, within the grace period", "warning"),
    Signal.SIGKILL: ("Kill", "SIGKILL: stop at once; no handler runs", "danger"),
}

# Background and text colour of each state's badge.
BADGE_COLOURS: dict[State, tuple[str, str]] = {
    State.SPAWNING: ("#6c757d", "#ffffff"),
    State.RUNNING: ("#198754", "#ffffff"),
    State.IDLE: ("#0d6efd", "#ffffff"),
    State.PAUSED: ("#fd7e14", "#ffffff"),
    State.STOPPING: ("#ffc107", "#212529"),
    State.STOPPED: ("#495057", "#ffffff"),
    State.KILLED: ("#dc3545", "#ffffff"),
}

_RUN_OPEN = frozenset({"started", "step"})
_RUN_CLOSED = frozenset({"completed", "aborted", "failed", "input_required"})


def runs_possible(state: State | None) -> bool:
    """Whether a run can be in progress in ``state`` at all (the lifecycle says)."""
    return state is not None and STATE_RULES[state].runs_possible


def badge_html(state: State | None) -> str:
    """The state as a coloured pill; ``data-state`` lets tests and CSS find it."""
    if state is None:
        return "<span class='electric-badge' data-state='' style='color:#6c757d'>loading…</span>"
    background, colour = BADGE_COLOURS[state]
    return (
        f"<span class='electric-badge' data-state='{state.value}' style='background:{background};"
        f"color:{colour};padding:2px 10px;border-radius:10px;font-weight:600;font-family:monospace'>"
        f"{state.value}</span>"
    )


def describe(exc: BaseException) -> str:
    """An error as one line for people: the SDK's code and message, never a traceback."""
    if isinstance(exc, ElectricError):
        return f"{exc.code}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


def error_html(text: str) -> str:
    return f"<span class='electric-error' style='color:#dc3545'>{html.escape(text)}</span>"


def alert_html(text: str) -> str:
    """An error that needs the person's hand, as a box whose text wraps."""
    return (
        "<div class='electric-error' style='white-space:normal;line-height:1.4;color:#842029;"
        "background:#f8d7da;border:1px solid #f5c2c7;border-radius:4px;padding:4px 10px;"
        f"margin:2px 0'>{html.escape(text)}</div>"
    )


def note_html(text: str) -> str:
    return f"<span class='electric-note' style='color:#495057'>{html.escape(text)}</span>"


def result_text(result: SignalResult | SignalManyResult, signal: Signal) -> str:
    """What a signal did, in one line."""
    if isinstance(result, SignalManyResult):
        return (
            f"{signal.value}: {result.signalled} signalled, {result.ignored} ignored, "
            f"{result.skipped} skipped, {result.not_found} not found"
        )
    outcome = f", {result.outcome.value}" if result.outcome else ""
    return f"{result}{outcome} (txid {result.txid})"


# How long a button's answer waits for its stage: past it, the line says the stage was not
# reached yet (the signal stays sent). SIGTERM's end is bounded by the entity's grace already.
BUTTON_STAGE_WAIT_S = 60.0


def button_stage(signal: Signal) -> Stage | None:
    """The stage a button's answer waits for: the last the signal has (``lifecycle.STAGES``),
    None when it has only ``accepted``."""
    stages = stages_of(signal)
    return stages[-1] if len(stages) > 1 else None


def stages_text(result: SignalResult) -> str:
    """``accepted ✓ · unwound ✓ · downstream ✓``, or ``… · terminal ✗ (the worker was lost)``."""
    parts = []
    for report in result.stages:
        mark = "✓" if report.reached else f"✗ ({report.detail})"
        parts.append(f"{report.stage.value} {mark}")
    return " · ".join(parts)


def parse_payload(text: str) -> Any:
    """The SIGUSR payload box: JSON, or empty for no payload. ValueError says what is wrong."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"payload is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None


def _deadline(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    return from_iso(value)


@dataclass(frozen=True)
class EntityView:
    """One entity as its control panel shows it; ``apply`` folds the next event in.

    Whether a run is in progress follows the stream's run events: STARTED (or
    a STEP) opens one, COMPLETED, ABORTED or FAILED closes it, and entering a
    state in which no run can be going (idle, stopping, ...) closes it too.
    """

    ref: EntityRef
    log_size: int = 20
    state: State | None = None
    run_in_progress: bool = False
    stopping_deadline: datetime | None = None
    closed: bool = False
    events: tuple[Event, ...] = ()
    error: str | None = None
    # The code version its run waits for (no worker of it is connected), as the entity said last.
    waiting_for_code: str | None = None
    # The question its last run asked (ctx.ask), while no reply came: the next message answers it.
    awaiting_input: str | None = None

    def with_entity(self, entity: Entity) -> EntityView:
        return replace(
            self,
            state=entity.state,
            waiting_for_code=entity.waiting_for_code,
            awaiting_input=entity.awaiting_input.question if entity.awaiting_input else None,
            stopping_deadline=entity.stopping_deadline,
            closed=entity.closed,
            run_in_progress=self.run_in_progress and runs_possible(entity.state),
        )

    def apply(self, event: Event) -> EntityView:
        events = (*self.events, event)[-self.log_size :] if self.log_size > 0 else ()
        view = replace(self, events=events)
        if event.type == "run":
            status = event.value.get("status")
            if status in _RUN_OPEN and runs_possible(view.state):
                view = replace(view, run_in_progress=True, awaiting_input=None)
            elif status in _RUN_CLOSED:
                view = replace(view, run_in_progress=False, awaiting_input=event.value.get("question"))
        elif event.type == "state" and event.state is not None:
            state = event.state
            view = replace(
                view,
                state=state,
                stopping_deadline=_deadline(event.value.get("deadline"))
                if STATE_RULES[state].cleanup
                else None,
                run_in_progress=view.run_in_progress and runs_possible(state),
            )
        return view

    def enabled(self) -> frozenset[Signal]:
        """The signals with an effect now: the lifecycle table's answer for these facts."""
        if self.state is None:
            return frozenset()
        return frozenset(valid_signals(self.state, self.run_in_progress))

    def grace_left_s(self, now: datetime | None = None) -> float | None:
        """Seconds until the grace deadline while stopping; None otherwise."""
        if self.state is None or not STATE_RULES[self.state].cleanup or self.stopping_deadline is None:
            return None
        return (self.stopping_deadline - (now or datetime.now(UTC))).total_seconds()

    def status_text(self, now: datetime | None = None) -> str:
        """The words beside the badge: a run in progress, the stop countdown, the end of the stream."""
        left = self.grace_left_s(now)
        if left is not None:
            return f"grace ends in {left:.1f} s" if left > 0 else "grace expired; the server stops it now"
        if self.closed:
            return "stream closed"
        if self.waiting_for_code:
            return f"waiting for code {self.waiting_for_code}"
        if self.awaiting_input is not None:
            return f"awaiting input: {self.awaiting_input}"
        if self.run_in_progress and runs_possible(self.state):
            return "run in progress"
        return ""

    def log_html(self) -> str:
        """The last events, one line each as ``electric events`` prints them (a line too long for
        the panel scrolls sideways rather than wrapping)."""
        lines = [event_line(e) for e in self.events]
        body = html.escape("\n".join(lines)) if lines else "no events yet"
        return (
            "<pre class='electric-log' style='margin:0;font-family:monospace;font-size:12px;"
            f"line-height:1.35;white-space:pre;overflow-x:auto'>{body}</pre>"
        )
