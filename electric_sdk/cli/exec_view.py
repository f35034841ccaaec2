"""Exec receipts, readably: one line per receipt in ``electric events``, and the process section
of ``electric get`` (the current or last generation, and the last act on it)."""

from __future__ import annotations

from typing import Any

from .._wire.exec_receipts import generation_running
from ..event_text import receipt_summary
from ..models import Event

__all__ = ["process_json", "process_lines"]


def process_json(events: list[Event]) -> dict[str, Any] | None:
    """The newest generation's evidence, whether it is running (and exiting: a graceful or force
    action was issued to it), how it ended, and the last act on it (not on an earlier
    generation: a SIGKILL that ended generation 1 says nothing of generation 2); None if no
    receipts."""
    receipts = [e.value for e in events if e.type == "exec"]
    if not receipts:
        return None
    running_from = [generation_running(r["action"], r["disposition"]) for r in receipts]
    starts = [r for r, running in zip(receipts, running_from, strict=True) if running and r.get("generation")]
    current = (starts[-1] if starts else {}).get("generation") or {}
    mine = [
        (r, running)
        for r, running in zip(receipts, running_from, strict=True)
        if (r.get("generation") or {}).get("generation") == current.get("generation")
    ]
    ended = next((r for r, running in reversed(mine) if running is False), None)
    told_to_stop = any(r["action"] in ("graceful", "force") and r["disposition"] == "issued" for r, _ in mine)
    acts = [r for r, _ in mine if r["action"] in ("graceful", "force", "forward")]
    return {
        "generation": current or None,
        "running": bool(current) and ended is None,
        "exiting": bool(current) and ended is None and told_to_stop,
        "ended": ended,
        "last_action": acts[-1] if acts else None,
        "receipts": len(receipts),
    }


def process_lines(summary: dict[str, Any]) -> str:
    g = summary.get("generation") or {}
    lines = ["  process"]
    if g:
        status = "ended"
        if summary["running"]:  # exiting: told to stop, its exit not seen yet
            status = "exiting" if summary.get("exiting") else "running"
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
    elif g:
        lines.append(f"    last act    none on generation {g.get('generation')}")
    lines.append(f"    receipts    {summary['receipts']} (electric events REF shows them all)")
    return "\n".join(lines)
