"""The lifecycle's vocabulary: the names of signals, states, timings, stop stages, actions,
outcomes, effects and runtime records (the states' names stay with their rules), and nothing else.

No rule lives here: what a signal does in a state, what a state allows, which signal has which
stage, what a runtime may append are ``lifecycle``'s tables, which use these names and re-export
them (import them from ``electric_sdk.lifecycle``). They are apart only so that the module of
rules stays one a reader can hold.
"""

from __future__ import annotations

import enum

from electric_sdk._signal_names import parse_signal

__all__ = [
    "POSIX_SIGNAL_NUMBERS",
    "Action",
    "Effect",
    "IdentityEnum",
    "MessageProgress",
    "Outcome",
    "Record",
    "Signal",
    "Stage",
    "Timing",
]


class IdentityEnum(enum.Enum):
    """An enum whose members hash by identity. They are singletons compared by identity, so this
    agrees with ``==``; Enum's own ``__hash__`` is Python code, run on each of the dozen lookups
    in these tables that a signal makes on its way through the server."""

    __hash__ = object.__hash__


class Signal(IdentityEnum):
    SIGINT = "SIGINT"
    SIGHUP = "SIGHUP"
    SIGTERM = "SIGTERM"
    SIGKILL = "SIGKILL"
    SIGSTOP = "SIGSTOP"
    SIGCONT = "SIGCONT"
    SIGUSR = "SIGUSR"

    @classmethod
    def parse(cls, text: str | Signal) -> Signal:
        """As ``kill(1)`` takes them: ``"SIGTERM"``, ``"sigterm"``, ``"TERM"`` and the numbers
        POSIX fixes (``"15"``) → ``Signal.SIGTERM``; ValueError otherwise."""
        if isinstance(text, Signal):
            return text
        return parse_signal(text, cls.__members__, POSIX_SIGNAL_NUMBERS, {s: s.value for s in cls})


# The numbers `kill(1)` takes that POSIX fixes on every platform; SIGSTOP's and SIGCONT's
# differ (SIGSTOP is 19 on Linux, 17 on macOS; SIGCONT 18 and 19), and SIGUSR is ours.
POSIX_SIGNAL_NUMBERS = {1: Signal.SIGHUP, 2: Signal.SIGINT, 9: Signal.SIGKILL, 15: Signal.SIGTERM}


class Timing(IdentityEnum):
    """When a signal acts on a run in progress (the RFC's "immediate" or "checked between")."""

    AT_ONCE = "at once, even mid-step"
    NEXT_STEP = "when the run starts its next step (a run that returns first is completed)"
    AFTER_RUN = "once the current run has ended"


class Stage(IdentityEnum):
    """How far a signal has reached: what a signal's answer may wait for (``wait=``)."""

    ACCEPTED = "accepted"
    HANDLED = "handled"
    UNWOUND = "unwound"
    DOWNSTREAM = "downstream"
    REAPED = "reaped"
    TERMINAL = "terminal"


class Action(IdentityEnum):
    """What the runtime does for a cell (ARCHITECTURE §3)."""

    NONE = "none"
    ABORT_RUN = "abort_run"  # SIGINT: cancel the run in progress now
    RELOAD = "reload"  # SIGHUP: end the session after the run, next wake on new code
    CLEANUP = "cleanup"  # SIGTERM: run on_signal(SIGTERM) within the grace
    KILL = "kill"  # SIGKILL: cancel everything now, no handler
    PAUSE = "pause"  # SIGSTOP: finish the run, deliver nothing new
    RESUME = "resume"  # SIGCONT: deliver queued messages in order
    DELIVER = "deliver"  # SIGUSR: call on_signal(SIGUSR, payload) now


class Outcome(IdentityEnum):
    """A signal record's handling outcome."""

    PENDING = "pending"
    TRANSITIONED = "transitioned"
    IGNORED = "ignored"
    DELIVERED = "delivered"
    ABORTED = "aborted"
    SHUTDOWN_REQUESTED = "shutdown_requested"
    FAILED = "failed"


class MessageProgress(IdentityEnum):
    """How far the message a scoped signal names has got, as the server's record says."""

    QUEUED = "queued"  # no run of it has started: it may not even have reached a runtime
    STARTED = "started"  # a run of it started and has not ended (it may be in progress)
    ENDED = "ended"  # its run ended or it was cancelled (or the entity has no such message)


class Effect(IdentityEnum):
    """What a runtime did about a signal, which decides the outcome it records."""

    ACTED = "acted"  # did the action: aborted the run, began the cleanup or the reload, enforced the state
    DELIVERED = "delivered"  # passed it on: to on_signal (even with none registered), or to a process
    NO_TARGET = "no_target"  # found nothing to act on: no run in progress, no process, the run ended
    UNSUPPORTED = "unsupported"  # cannot carry it out (an exec backend without that signal)
    FAILED = "failed"  # tried and failed: the handler raised, the process could not be proved


class Record(IdentityEnum):
    """What a runtime appends to an entity's stream."""

    TRANSITION = "transition"
    SIGNAL_OUTCOME = "signal outcome"
    RUN_START = "run start"
    RUN_STEP = "run step"
    # The last record of the run in progress (completed, aborted, failed).
    RUN_END = "end of the run in progress"
    # The record of a run that never started (a queued message cancelled).
    RUN_CANCELLED = "cancelled message"
    EXEC_RECEIPT = "exec receipt"
    OUTPUT = "exec output"
    STATE_CHANGES = "state changes"  # a run's or a handler's `ctx.state` changes not yet written
    CUSTOM = "custom event"
