"""`electric run`'s interrupt receipts: how far each scoped SIGINT it sent has reached (issue 48).

When Ctrl-C, SIGTERM or ``--timeout`` stops the command, it interrupts its own
run with an entity SIGINT scoped to its message (run_cmd.py). Its answer waits
for a stage of that SIGINT (``--stop-wait``: ``accepted``, ``unwound`` — the
default — or ``downstream``), bounded by ``--grace``, and the command prints
each stage reached or not, as `electric signal --wait` does.

The stages are folded by ``_wire.stop_stages.StageFollow``, the fold every door
shares, from the command's own watch of the entity's stream (no second watch):
the events seen since the stop was asked for are kept, because an interrupt's
answer may come back after the stream has already shown what followed its
record. An interrupt commits after the stop is asked for, so nothing before it
can follow its record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .._wire.stop_stages import StageFollow
from .._wire.times import to_iso
from ..client._stages import follow_result
from ..lifecycle import Signal, Stage, stages_of
from ..models import Event, SignalResult
from . import console

__all__ = ["DEFAULT_STOP_WAIT", "STOP_STAGES", "Receipts"]

# The stages of the SIGINT the command sends: what --stop-wait may name.
STOP_STAGES = tuple(stage.value for stage in stages_of(Signal.SIGINT))
DEFAULT_STOP_WAIT = Stage.UNWOUND.value

_Seen = tuple[str, str, dict[str, Any], int, str]  # type, key, value, offset, time


@dataclasses.dataclass
class _Receipt:
    result: SignalResult
    follow: StageFollow

    def answer(self) -> SignalResult:
        return dataclasses.replace(self.result, stages=tuple(self.follow.reports.values()))


class Receipts:
    """The receipts of the interrupts one `electric run` sent, folded from its watch."""

    def __init__(self, wait: Stage) -> None:
        self.wait = wait
        self._receipts: list[_Receipt] = []
        self._seen: list[_Seen] | None = None  # None until the stop is asked for

    def start(self) -> None:
        """The stop was asked for: from now on the events seen are kept for the answers to come."""
        if self._seen is None:
            self._seen = []

    def see(self, event: Event) -> None:
        """One event of the command's watch."""
        if self._seen is None:
            return
        seen = (event.type, event.key, event.value, event.offset, to_iso(event.timestamp))
        self._seen.append(seen)
        for receipt in self._receipts:
            if not receipt.follow.done:
                receipt.follow.see(*seen)

    def add(self, result: SignalResult, message_key: str) -> None:
        """An interrupt's answer (without a wait): its fold, fed what the watch already showed."""
        follow = follow_result(result, self.wait, message_key)
        for seen in self._seen or ():
            if seen[3] > result.raw.offset and not follow.done:
                follow.see(*seen)
        self._receipts.append(_Receipt(result, follow))

    @property
    def settled(self) -> bool:
        """Whether the latest interrupt's stage waited for (and those before it) is settled."""
        return not self._receipts or self._receipts[-1].follow.done

    @property
    def latest_reached(self) -> bool:
        return bool(self._receipts) and self._receipts[-1].follow.reached

    def stream_closed(self) -> None:
        for receipt in self._receipts:
            if not receipt.follow.done:
                receipt.follow.stream_closed()

    def close(self, why: str) -> None:
        """The command stops waiting: each stage up to the one waited for that is neither reached
        nor ruled out says ``why``; a later one, that it was not waited for."""
        for receipt in self._receipts:
            for stage, report in receipt.follow.reports.items():
                if not report.reached and not report.detail:
                    report.detail = why
                if stage is self.wait:
                    break
            receipt.follow.finish()

    def answers(self) -> list[SignalResult]:
        """Each interrupt's answer with its stages, in the order they were sent."""
        return [receipt.answer() for receipt in self._receipts]

    def print_answers(
        self, record: Callable[[dict[str, Any]], None], note: Callable[[str], None], schema: str
    ) -> dict[str, Any] | None:
        """Each interrupt's answer: a ``stop_stages`` record, and for people its lines as `signal
        --wait` prints them; the latest one's summary (``session_complete``'s ``stop``)."""
        wait = self.wait.value
        summary = None
        for answer in self.answers():
            reached = answer.reached(wait)
            record(
                {"type": "stop_stages", "version": schema, "wait": wait, "reached": reached}
                | {"signal": answer.to_json()}
            )
            note(console.signal_line(answer))
            for report in answer.stages:
                note(console.stage_line(report))
            summary = {"wait": wait, "reached": reached, "signal_key": answer.key}
        return summary
