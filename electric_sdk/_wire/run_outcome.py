"""What became of the run a message started, folded from the entity's stream: the one home of
send-and-wait's answer (issue 46, "One way to wait").

Every door reads it the same way: the SDK (``send(..., wait="run")``) and
``electric run`` fold the events of their watch; the HTTP door folds the
service's own watch for ``POST /{type}/{id}/messages?wait=run``. Each feeds
the events after the message's offset, in order, to ``RunFollow.see`` until
``ended``; a watch that resumes after a reconnect (or on another replica)
just goes on feeding the same fold from its last offset.

How a message's run ends, as the stream says it:

- ``completed`` (with its output), ``failed`` (with the error), ``aborted``
  (with the partial output): the run's last ``run`` record;
- ``cancelled``: an ``aborted`` record for a run that never started (a scoped
  SIGINT cancelled the queued message), or a stream that closed (the entity
  stopped or was killed) before it started;
- a stream that closed after the run started and before its end: ``aborted``;
- ``input_required`` (with its ``question``): the run asked for input
  (``ctx.ask``); the reply to it is a message of its own, whose run resumes it;
- ``steered``: a steering message the run in progress took (``ctx.take_steer``).

Before its end the status is ``queued`` or ``started``: what a wait that timed
out reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RUN_ENDS", "RUN_WAIT", "WAIT_KINDS", "RunFollow"]

# The statuses of a message's run that end it.
RUN_ENDS = ("completed", "failed", "aborted", "cancelled", "input_required", "steered")
# What a send can wait for (one kind so far; the stop stages wait for theirs alike).
RUN_WAIT = "run"
WAIT_KINDS = (RUN_WAIT,)
_RECORDED_ENDS = ("completed", "failed", "aborted", "input_required", "steered")


@dataclass
class RunFollow:
    """The run of the message ``message_key``, as the events seen so far tell it."""

    message_key: str
    status: str = "queued"  # queued | started, then one of RUN_ENDS
    started: bool = False
    attempt: int = 0
    output: str | None = None
    error: str | None = None
    question: str | None = None  # input_required: what the run asked
    entity_state: str | None = None  # the entity's state, as the latest state event says
    started_offset: int = -1  # the latest STARTED record's offset
    end_offset: int = -1  # the offset of the record that ended the run
    next_offset: int = 0  # where a resumed watch goes on

    @property
    def ended(self) -> bool:
        return self.status in RUN_ENDS

    def see(self, type: str, key: str, value: dict[str, Any], offset: int) -> bool:
        """Fold one event (its type, key, RFC value and offset); True when it is about this
        message: its own event, its run's records, a signal scoped to it."""
        self.next_offset = max(self.next_offset, offset + 1)
        if type == "message":
            return key == self.message_key
        if type == "state":
            self.entity_state = value.get("state")
            return False
        if type == "signal":
            return value.get("message_key") == self.message_key
        if type != "run" or value.get("message_key") != self.message_key or self.ended:
            return False
        status = value.get("status")
        if status == "started":
            self.status, self.started, self.started_offset = "started", True, offset
            self.attempt = int(value.get("attempt", 1))
        elif status in _RECORDED_ENDS:
            self.output, self.error = value.get("output"), value.get("error")
            self.question = value.get("question")
            self.status = status if status != "aborted" or self.started else "cancelled"
            self.end_offset = offset
        return True

    def stream_closed(self) -> None:
        """The stream ended (the entity stopped or was killed) before the run's end was recorded."""
        if not self.ended:
            self.status = "aborted" if self.started else "cancelled"

    def to_json(self) -> dict[str, Any]:
        """The run as every door answers it (``run`` of the HTTP response, ``RunResult``)."""
        return {
            "message_key": self.message_key,
            "status": self.status,
            "ended": self.ended,
            "started": self.started,
            "attempt": self.attempt,
            "output": self.output,
            "error": self.error,
            **({"question": self.question} if self.question is not None else {}),
            "entity_state": self.entity_state,
        }
