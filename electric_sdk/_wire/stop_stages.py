"""How far a signal has reached, folded from the entity's stream: the one home of a signal's
staged answer (issue 48, "Staged receipts").

Which signal has which stage is ``lifecycle.STAGES``; this module says how the
stream shows each one. Every door folds the same way: the server folds the
entity's commits for ``SignalEntity``'s ``wait`` (gRPC's and HTTP's; server
core/signal_answers.py), and the SDK folds its own watch where it goes on
past the server's answer (client/_stages.py). Each feeds the events after the
signal's record, in order, to ``StageFollow.see`` until ``done``; a watch that
resumes after a reconnect goes on feeding the same fold. ``report_to_pb`` and
``report_from_pb`` are a stage's gRPC form (``SignalEntityResponse.stages``).

What each stage is, in the stream (the signal's answer says what was in
progress when it landed: ``run_message_key``, ``process_running``):

- ``accepted``: the signal's own record (the answer without a wait);
- ``handled`` (SIGUSR): the signal's outcome update, once its handler
  returned (``delivered``; ``failed`` when it raised); an outcome that says it
  was not delivered (``ignored``) means it never will be;
- ``unwound``: the end record of the run in progress (a scoped SIGINT: of its
  message's run, if that one was running); none in progress: the signal's own
  settling, and the detail says so ("no run was in progress"; a scoped SIGINT's
  "message M was not running"). For SIGTERM also the end of the cleanup: the
  entity `stopped`;
- ``downstream``: every MCP call, A2A call and child entity of that run told, and
  each ended or past its bound: each call cut shows as an ``electric.mcp`` (or
  ``electric.a2a``) record of that run (``cancelled``, ``ended``, ``bound_passed``;
  runtime/mcp.py and runtime/a2a_calls.py write them before the run's end); the
  detail names each. A run that delegated to
  children and was cut short has an ``electric.child`` ``interrupting`` record
  just before its end, then the server's ``told`` record of it, naming each
  child and what its signal came to (server core/child_interrupts.py): a
  SIGINT's child is settled by it (its run aborted, its message cancelled, or
  nothing of it left to abort); a SIGTERM's child once its end is recorded
  (``electric.child`` ``ended``) or its bound passed (its grace ends by the
  parent's: the parent's `stopped` by ``grace_expired``). A SIGKILL's children
  are killed by the server's cascade, unrecorded when the parent's stream has
  closed: the detail says so. A run with none reaches it with ``unwound``. An
  entity ended (SIGKILL, the grace deadline) refuses writes: the calls its end
  cut are cancelled unrecorded, and the detail says so;
- ``reaped``: the exit receipt of the exec process that was running; none: at
  once;
- ``terminal``: the entity's `stopped` or `killed` state record.

A stage that cannot be reached any more says why (``detail``): the worker was
lost (the entity went `idle` with ``runtime_lost``), the stream closed, the
signal's own record says the table ignored it (at once: nothing comes of it;
``lifecycle.ignored_stops_nothing`` names the exception), or the wait's timeout
passed first (``StageFollow.timed_out``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .._proto.electric.v1 import entity_service_pb2 as api
from ..lifecycle import (
    TERMINAL_STATES,
    Outcome,
    Signal,
    Stage,
    State,
    cell,
    check_stage,
    ignored_stops_nothing,
    stages_of,
)
from .times import from_iso, set_timestamp_ms, timestamp_to_datetime, to_iso

__all__ = [
    "NOT_WITHIN",
    "StageFollow",
    "StageReport",
    "bound_passed",
    "parse_stage",
    "report_from_pb",
    "report_to_pb",
]

_RUN_ENDS = ("completed", "failed", "aborted")
# What a stage not reached says when the wait's bound passed first.
NOT_WITHIN = "not reached within "
_MCP_EVENT = "electric.mcp"  # runtime/mcp.py's records
_A2A_EVENT = "electric.a2a"  # runtime/a2a_calls.py's, in the same phases
_MCP_ENDS = ("ended", "cancelled", "bound_passed")
_CHILD_EVENT = "electric.child"  # the runtime's delegations, the server's told and ended records
_TERMINAL = frozenset(state.value for state in TERMINAL_STATES)
# Outcomes that settle a signal without its handler having run.
_NOT_DELIVERED = ("ignored",)


def parse_stage(signal: Signal, text: str) -> Stage:
    """``text`` as a stage of ``signal``: ``ValueError`` for an unknown name, ``StageUnavailable``
    for a stage ``signal`` does not have."""
    try:
        stage = Stage(text.strip().lower())
    except ValueError:
        names = ", ".join(s.value for s in Stage)
        raise ValueError(f"unknown stage {text[:40]!r}; stages: {names}") from None
    check_stage(signal, stage)
    return stage


@dataclass
class StageReport:
    """One stage: reached (at which record's offset, when), or not (and why)."""

    stage: Stage
    reached: bool = False
    offset: int | None = None
    at: str | None = None  # the record's time, RFC 3339
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage.value,
            "reached": self.reached,
            "offset": self.offset,
            "at": self.at,
            "detail": self.detail,
        }


def bound_passed(reports: Iterable[StageReport]) -> bool:
    """Whether a wait's bound ended it with a stage still to come (not ruled out)."""
    return any(not r.reached and r.detail.startswith(NOT_WITHIN) for r in reports)


def report_to_pb(report: StageReport) -> api.StageReport:
    """The gRPC form of a stage (``SignalEntityResponse.stages``)."""
    message = api.StageReport(stage=report.stage.value, reached=report.reached, detail=report.detail)
    if report.offset is not None:
        message.offset = report.offset
    if report.at is not None:
        set_timestamp_ms(message.at, round(from_iso(report.at).timestamp() * 1000))
    return message


def report_from_pb(message: api.StageReport) -> StageReport:
    """A stage as the gRPC door answered it (a stage this SDK does not know is refused)."""
    return StageReport(
        Stage(message.stage),
        message.reached,
        message.offset if message.HasField("offset") else None,
        to_iso(timestamp_to_datetime(message.at)) if message.HasField("at") else None,
        message.detail,
    )


@dataclass
class StageFollow:
    """A signal's stages, as the events seen so far tell them; ``wait`` is the stage its caller
    waits for (``done`` once it, and every stage before it, is settled)."""

    signal: Signal
    key: str  # the signal record's key
    offset: int  # its offset
    at: str  # its time
    wait: Stage
    run_message_key: str = ""  # the run in progress when it landed
    process_running: bool = False
    message_key: str = ""  # a scoped SIGINT's message
    # The signal's outcome in its own record, and the entity's state it landed in: a signal the
    # table ignored is settled at once (``_ignored``).
    outcome: Outcome | None = None
    state: State | None = None
    reports: dict[Stage, StageReport] = field(default_factory=dict)
    next_offset: int = 0
    _run_end: tuple[int, str] | None = None
    _unwound_detail: str = ""  # why unwound came with the signal's own record: nothing ran
    _stopped: tuple[int, str] | None = None
    # The run's MCP calls seen after the signal: call id -> (what, its end's offset and time).
    _calls: dict[str, tuple[str, tuple[int, str] | None]] = field(default_factory=dict)
    # The run's children: due a ``told`` record (its ``interrupting`` record seen), the told
    # children once it came (and where), each child's end seen, and whether the entity's grace
    # deadline passed (so each SIGTERM child's bound did).
    _children_due: bool = False
    _told: list[dict[str, Any]] | None = None
    _told_at: tuple[int, str] | None = None
    _child_ends: dict[str, tuple[str, int, str]] = field(default_factory=dict)
    _grace_passed: bool = False

    def __post_init__(self) -> None:
        check_stage(self.signal, self.wait)
        self.reports = {stage: StageReport(stage) for stage in stages_of(self.signal)}
        self.next_offset = self.offset + 1
        self._reach(Stage.ACCEPTED, self.offset, self.at)
        if not self._watches_run:
            self._run_end = (self.offset, self.at)  # nothing to unwind but the signal's settling
            # Said, as reaped's "no process was running" is: an answer of unwound at the signal's
            # own offset is otherwise indistinguishable from a run that ended in that instant.
            if not self.message_key:
                self._unwound_detail = "no run was in progress"
            elif self.run_message_key:
                self._unwound_detail = f"message {self.message_key} was not the run in progress"
            else:
                self._unwound_detail = f"message {self.message_key} was not running"
        if not self.process_running:
            self._reach(Stage.REAPED, self.offset, self.at, "no process was running")
        self._judge_unwound()
        if self.outcome is Outcome.IGNORED and self.state is not None:
            self._ignored(self.state)

    @property
    def _watches_run(self) -> bool:
        run = self.run_message_key
        return bool(run) and (not self.message_key or self.message_key == run)

    @property
    def done(self) -> bool:
        """Whether the stage waited for, and every one before it, is settled."""
        for stage, report in self.reports.items():
            if not report.reached and not report.detail:
                return False
            if stage is self.wait:
                return True
        return True

    @property
    def reached(self) -> bool:
        """Whether the stage waited for was reached."""
        return self.reports[self.wait].reached

    def see(self, type: str, key: str, value: dict[str, Any], offset: int, at: str) -> None:
        """Fold one event after the signal's record (its type, key, RFC value, offset, time)."""
        self.next_offset = max(self.next_offset, offset + 1)
        if type == "signal" and key == self.key:
            self._settled(value.get("outcome"), str(value.get("detail", "")), offset, at)
        elif type == "run" and self._watches_run and value.get("message_key") == self.run_message_key:
            if value.get("status") in _RUN_ENDS and self._run_end is None:
                self._run_end = (offset, at)
        elif type in (_MCP_EVENT, _A2A_EVENT) and self._watches_run:
            data = value.get("data")  # a custom event's value: {"data": ...}
            if isinstance(data, dict) and data.get("run") == self.run_message_key:
                self._mcp(data, offset, at)
        elif type == _CHILD_EVENT:
            data = value.get("data")
            if isinstance(data, dict):
                self._child(data, offset, at)
        elif type == "exec" and value.get("action") == "exit" and self.process_running:
            self._reach(Stage.REAPED, offset, at)
        elif type == "state":
            state = value.get("state")
            if state in _TERMINAL:
                self._grace_passed = value.get("cause") == "grace_expired"
                self._stopped = (offset, at)
                self._reach(Stage.TERMINAL, offset, at)
            elif state == "idle" and value.get("cause") == "runtime_lost":
                self._lost("the worker was lost")
        self._judge_unwound()

    def stream_closed(self) -> None:
        """The stream ended: what is not reached now never will be."""
        report = self.reports.get(Stage.DOWNSTREAM)
        if report is not None and not report.reached and not report.detail and self._told:
            _, _, said = self._children()
            report.detail = "the entity's stream closed before its children's ends: " + "; ".join(said)
        self._lost("the entity's stream closed", terminal_too=True)

    def timed_out(self, bound: str) -> None:
        """The wait's timeout passed: the stages not reached say so."""
        for report in self.reports.values():
            if not report.reached and not report.detail:
                report.detail = NOT_WITHIN + bound

    def finish(self) -> None:
        """The wait is over: a later stage neither reached nor ruled out by then says so."""
        for report in self.reports.values():
            if not report.reached and not report.detail:
                report.detail = "not waited for"

    def to_json(self) -> list[dict[str, Any]]:
        return [report.to_json() for report in self.reports.values()]

    # -- the rules ------------------------------------------------------------------------------

    def _settled(self, outcome: object, detail: str, offset: int, at: str) -> None:
        if outcome == "pending" or Stage.HANDLED not in self.reports:
            return
        if outcome in _NOT_DELIVERED:
            self.reports[Stage.HANDLED].detail = f"not delivered ({outcome}): {detail}".rstrip(": ")
        else:
            self._reach(Stage.HANDLED, offset, at, detail if outcome == "failed" else "")

    def _judge_unwound(self) -> None:
        if Stage.UNWOUND not in self.reports or self._run_end is None:
            return
        end = self._run_end
        if self.signal is Signal.SIGTERM:  # and its cleanup: the entity stopped
            if self._stopped is None:
                return
            end = max(end, self._stopped)
        self._reach(Stage.UNWOUND, *end, self._unwound_detail)
        self._judge_downstream(end)

    def _ignored(self, state: State) -> None:
        """The table ignored the signal in ``state`` (its record says so as it lands): what is not
        reached by now never comes of it (``lifecycle.ignored_stops_nothing``), so the answer does
        not wait out its bound for it."""
        if state.terminal or not ignored_stops_nothing(state, self.signal):
            return  # (a terminal state has no cell: its signals are refused, never ignored)
        why = f"{self.signal.value} in {state.value} is {cell(state, self.signal).text}"
        for stage, report in self.reports.items():
            if not report.reached and not report.detail:
                report.detail = f"not delivered: {why}" if stage is Stage.HANDLED else why

    def _mcp(self, value: dict[str, Any], offset: int, at: str) -> None:
        call, phase = str(value.get("call", "")), value.get("phase")
        if "agent" in value:  # an A2A call's
            what = f"A2A {value.get('agent')} task {value.get('task') or '(unnamed)'} {phase}"
        else:
            what = f"MCP {value.get('server')}/{value.get('tool')} {phase}"
        if value.get("reason"):
            what += f" ({value.get('reason')})"
        if phase == "started":
            self._calls.setdefault(call, (what, None))
        elif phase in _MCP_ENDS:
            self._calls[call] = (what, (offset, at))

    def _child(self, data: dict[str, Any], offset: int, at: str) -> None:
        phase = data.get("phase")
        if phase == "ended":
            self._child_ends[str(data.get("child"))] = (str(data.get("state")), offset, at)
        elif not self._watches_run or data.get("run") != self.run_message_key:
            return
        elif phase == "interrupting":
            self._children_due = True
        elif phase == "told" and self._told is None:
            children = data.get("children")
            self._told = [c for c in children if isinstance(c, dict)] if isinstance(children, list) else []
            self._told_at = (offset, at)

    def _children(self) -> tuple[bool, list[tuple[int, str]], list[str]]:
        """Whether the run's children are settled; the records that settled them; each one said."""
        if not self._children_due:
            return True, [], []
        if self._told is None or self._told_at is None:
            if self.signal is Signal.SIGKILL:  # the parent's end may close its stream first
                return True, [], ["children: killed by the server's cascade (unrecorded: the entity ended)"]
            return False, [], []
        settled, at, said = True, [self._told_at], []
        for child in self._told:
            url = str(child.get("child"))
            what = f"{url} {child.get('signal', '')} {child.get('outcome', '')}".replace("  ", " ")
            if child.get("detail"):
                what += f" ({child.get('detail')})"
            ended = self._child_ends.get(url)
            if ended is not None:
                what += f", ended {ended[0]}"
                at.append(ended[1:])
            elif child.get("signal") == Signal.SIGTERM.value and child.get("state") not in _TERMINAL:
                if self._grace_passed and self._stopped is not None:
                    bound = child.get("bound") or "the parent's grace deadline"
                    what += f", its bound passed ({bound})"
                    at.append(self._stopped)
                else:
                    settled = False
            said.append(what)
        return settled, at, ["children: " + "; ".join(said)] if said else []

    def _judge_downstream(self, end: tuple[int, str]) -> None:
        """With the run's end seen (its cut calls' records come before it): every call seen ended,
        and every child of the run told and settled."""
        if any(ended is None for _, ended in self._calls.values()):
            return
        settled, children_at, children = self._children()
        if not settled:
            return
        if not self._calls and not self._told:
            detail = "no MCP call, A2A call or child entity in flight"
            if self._cut_by_end:
                detail += " recorded (calls cut by the entity's end are cancelled unrecorded)"
            self._reach(Stage.DOWNSTREAM, *end, "; ".join([detail, *children]))
            return
        last = max([end, *children_at, *(ended for _, ended in self._calls.values() if ended is not None)])
        said = ["; ".join(what for what, _ in self._calls.values())] if self._calls else []
        self._reach(Stage.DOWNSTREAM, *last, "; ".join([*said, *children]))

    @property
    def _cut_by_end(self) -> bool:
        """The run was cut by the entity's end (SIGKILL; the grace deadline, whose run's end comes
        after `stopped`): the ended entity refused its MCP calls' records."""
        if self.signal is Signal.SIGKILL:
            return True
        stopped, end = self._stopped, self._run_end
        return stopped is not None and end is not None and end[0] > stopped[0] and self._watches_run

    def _reach(self, stage: Stage, offset: int, at: str, detail: str = "") -> None:
        report = self.reports.get(stage)
        if report is not None and not report.reached:
            report.reached, report.offset, report.at, report.detail = True, offset, at, detail

    def _lost(self, why: str, terminal_too: bool = False) -> None:
        """What is not reached now waits for a runtime that is gone (the entity's end does not:
        a stopping entity's deadline still ends it, unless the stream itself closed)."""
        for stage, report in self.reports.items():
            if not report.reached and not report.detail and (terminal_too or stage is not Stage.TERMINAL):
                report.detail = why
