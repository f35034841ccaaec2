"""The one table from an entity's stream to an A2A task's state (docs/a2a.md, generated).

An A2A task is the run of one message (``tasks.py``): its state is folded from the records of
the entity's stream that name that message, in order, each row below saying what one record
makes of it. A record no row names leaves the state as it was. A message refused by a
double-texting ``reject`` policy writes nothing, so the refusal itself answers ``rejected``; a
run that ends waiting for input (``ctx.ask``) leaves the task ``input-required`` until a reply,
whose own message record carries the task on (``reply``).

This module imports no A2A code: the docs generator reads the table without the ``[a2a]`` extra.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ENDED", "INTERRUPTED", "ROWS", "Row", "refused_state", "state_of"]


@dataclass(frozen=True)
class Row:
    record: str  # the stream's record type: "message", "run", "state"; "" none (a refusal)
    value: str  # its status ("run"), its state ("state"); "" any
    state: str  # the A2A task state (TaskState's name, lower case, as A2A's JSON writes it)
    says: str  # for the docs: what it means


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
        "run",
        "steered",
        "completed",
        "a `steer` message was taken by the run in progress (its step is the status message)",
    ),
    Row(
        "",
        "reject",
        "rejected",
        "a double-texting `reject` policy refused the message while a run was busy (nothing is written)",
    ),
    Row(
        "run",
        "input_required",
        "input-required",
        "the run ended waiting for input (`ctx.ask`; its question is the status message)",
    ),
    Row(
        "reply",
        "",
        "working",
        "a reply to its question (a message with the task's `taskId`) continues the task's run",
    ),
)

_BY_RECORD = {(row.record, row.value): row.state for row in ROWS if row.record}
# A task in one of these states changes no more (a state the stream's later records keep).
ENDED = frozenset({"completed", "failed", "canceled", "rejected"})
# A task in one of these waits for its client: a stream of it ends there, and a reply resumes it.
INTERRUPTED = frozenset({"input-required", "auth-required"})


def refused_state(policy: str) -> str:
    """The task state of a message the ``policy`` refused before anything was written."""
    return next(row.state for row in ROWS if not row.record and row.value == policy)


def state_of(record: str, value: str) -> str | None:
    """The task state the stream record ``record`` with ``value`` makes; None: no change."""
    return _BY_RECORD.get((record, value), _BY_RECORD.get((record, "")))
