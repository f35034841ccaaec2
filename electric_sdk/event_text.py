"""Events as text: ``event_line`` is the one line ``electric events`` prints for each event
(offset, time, type, key, then ``event_summary``), and what the widgets' event log shows.

Signals, state changes, runs, messages and recorded steps read as sentences
(``step 2 tool:search [key q1] ok (try 1): [...]``, a parallel step with its key); exec receipts as
``graceful SIGTERM issued → gen 1 pid 4242 (start 1234) group, deadline …``;
anything else as compact JSON, shortened to one line.
"""

from __future__ import annotations

import json
from typing import Any

from ._wire.times import to_iso
from .models import Event

__all__ = [
    "SUMMARY_CHARS",
    "compact",
    "event_line",
    "event_summary",
    "output_summary",
    "receipt_summary",
    "shorten",
    "step_summary",
]

# How much of a message text or payload an event line shows.
SUMMARY_CHARS = 100


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def shorten(text: str, limit: int = SUMMARY_CHARS) -> str:
    """One line, at most ``limit`` characters."""
    flat = text.replace("\r", "\\r").replace("\n", "\\n")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _generation(value: dict[str, Any]) -> str:
    g = value.get("generation") or {}
    if not g:
        return "no generation"
    return f"gen {g.get('generation')} pid {g.get('pid')} (start {g.get('start_time')})"


def receipt_summary(value: dict[str, Any]) -> str:
    """``graceful SIGTERM issued → gen 1 pid 4242 (start 1234) group, deadline …: reason``."""
    action, name, disposition = value.get("action"), value.get("action_name"), value.get("disposition")
    parts = [f"{action}{' ' + name if name else ''} {disposition}", "→", _generation(value)]
    if value.get("group"):
        parts.append("group")
    if "timeout_ms" in value:
        parts.append(f"timeout {value['timeout_ms']}ms")
    if value.get("deadline"):
        parts.append(f"deadline {value['deadline']}")
    if "exit_status" in value:
        parts.append(f"exit {value['exit_status']}")
    if value.get("escalated"):
        parts.append("escalated")
    text = " ".join(parts)
    return text + (f": {value['reason']}" if value.get("reason") else "")


def output_summary(value: dict[str, Any]) -> str:
    text = str(value.get("text", "")).rstrip("\n").replace("\n", " ⏎ ")
    note = f" [truncated: {value.get('dropped_bytes')} bytes dropped]" if value.get("truncated") else ""
    return f"{value.get('stream')} gen {value.get('generation')}: {text}{note}"


def step_summary(data: dict[str, Any]) -> str:
    """An ``electric.step`` record: its position, name, key (a parallel step), outcome and result."""
    if data.get("outcome") == "patched":
        return f"patch {data.get('patch')!r} taken before step {data.get('index')}"
    text = f"step {data.get('index')} {data.get('name')}"
    if data.get("key") is not None:
        text += f" [key {data['key']}]" if data["key"] != data.get("name") else " [parallel]"
    if int(data.get("attempt", 1)) > 1:
        text += f" (attempt {data['attempt']})"
    outcome = data.get("outcome")
    if outcome == "nondeterministic":
        return f"{text} nondeterministic: recorded as {data.get('expected')!r}"
    tries = f" (try {data.get('try', 1)})"
    error = data.get("error")
    if outcome in ("retry", "error") and isinstance(error, dict):
        why = shorten(f"{error.get('type')}: {error.get('message')}")
        return f"{text} {outcome}{tries}: {why}"
    typed = f"{str(data['type']).rpartition(':')[2]} " if data.get("type") else ""
    return f"{text} {outcome}{tries}: {typed}{shorten(compact(data.get('result')))}"


def event_summary(event: Event) -> str:
    """The value in a few words: signals, state changes and messages read as sentences."""
    value = event.value
    if event.type == "signal" and event.operation == "update":  # the runtime reporting what it did
        text = f"{value.get('signal')} → {value.get('outcome')}"
        return text + (f": {shorten(str(value['detail']))}" if value.get("detail") else "")
    if event.type == "run":
        status = str(value.get("status"))
        text = f"{value.get('message_key')} {status}"
        if status == "started" and value.get("attempt", 1) > 1:
            text += f" (attempt {value['attempt']})"
        if status == "started" and value.get("code_version"):
            text += f" on code {value['code_version']}"
        if value.get("step"):
            text += f" {value['step']}"
        if status == "aborted" and value.get("output"):
            text += f" with {len(str(value['output']))} chars of partial output"
        if value.get("error"):
            text += f": {shorten(str(value['error']))}"
        return text
    if event.type == "signal":
        text = f"{value.get('signal')} by {value.get('sender') or '?'}"
        if value.get("reason"):
            text += f" ({shorten(str(value['reason']))})"
        if "payload" in value:
            text += f" payload={shorten(compact(value['payload']))}"
        text += f" → {value.get('outcome') or 'pending'}"
        if value.get("detail"):
            text += f": {shorten(str(value['detail']))}"
        return text
    if event.type == "state":
        previous = value.get("previous_state")
        text = f"{previous} → {value.get('state')}" if previous else f"→ {value.get('state')}"
        notes = [str(value["cause"])] if value.get("cause") else []
        if value.get("deadline"):
            notes.append(f"until {value['deadline']}")
        return text + (f" ({', '.join(notes)})" if notes else "")
    if event.type == "electric.step" and isinstance(value.get("data"), dict):
        return step_summary(value["data"])
    if event.type == "exec":
        return shorten(receipt_summary(value), 4 * SUMMARY_CHARS)
    if event.type == "output":
        return shorten(output_summary(value), 4 * SUMMARY_CHARS)
    if event.type == "message":
        text = f"{value.get('sender') or '?'}: {shorten(str(value.get('text', '')))}"
        if "data" in value:
            text += f" data={shorten(compact(value['data']))}"
        if retry := value.get("retry"):
            text += f" (retry of {retry['message_key']} from step {retry['from_step']} by {retry['sender']})"
        return text
    return shorten(compact(value))


def event_line(event: Event) -> str:
    """``offset  time  type  key  summary``, in fixed-width columns (lines are printed as they come)."""
    update = "" if event.operation == "insert" else f" [{event.operation}]"
    return (
        f"{event.offset:>5}  {to_iso(event.timestamp)}  {event.type:<7}  {event.key:<12}  "
        f"{event_summary(event)}{update}"
    )
