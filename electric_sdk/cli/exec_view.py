"""Exec receipts, readably: one line per receipt in ``electric events``, and the process section
of ``electric get`` (the current or last generation, and the last act on it)."""

from __future__ import annotations

from typing import Any

from ..models import Event

__all__ = ["output_summary", "process_json", "process_lines", "receipt_summary"]


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


def process_json(events: list[Event]) -> dict[str, Any] | None:
    """The newest generation's evidence, whether it is running, and the newest act; None if no receipts."""
    receipts = [e.value for e in events if e.type == "exec"]
    if not receipts:
        return None
    start = next((r for r in reversed(receipts) if r["action"] == "start" and r.get("generation")), None)
    current = (start or {}).get("generation") or {}
    ended = next(
        (
            r
            for r in reversed(receipts)
            if r["action"] in ("exit", "recover")
            and (r.get("generation") or {}).get("generation") == current.get("generation")
        ),
        None,
    )
    acts = [r for r in receipts if r["action"] in ("graceful", "force", "forward")]
    return {
        "generation": current or None,
        "running": bool(current) and ended is None,
        "ended": ended,
        "last_action": acts[-1] if acts else None,
        "receipts": len(receipts),
    }


def process_lines(summary: dict[str, Any]) -> str:
    g = summary.get("generation") or {}
    lines = ["  process"]
    if g:
        status = "running" if summary["running"] else "ended"
        ended = summary.get("ended")
        if ended is not None:
            status += f" ({ended.get('reason', '')})"
        lines.append(f"    generation  {g.get('generation')}: pid {g.get('pid')}, {status}")
        lines.append(
            f"    evidence    start time {g.get('start_time')}, boot {g.get('boot_id')}, worker {g.get('worker_id')}"
        )
    last = summary.get("last_action")
    if last is not None:
        lines.append(f"    last act    {receipt_summary(last)}")
    lines.append(f"    receipts    {summary['receipts']} (electric events REF shows them all)")
    return "\n".join(lines)
