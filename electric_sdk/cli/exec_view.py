"""Exec receipts, readably: one line per receipt in ``electric events``, and the process section
of ``electric get`` (the current or last generation, and the last act on it)."""

from __future__ import annotations

from typing import Any

from .._wire.exec_receipts import generation_running
from ..event_text import receipt_summary
from ..models import Entity, Event

__all__ = ["LOST", "process_json", "process_lines"]


# What `get` says of a generation whose worker went away before its exit was recorded.
LOST = (
    "no worker holds the entity and no exit was recorded: its worker's lease ended (killed, or "
    "frozen past the lease TTL); the process dies with its worker unless that worker is only frozen, "
    "and the next lease re-observes it"
)


def process_json(events: list[Event], entity: Entity | None = None) -> dict[str, Any] | None:
    """The newest generation's evidence, its ``state`` (``running``; ``exiting``: a graceful or
    force action was issued to it; ``ended``; ``lost``: the receipts say it runs, but ``entity``
    has no lease holder, so no worker watches it, ``lost`` says why), how it ended, and the last
    act on it (not on an earlier generation: a SIGKILL that ended generation 1 says nothing of
    generation 2); None if no receipts."""
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
    # A generation is only ever watched by the worker holding the lease (it ends its process
    # when its hosting ends): with none, what the receipts last said is no longer known.
    lost = bool(current) and ended is None and entity is not None and entity.holder is None
    running = bool(current) and ended is None and not lost
    state = "lost" if lost else "exiting" if running and told_to_stop else "running" if running else "ended"
    return {
        "generation": current or None,
        "state": state if current else None,
        "running": running,
        "exiting": state == "exiting",
        "lost": LOST if lost else None,
        "ended": ended,
        "last_action": acts[-1] if acts else None,
        "receipts": len(receipts),
    }


def process_lines(summary: dict[str, Any]) -> str:
    g = summary.get("generation") or {}
    lines = ["  process"]
    if g:
        status = summary.get("state") or "ended"  # exiting: told to stop, its exit not seen yet
        ended = summary.get("ended")
        if ended is not None:
            status += f" ({ended.get('reason', '')})"
        elif summary.get("lost"):
            status += f" ({summary['lost']})"
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
