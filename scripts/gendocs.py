"""Generate the tables of docs/signals.md, docs/runtime.md and docs/server.md from their code.

`python scripts/gendocs.py` rewrites the generated blocks of docs/signals.md:
the state tables (`markdown_table()`: the RFC's from `TABLE`, then the other
rules' tables) and a Mermaid state diagram built from `TABLE` and
`RUNTIME_TRANSITIONS`; and the
block of docs/runtime.md that says, for each signal, when it acts on a run
(`SIGNAL_TIMING`) and what it does to an idle entity (`TABLE`); and two
tables of docs/server.md: the options, from the server's settings table
(server/electric_server/settings.py: each flag, its default, its range), and
the fast paths, from their registry (server/electric_server/fastpaths/__init__.py:
each with what it buys, what it risks, its fallback and its bench row); and the A2A
task states of docs/a2a.md, from server/electric_server/a2a/states.py. Each block
sits between a `<!-- BEGIN GENERATED: ... -->` marker and the next
`<!-- END GENERATED -->`; the prose around the blocks is the page's own and is
kept as it is. If the page does not exist yet it is created from a starter
page. `python scripts/gendocs.py --check` writes nothing and exits 1 if the
page is stale, so drift between the lifecycle table and its docs fails CI.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "signals.md"
RUNTIME_DOC = ROOT / "docs" / "runtime.md"
SERVER_DOC = ROOT / "docs" / "server.md"
BUSY_DOC = ROOT / "docs" / "double-texting.md"
A2A_DOC = ROOT / "docs" / "a2a.md"
for _path in (ROOT / "server", ROOT):  # run as a script from a checkout: import the code from it
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from electric_server.fastpaths import BENCH, FAST_PATHS  # noqa: E402
from electric_server.settings import SETTINGS, Setting  # noqa: E402

from electric_sdk.busy import POLICIES  # noqa: E402
from electric_sdk.lifecycle import (  # noqa: E402
    CLOSING_RECORDS,
    DEFAULT_GRACE_MS,
    DEFAULT_IDLE_TIMEOUT_MS,
    HANDLEABLE,
    MESSAGE_SCOPED_SIGNALS,
    OPT_IN_TIMING,
    PAYLOAD_SIGNALS,
    RELOAD_SIGNALS,
    RUNTIME_OUTCOMES,
    RUNTIME_TRANSITIONS,
    SIGNAL_TIMING,
    STAGES,
    STATE_RULES,
    TABLE,
    TERMINAL_STATES,
    Action,
    Effect,
    Record,
    Signal,
    State,
    decide_waiting,
)

TABLE_BEGIN = "<!-- BEGIN GENERATED: lifecycle table -->"
DIAGRAM_BEGIN = "<!-- BEGIN GENERATED: state diagram -->"
TIMING_BEGIN = "<!-- BEGIN GENERATED: signal timing -->"
OPTIONS_BEGIN = "<!-- BEGIN GENERATED: server options -->"
FASTPATHS_BEGIN = "<!-- BEGIN GENERATED: fast paths -->"
WAITING_BEGIN = "<!-- BEGIN GENERATED: waiting run -->"
STAGES_BEGIN = "<!-- BEGIN GENERATED: stop stages -->"
POLICIES_BEGIN = "<!-- BEGIN GENERATED: busy policies -->"
A2A_STATES_BEGIN = "<!-- BEGIN GENERATED: a2a task states -->"
END = "<!-- END GENERATED -->"
_ANY_BEGIN = "<!-- BEGIN GENERATED"


class MarkerError(ValueError):
    """The page's generated-block markers are missing, duplicated or unbalanced."""


def _yes(flag: bool) -> str:
    return "yes" if flag else ""


def _state_rules_table() -> list[str]:
    lines = [
        "| State | accepts messages | delivers messages | starts runs | run may be in progress "
        "| leased to a runtime | taken up with cause | SIGTERM cleanup | shutting down |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for state, r in STATE_RULES.items():
        leased = "always" if r.needs_runtime else "when a message waits" if r.wakes_for_message else ""
        cells = [
            _yes(r.accepts_messages),
            _yes(r.delivers_messages),
            _yes(r.starts_runs),
            _yes(r.runs_possible),
            leased,
            r.start_cause or "",
            _yes(r.cleanup),
            "terminal" if r.terminal else _yes(r.shutting_down),
        ]
        lines.append(f"| `{state.value}` | " + " | ".join(cells) + " |")
    return lines


def _outcomes_table() -> list[str]:
    effects = list(Effect)
    lines = [
        "| Action | " + " | ".join(e.value.replace("_", " ") for e in effects) + " |",
        "|---|" + "---|" * len(effects),
    ]
    for action, row in RUNTIME_OUTCOMES.items():
        lines.append(
            f"| {action.value.replace('_', ' ')} | " + " | ".join(f"`{row[e].value}`" for e in effects) + " |"
        )
    return lines


def markdown_table() -> str:
    """The RFC table, rendered from TABLE, and the other rules' tables, for the docs."""
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
    lines.append("")
    lines.append("What each state allows:")
    lines.append("")
    lines.extend(_state_rules_table())
    lines.append("")
    lines.append("The outcome the runtime records, by the cell's action and by what it did:")
    lines.append("")
    lines.extend(_outcomes_table())
    lines.append("")

    def names(signals: frozenset[Signal]) -> str:
        return ", ".join(s.value for s in Signal if s in signals)

    lines.append(
        f"Profile defaults: grace period {DEFAULT_GRACE_MS / 1000:g} s, idle timeout "
        f"{DEFAULT_IDLE_TIMEOUT_MS / 1000:g} s. `on_signal` may be registered for {names(HANDLEABLE)}. "
        f"Only {names(PAYLOAD_SIGNALS)} carries a payload; only {names(MESSAGE_SCOPED_SIGNALS)} can be "
        f"scoped to a message; {names(RELOAD_SIGNALS)} marks the entity's next wake for the version selected for new wakes."
    )
    terminal = " and ".join(f"`{s.value}`" for s in State if s in TERMINAL_STATES)
    closing = ", ".join(r.value for r in Record if r in CLOSING_RECORDS)
    lines.append("")
    lines.append(
        f"After the end ({terminal}) a runtime may append only its closing records, within the "
        f"server's settle: {closing}. Anything else is refused with `ENTITY_TERMINAL`."
    )
    return "\n".join(lines) + "\n"


def mermaid_diagram() -> str:
    """A Mermaid stateDiagram-v2 of every transition, from TABLE and RUNTIME_TRANSITIONS.

    Upper-case labels are signals (the server writes the transition); lower-case
    labels are the causes of the transitions the runtime or the reaper writes.
    """
    edges: dict[tuple[State, State], list[str]] = {}
    for state, row in TABLE.items():
        for signal, c in row.items():
            if c.new_state is not None:
                edges.setdefault((state, c.new_state), []).append(signal.value)
    for (previous, new), causes in RUNTIME_TRANSITIONS.items():
        edges.setdefault((previous, new), []).extend(sorted(causes))
    targets = {new for _, new in edges}
    lines = ["stateDiagram-v2"]
    lines += [f"    [*] --> {s.value}" for s in State if s not in targets and s not in TERMINAL_STATES]
    lines += [f"    {a.value} --> {b.value}: {', '.join(labels)}" for (a, b), labels in edges.items()]
    lines += [f"    {s.value} --> [*]" for s in State if s in TERMINAL_STATES]
    return "\n".join(lines) + "\n"


def timing_table() -> str:
    """For each signal: when it acts on a run in progress, what it does in `running`, what it
    does when it reaches an `idle` entity (no worker is woken for it), and who handles it; then
    each per-type opt-in (``OPT_IN_TIMING``): its signal's row at the timing it opts in to."""
    lines = [
        "| Signal | acts on a run in progress | in `running` | reaching an `idle` entity | `on_signal` |",
        "|---|---|---|---|---|",
    ]
    rest: dict[Signal, str] = {}
    for signal in Signal:
        in_running, at_idle = (
            f"→ `{c.new_state.value}`" if c.new_state else c.text
            for c in (TABLE[State.RUNNING][signal], TABLE[State.IDLE][signal])
        )
        idle = TABLE[State.IDLE][signal]
        if signal in HANDLEABLE and idle.action_not_running is Action.NONE:
            what = "no cleanup runs" if signal is Signal.SIGTERM else "no handler is called"
            at_idle += f"; {what} (no worker is woken)"
        handled = "yes" if signal in HANDLEABLE else "no: the runtime enforces it"
        rest[signal] = f"{in_running} | {at_idle} | {handled} |"
        lines.append(f"| {signal.value} | {SIGNAL_TIMING[signal].value} | {rest[signal]}")
    for signal, (option, timing) in OPT_IN_TIMING.items():
        lines.append(f"| per type: {signal.value} with `{option}=True` | {timing.value} | {rest[signal]}")
    return "\n".join(lines) + "\n"


def code_span(text: str) -> str:
    return f"`{text}`"


def _option_cell(s: Setting[Any]) -> str:
    """What a setting does, then who else takes it, where it applies, and where to read more."""
    notes = [
        "`electric dev` takes it too" if s.dev and s.flag else "",
        f"{s.store} only" if s.store else "",
        f"see {s.see}" if s.see else "",
    ]
    unit = f", in {s.kind.unit}" if s.kind.unit else ""
    field = f" (`ServerConfig.{s.name}`{unit})" if s.flag else ""
    return "; ".join(filter(None, [s.help, *notes])) + field


def options_table() -> str:
    """docs/server.md's options: each flag of `electric server` with its default, range and
    help; then the settings only ``ServerConfig`` takes (``electric_sdk.testing``'s keywords)."""
    lines = ["| flag | default | range | |", "|---|---|---|---|"]
    for s in SETTINGS:
        if s.flag is not None:
            flag = s.flag if s.choices or s.kind.action == "store_true" else f"{s.flag} {s.kind.metavar}"
            lines.append(
                f"| `{flag}` | {s.default_words(code_span)} | {s.range_words()} | {_option_cell(s)} |"
            )
    lines += ["", "| `ServerConfig` only | default | range | |", "|---|---|---|---|"]
    for s in SETTINGS:
        if s.flag is None:
            kind = ", ".join(filter(None, [s.kind.name, s.kind.unit]))
            lines.append(
                f"| `{s.name}` ({kind}) | {s.default_words(code_span)} | {s.range_words()} | {_option_cell(s)} |"
            )
    return "\n".join(lines) + "\n"


def fastpath_table() -> str:
    """docs/server.md's fast paths: each with what it buys, what it risks, its fallback, where
    it lives and its bench row (the figures are docs/scaling.md's)."""
    lines = [
        "| fast path | what it buys | what it reaches into or risks | its fallback | where; its bench row |",
        "|---|---|---|---|---|",
    ]
    for path in FAST_PATHS:
        lines.append(
            f"| `{path.name}` | {path.buys} | {path.risks} | {path.fallback} | "
            f"`{path.home}`; `{BENCH}`: {path.row} |"
        )
    return "\n".join(lines) + "\n"


# Each page's blocks come from this code (the check says which).
SOURCES = {
    DOC.name: "electric_sdk/lifecycle.py",
    RUNTIME_DOC.name: "electric_sdk/lifecycle.py",
    SERVER_DOC.name: "server/electric_server/settings.py and fastpaths/__init__.py",
    BUSY_DOC.name: "electric_sdk/busy.py",
    A2A_DOC.name: "server/electric_server/a2a/states.py",
}


# What follows a signal to a run waiting for its code version, by the action decide_waiting gives.
_WAITING_THEN = {
    Action.ABORT_RUN: "the run is aborted, its `aborted` record written with the signal; it never resumes",
    Action.CLEANUP: "`on_signal(SIGTERM)` runs on the version new wakes get, within the grace",
    Action.KILL: "nothing runs again",
    Action.PAUSE: "the run stays bound and waits",
    Action.DELIVER: "`on_signal` gets it from the runtime that next runs the entity",
    Action.NONE: "the run still waits for, and finishes on, its own version",
}


def waiting_table() -> str:
    """What each signal does to an entity whose run waits for its code version (idle, or paused)."""
    lines = ["| signal | from idle | from paused | outcome | then |", "|---|---|---|---|---|"]
    for signal in Signal:
        idle, paused = decide_waiting(State.IDLE, signal), decide_waiting(State.PAUSED, signal)
        outcome = idle.outcome.value
        then = _WAITING_THEN[idle.action or Action.NONE]
        lines.append(
            f"| {signal.value} | {idle.new_state.value} | {paused.new_state.value} | `{outcome}` | {then} |"
        )
    return "\n".join(lines) + "\n"


def stages_table() -> str:
    """Each stage a signal's answer may wait for (``lifecycle.STAGES``): what it means, and which
    signal has it."""
    lines = [
        "| stage | means | " + " | ".join(s.value for s in Signal) + " |",
        "|---|---|" + "---|" * len(Signal),
    ]
    for stage, (means, signals) in STAGES.items():
        marks = " | ".join("✓" if s in signals else "" for s in Signal)
        lines.append(f"| `{stage.value}` | {means} | {marks} |")
    return "\n".join(lines) + "\n"


def a2a_states_table() -> str:
    """The A2A task state each record of the entity's stream makes (``a2a/states.py``'s rows)."""
    from electric_server.a2a.states import ROWS  # no A2A SDK needed: the table is plain data

    lines = ["| stream record | value | A2A task state | means |", "|---|---|---|---|"]
    for row in ROWS:
        record = f"`{row.record}`" if row.record else "(none)"
        value = f"`{row.value}`" if row.value else "any"
        lines.append(f"| {record} | {value} | `{row.state}` | {row.says} |")
    return "\n".join(lines) + "\n"


def policies_table() -> str:
    """What each double-texting policy does while a run is in progress (``busy.POLICIES``)."""
    lines = ["| policy | while a run is in progress | written |", "|---|---|---|"]
    lines += [f"| `{policy.value}` | {does} | {writes} |" for policy, (does, writes) in POLICIES.items()]
    return "\n".join(lines) + "\n"


def blocks(page: str = DOC.name) -> dict[str, str]:
    """Each generated block of ``page`` (a file name): its BEGIN marker and the text that goes
    between the markers."""
    if page == RUNTIME_DOC.name:
        return {TIMING_BEGIN: timing_table()}
    if page == SERVER_DOC.name:
        return {OPTIONS_BEGIN: options_table(), FASTPATHS_BEGIN: fastpath_table()}
    if page == BUSY_DOC.name:
        return {POLICIES_BEGIN: policies_table()}
    if page == A2A_DOC.name:
        return {A2A_STATES_BEGIN: a2a_states_table()}
    return {
        TABLE_BEGIN: markdown_table(),
        WAITING_BEGIN: waiting_table(),
        STAGES_BEGIN: stages_table(),
        DIAGRAM_BEGIN: "```mermaid\n" + mermaid_diagram() + "```\n",
    }


def _splice(text: str, begin: str, body: str) -> str:
    start = text.find(begin)
    if start < 0:
        raise MarkerError(f"marker {begin!r} not found")
    if text.find(begin, start + 1) >= 0:
        raise MarkerError(f"marker {begin!r} appears more than once")
    head = start + len(begin)
    stop = text.find(END, head)
    if stop < 0:
        raise MarkerError(f"{begin!r} has no {END!r} after it")
    if text.find(_ANY_BEGIN, head, stop) >= 0:
        raise MarkerError(f"{begin!r} is not closed before the next BEGIN marker")
    return text[:head] + "\n" + body + text[stop:]


def render(text: str, page: str = DOC.name) -> str:
    """The page with every generated block refreshed; all text outside the blocks is kept."""
    for begin, body in blocks(page).items():
        text = _splice(text, begin, body)
    return text


def check(path: Path = DOC) -> str | None:
    """None if the page is up to date, else why it is stale (with a diff)."""
    if not path.exists():
        return f"{path} does not exist"
    have = path.read_text(encoding="utf-8")
    try:
        want = render(have, path.name)
    except MarkerError as exc:
        return f"{path}: {exc}"
    if want == have:
        return None
    diff = difflib.unified_diff(
        have.splitlines(),
        want.splitlines(),
        f"committed/{path.name}",
        f"generated/{path.name}",
        lineterm="",
        n=1,
    )
    return "\n".join(list(diff)[:60])


def write(path: Path = DOC) -> bool:
    """Refresh the page (creating it from the starter page if missing); True if it changed."""
    have = path.read_text(encoding="utf-8") if path.exists() else None
    if have is None and path.name != DOC.name:
        raise MarkerError(f"{path} does not exist: only docs/signals.md has a starter page")
    want = render(STARTER if have is None else have, path.name)
    if want == have:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(want, encoding="utf-8")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the page is stale; write nothing")
    parser.add_argument(
        "--path",
        type=Path,
        action="append",
        help="a page (default: docs/signals.md, runtime.md, server.md, double-texting.md and a2a.md)",
    )
    opts = parser.parse_args(argv)
    paths: list[Path] = opts.path or [DOC, RUNTIME_DOC, SERVER_DOC, BUSY_DOC, A2A_DOC]
    failed = 0
    for path in paths:
        if opts.check:
            problem = check(path)
            if problem is None:
                print(f"{path.name} matches {SOURCES.get(path.name, SOURCES[DOC.name])}")
                continue
            print(problem)
            print(f"{path.name} is stale: run `python scripts/gendocs.py` and commit", file=sys.stderr)
            failed = 1
            continue
        try:
            changed = write(path)
        except MarkerError as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            failed = 1
            continue
        print(f"{'wrote' if changed else 'unchanged:'} {path}")
    return failed


# The page a fresh checkout starts from. Once docs/signals.md exists its prose is
# edited there, not here; only the generated blocks are rewritten.
STARTER = f"""\
# Signal reference

<!-- The blocks between GENERATED markers are written by scripts/gendocs.py from
electric_sdk/lifecycle.py: edit the prose around them, never the blocks. -->

Entities get the lifecycle controls Unix gave processes: seven signals, sent with
`POST /{{entity_type}}/{{instance_id}}/signal` (`{{"signal": "SIGTERM", "reason": "..."}}`) or
`electric signal TYPE/ID SIGNAL`. The server judges the signal against the entity's
current state, appends the `signal` event (and the new `state`, when the signal changes
it) to the entity's stream in one transaction, and answers with `previous_state` and
`new_state`. The runtime then enforces it. A signal to a `stopped` or `killed` entity is
rejected (`INVALID_SIGNAL`, "Cannot signal a stopped entity") and nothing is written.

What each signal does in each state is the [state table](#state-table) below; it is
generated from the same module the server, the runtime and the dashboard use.

## When a signal acts

- **Immediate** — SIGINT, SIGKILL, SIGUSR act as soon as the signal lands, even
  mid-run and mid-step.
- **At step boundaries** — SIGTERM, SIGSTOP, SIGCONT, SIGHUP are checked between
  model calls, tool calls and messages. A five-minute tool call finishes first.

A signal acts on the run in progress when it is appended, never on a later one: a
SIGINT that found no run does not abort the next one.

## Who can handle a signal

Entity code may register `on_signal` for every signal except **SIGKILL** and
**SIGSTOP**, which the runtime enforces unconditionally. The handler receives the
signal type and payload, runs in the worker process as its own task, sees the entity's
history (its stream) and the entity object, may set flags the run loop reads, and may
append custom events. After SIGINT it receives the aborted run's partial output.

## The signals

### SIGINT — interrupt the current run

The "stop generating" button. Aborts the run in progress (tool calls and model
generation) and records it as aborted with its partial output. The entity's state does
not change; it takes the next message. Immediate; handled by `on_signal`.

### SIGHUP — reload entity code

The deploy signal. The current run finishes on the current code, then the session ends
at once (skipping the idle timeout) and the next wake runs the code version selected for
new wakes of the entity type: the newest announced, unless an operator chose one
(`electric versions`; see [runtime.md](runtime.md#deploys)). A run bound to its version
and waiting for a worker of it is not moved: it still finishes on its version. Checked
at step boundaries; handled by `on_signal`.

### SIGTERM — graceful shutdown

Lets the entity clean up, then stops it for good. An entity with a session to wind
down enters `stopping` with a grace deadline (per entity profile, default 30 s); at the
next step boundary the run stops and `on_signal(SIGTERM)` runs its cleanup within the
remaining grace. The entity is `stopped` when the cleanup returns or when the deadline
passes, whichever comes first; no new run starts meanwhile. An entity with nothing to
wind down is stopped at once (see the table). Checked at step boundaries; handled by
`on_signal`.

### SIGKILL — immediate shutdown

Moves the entity to `killed` and cancels everything at once: runs, tool calls, model
generation, a cleanup in progress. Message delivery stops. Immediate; **cannot be
handled**. It replaces `DELETE /{{entity_type}}/{{instance_id}}`.

### SIGSTOP — pause

Moves the entity to `paused`. The current run finishes; no new message is delivered.
Messages keep arriving and queue in the stream. Checked at step boundaries; **cannot be
handled**.

### SIGCONT — resume

Moves a paused entity back to `running`; queued messages are delivered in order. A
message sent to a paused entity queues but never resumes it: only SIGCONT does.
Checked at step boundaries; handled by `on_signal`.

### SIGUSR — user-defined

Calls `on_signal(SIGUSR, payload)` at once, concurrently with any run, and does nothing
else; the developer defines what it means. It never changes the lifecycle state.
Immediate; handled by `on_signal`.

## State table

Rows are the entity's current state; `→` marks the state the server writes with the
signal. A `paused` entity can still be finishing the run that SIGSTOP caught; the cells
marked "run in progress" say what happens to that run. The second table lists the
transitions no signal drives, with the causes recorded on them.

{TABLE_BEGIN}
{END}

## A run waiting for its code version

While no worker of a run's code version is connected, a pinned run waits and no runtime
holds it: the server decides each signal alone (`lifecycle.decide_waiting`).

{WAITING_BEGIN}
{END}

## How far a signal reached: stop receipts

A signal's answer can wait for a later stage of that signal (`wait=`, `--wait`) and list
each stage reached or not (`lifecycle.STAGES`):

{STAGES_BEGIN}
{END}

## State diagram

Upper-case labels are signals; lower-case labels are the causes of transitions written
by the runtime or by the server when a grace period or a worker's lease runs out.

{DIAGRAM_BEGIN}
{END}
"""


if __name__ == "__main__":
    sys.exit(main())
