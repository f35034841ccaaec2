"""What an exec entity type is: its ``ExecSpec`` and ``ShutdownPolicy``, checked when defined.

Everything that could make a shutdown unsafe or impossible is rejected here,
before a worker announces the type and so before any lifecycle state is
written: an action the chosen backend cannot perform, a timeout that is not
positive, above ``MAX_SHUTDOWN_TIMEOUT``, or longer than the type's grace
period (the force must come before the server gives up on the cleanup).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from ...client._options import DurationLike, to_duration
from ...durations import format_ms
from ..entity_type import DefinitionError, EntityType
from ..fenced import DEFAULT_GRACE
from .reply import Reply

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "FORCE_ACTIONS",
    "GRACEFUL_ACTIONS",
    "MAX_SHUTDOWN_TIMEOUT",
    "ExecSpec",
    "ExecType",
    "ShutdownPolicy",
]

Backend = Literal["posix", "portable"]
BACKENDS: tuple[Backend, ...] = ("posix", "portable")
# POSIX signals where the platform has them (and pidfds, which the posix backend needs).
DEFAULT_BACKEND: Backend = "posix" if sys.platform == "linux" and hasattr(os, "pidfd_open") else "portable"

# The graceful actions each backend can perform; stdin actions need no signals at all.
STDIN_ACTIONS = ("stdin:close", "stdin:shutdown")
POSIX_GRACEFUL = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
GRACEFUL_ACTIONS: dict[Backend, tuple[str, ...]] = {
    "posix": (*POSIX_GRACEFUL, *STDIN_ACTIONS),
    "portable": STDIN_ACTIONS,
}
FORCE_ACTIONS: dict[Backend, str] = {"posix": "SIGKILL", "portable": "terminate"}
COMPAT_GRACEFUL: dict[Backend, str] = {"posix": "SIGTERM", "portable": "stdin:close"}
# The longest shutdown timeout a policy may name (a stuck shutdown must end in bounded time).
MAX_SHUTDOWN_TIMEOUT = timedelta(minutes=10)
# Output kept per generation and stream before the rest is dropped (and counted).
DEFAULT_OUTPUT_LIMIT = 1 << 20
# The line the ``stdin:shutdown`` action writes: documented, so programs can act on it.
SHUTDOWN_LINE = '{"control": "shutdown"}'

SIGNUMS: dict[str, int] = {
    name: int(getattr(signal, name))
    for name in (*POSIX_GRACEFUL, "SIGKILL", "SIGSTOP", "SIGCONT")
    if hasattr(signal, name)
}


@dataclass(frozen=True)
class ShutdownPolicy:
    """How one generation is shut down: a graceful action, then the force after ``timeout``.

    ``timeout=None`` means the entity's grace period.
    """

    graceful: str = "SIGTERM"
    timeout: DurationLike | None = None


@dataclass(frozen=True)
class ExecSpec:
    """An entity type backed by an OS process (ARCHITECTURE §4).

    ``command`` is an argv list, or a string split like a shell would (no shell
    runs). ``env`` is added to the worker's environment. ``keep`` exempts the
    process from the idle timeout.
    """

    id: str
    command: Sequence[str] | str
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    keep: bool = False
    tags: Sequence[str] = ()
    shutdown: ShutdownPolicy | None = None
    grace_period: DurationLike | None = None
    idle_timeout: DurationLike | None = None
    backend: Backend = DEFAULT_BACKEND
    # "text": each message's text as a line (newlines escaped as \\n); "json": one object per line.
    stdin_format: Literal["text", "json"] = "text"
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    # How a message's reply is read from stdout, as its run's output (reply.py); None: the run
    # completes once the line is written.
    reply: Reply | None = None

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.command) if isinstance(self.command, str) else list(self.command)


@dataclass
class ExecType(EntityType):
    """An exec entity type, as the worker hosts it (``ExecHost`` instead of ``EntityHost``)."""

    spec: ExecSpec = field(default=None)  # type: ignore[assignment]  # always given by define()

    @property
    def graceful(self) -> str:
        policy = self.spec.shutdown
        return policy.graceful if policy is not None else COMPAT_GRACEFUL[self.spec.backend]

    @property
    def group_graceful(self) -> str:
        """The graceful action for the processes a leader left in its group, and for a generation
        taken over from another worker: neither reads this worker's pipes, so a stdin action
        becomes SIGTERM (the posix backend only: the portable one acts on the process alone)."""
        graceful = self.graceful
        return graceful if graceful in SIGNUMS else "SIGTERM"

    @property
    def force(self) -> str:
        return FORCE_ACTIONS[self.spec.backend]

    def shutdown_timeout(self, entity_grace: timedelta | None) -> tuple[timedelta, str]:
        """The timeout for this entity, and what it comes from (said in the receipt)."""
        grace = entity_grace or DEFAULT_GRACE
        policy = self.spec.shutdown
        if policy is None or policy.timeout is None:
            if policy is None:
                return grace, (
                    f"compatibility default (no shutdown policy): {self.graceful}, "
                    f"the grace period, then {self.force}"
                )
            return grace, "shutdown policy; timeout: the grace period"
        timeout = to_duration(policy.timeout).ToTimedelta()
        if timeout > grace:  # the entity was spawned with a shorter grace than its type's
            return grace, f"shutdown policy; timeout {_ms(timeout)} cut to the entity's grace period"
        return timeout, "shutdown policy"


def define(spec: ExecSpec) -> ExecType:
    """Check ``spec`` and build its entity type; ``DefinitionError`` says what is wrong."""
    where = f"exec {spec.id!r}"
    if spec.backend not in BACKENDS:
        raise DefinitionError(f"{where}: backend {spec.backend!r} is not one of {', '.join(BACKENDS)}")
    if spec.backend == "posix" and DEFAULT_BACKEND != "posix":
        raise DefinitionError(f"{where}: the posix backend needs Linux with pidfds; use backend 'portable'")
    try:
        argv = spec.argv
    except ValueError as exc:
        raise DefinitionError(f"{where}: command: {exc}") from None
    if not argv or not all(isinstance(a, str) and a for a in argv):
        raise DefinitionError(f"{where}: command must be a non-empty list of non-empty strings")
    if spec.stdin_format not in ("text", "json"):
        raise DefinitionError(f"{where}: stdin_format must be 'text' or 'json'")
    if not all(isinstance(k, str) and isinstance(v, str) and k and "=" not in k for k, v in spec.env.items()):
        raise DefinitionError(f"{where}: env must map names (without '=') to strings")
    if not all(isinstance(t, str) and t for t in spec.tags):
        raise DefinitionError(f"{where}: tags must be non-empty strings")
    if not isinstance(spec.output_limit, int) or spec.output_limit < 0:
        raise DefinitionError(f"{where}: output_limit must be a whole number of bytes ≥ 0")
    if spec.reply is not None:
        if not isinstance(spec.reply, Reply):
            raise DefinitionError(f"{where}: reply must be a Reply (Reply.until_line, .lines or .idle)")
        spec.reply.check(where)
    etype = ExecType(
        name=spec.id,
        on_message=_never,
        factory=object,
        grace_period=spec.grace_period,
        idle_timeout=spec.idle_timeout,
        spec=spec,
    )  # EntityType checks the name and the durations
    _check_policy(etype, where)
    return etype


def _check_policy(etype: ExecType, where: str) -> None:
    spec = etype.spec
    policy = spec.shutdown
    if policy is None:
        return
    allowed = GRACEFUL_ACTIONS[spec.backend]
    if policy.graceful in ("SIGKILL", "SIGSTOP"):
        raise DefinitionError(
            f"{where}: {policy.graceful} cannot be a graceful action: a process cannot catch it "
            f"(SIGKILL is the force that follows the timeout; graceful actions: {', '.join(allowed)})"
        )
    if policy.graceful not in allowed or policy.graceful not in (*SIGNUMS, *STDIN_ACTIONS):
        raise DefinitionError(
            f"{where}: graceful action {policy.graceful!r} is not supported by the {spec.backend} "
            f"backend (supported: {', '.join(allowed)})"
        )
    if policy.timeout is None:
        return
    try:
        timeout = to_duration(policy.timeout).ToTimedelta()
    except ValueError as exc:
        raise DefinitionError(f"{where}: shutdown timeout: {exc}") from None
    if timeout <= timedelta(0):
        raise DefinitionError(f"{where}: shutdown timeout must be greater than 0")
    if timeout > MAX_SHUTDOWN_TIMEOUT:
        raise DefinitionError(
            f"{where}: shutdown timeout {_ms(timeout)} is above the maximum, {_ms(MAX_SHUTDOWN_TIMEOUT)}"
        )
    grace = to_duration(etype.grace_period).ToTimedelta() if etype.grace_period is not None else DEFAULT_GRACE
    if timeout > grace:
        raise DefinitionError(
            f"{where}: shutdown timeout {_ms(timeout)} is longer than the grace period {_ms(grace)}: "
            "the force action must come before the server ends the cleanup"
        )


async def _never(_instance: object, _ctx: object, _message: object) -> None:
    raise RuntimeError("an exec entity's messages go to its process's stdin")


def _ms(value: timedelta) -> str:
    return format_ms(round(value / timedelta(milliseconds=1)))
