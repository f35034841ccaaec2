"""The one table from an entity's stream to an A2A task's state (docs/a2a.md, generated).

An A2A task is the run of one message (``tasks.py``): its state is folded from the records of
the entity's stream that name that message, in order, each row below saying what one record
makes of it. A record no row names leaves the state as it was. The rows whose state is a hook
are written by work beside this face: a message refused by a double-texting ``reject`` policy
(nothing is written, so the refusal itself answers ``rejected``) and a run that ends waiting
for input (``ctx.ask``). Each adds its record's row here; nothing else changes.

This module imports no A2A code: the docs generator reads the table without the ``[a2a]`` extra.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ENDED", "ROWS", "Row", "state_of"]


@dataclass(frozen=True)
class Row:
    record: str  # the stream's record type: "message", "run", "state"; "" none (a refusal)
    value: str  # its status ("run"), its state ("state"); "" any
    state: str  # the A2A task state (TaskState's name, lower case, as A2A's JSON writes it)
    says: str  # for the docs: what it means
    hook: bool = False  # filled in by other work (see the module's docstring)


ROWS: tuple[Row, ...] = (
    Row("message", "", "submitted", "the message is in the entity's stream, queued behind any before it"),
    Row(
        "run",
        "started",
        "working",
        "a worker started the message's run (again, after a retry or a lost worker)",
    ),
    Row("run", "step", "working", "the run recorded a step; the step's name is the status message"),
    Row("run", "completed", "completed", "the run ended; its output is the task's artifact and reply"),
    Row("run", "failed", "failed", "the run raised; its error is the status message"),
    Row("run", "aborted", "canceled", "the run was aborted: a SIGINT (CancelTask's), SIGTERM or SIGKILL"),
    Row("state", "stopped", "canceled", "the entity stopped before the message's run ended"),
    Row("state", "killed", "canceled", "the entity was killed before the message's run ended"),
    Row(
        "",
        "reject",
        "rejected",
        "hook: a double-texting `reject` policy refused the message (nothing is written)",
        hook=True,
    ),
    Row(
        "run",
        "input_required",
        "input-required",
        "hook: the run ended waiting for input (`ctx.ask`); a reply continues the task",
        hook=True,
    ),
)

_BY_RECORD = {(row.record, row.value): row.state for row in ROWS if row.record}
# A task in one of these states changes no more (a state the stream's later records keep).
ENDED = frozenset({"completed", "failed", "canceled", "rejected"})


def state_of(record: str, value: str) -> str | None:
    """The task state the stream record ``record`` with ``value`` makes; None: no change."""
    return _BY_RECORD.get((record, value), _BY_RECORD.get((record, "")))
