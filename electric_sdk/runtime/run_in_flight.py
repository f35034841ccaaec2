"""The run an entity's host has in progress (host.py), and how it is aborted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from .._proto.electric.v1 import types_pb2 as pb
from ..durable_state import Collections
from .context import Context, InputRequired, Message, SignalInfo

__all__ = ["RunInFlight"]


@dataclass(slots=True)
class RunInFlight:
    """The run a host has in progress: its message, context and cancel scope, and how it ended."""

    message: Message
    ctx: Context
    scope: anyio.CancelScope
    # The host's wait for the run's body: set by the body's end, or by an abort, so a body stuck
    # in a thread does not hold the abort up. An event, not a cancel scope: a cancel formats its
    # task's repr into the reason (anyio), a tenth of a millisecond on an interrupt's path.
    wake: anyio.Event = field(default_factory=anyio.Event)
    # The body's task has ended (returned, raised or unwound from a cancel).
    body_done: bool = False
    # Offset of the run's STARTED record: a signal appended before it cannot act on this run.
    started_offset: int | None = None
    # The signal that stopped the run, and whether its outcome is still ours to write.
    stopped_by: SignalInfo | None = None
    outcome_pending: bool = False
    # How the signal stopped it, when not in the signal's usual way (its record's error says so).
    how: str = ""
    # The state at the run's start, for a type whose messages may roll it back (records.restore).
    state_before: Collections | None = None
    # How its ``ctx.ask`` ended it (None: it asked nothing).
    asked: InputRequired | None = None
    # Run-dependent signals delivered before the STARTED record's offset was known.
    deferred: list[pb.Event] = field(default_factory=list)

    def asked_fields(self) -> dict[str, Any]:
        """Its end record's question and the ask's step, if it ended asking (RUN_STATUS_INPUT_REQUIRED)."""
        if self.asked is None:
            return {}
        return {"question": self.asked.question, "ask_step": self.asked.step}

    def abort(self, info: SignalInfo, pending: bool) -> None:
        """Abort the run: it is stopped now, for every other path; from the loop's next pass its
        scope is cancelled and the host stops waiting for it (the body's unwinding is queued
        first, so what its ``finally`` writes counts). From a loop callback, because a cancel from
        a task formats that task's repr into its reason (anyio): a tenth of a millisecond on a
        SIGINT's way to the run's end record."""
        self.stopped_by, self.outcome_pending = info, pending
        asyncio.get_running_loop().call_soon(self._cancel, self.wake.set)

    def cut_soon(self, info: SignalInfo) -> None:
        """Abort the run for a SIGTERM that interrupts (its outcome is the cleanup's to write), as
        ``abort`` does, but not waking the host: what was queued before the cancel runs first
        (the cleanup's task, whose handler so starts as soon as a SIGUSR's would). One pass after
        the cancel, a body that has not unwound (blocked in a thread) is abandoned."""
        self.stopped_by, self.outcome_pending = info, False
        asyncio.get_running_loop().call_soon(self._cancel, self.abandon_if_stuck)

    def _cancel(self, then: Callable[[], object]) -> None:
        self.scope.cancel()
        asyncio.get_running_loop().call_soon(then)

    def abandon_if_stuck(self) -> bool:
        """After one pass of the loop since its cancel: a body that has not unwound (blocked in a
        thread that cannot be cancelled) is abandoned. Whether it unwound."""
        if not self.body_done:
            self.wake.set()
        return self.body_done
