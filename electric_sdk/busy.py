"""What a message does while its entity's run is in progress ("double texting"): the one home
of the policies' names and rules, pure, beside ``lifecycle`` (whose cells they never change).

A message sent to an entity whose run is in progress is judged by the server in the message's
own write (any replica, either store), by the entity's type's policy, or the message's own
where the type allows it:

- ``enqueue``: it queues behind the run (the RFC's rule; the default);
- ``reject``: refused with ENTITY_BUSY, nothing written;
- ``interrupt``: a SIGINT aborts the run (sender: the message's, reason naming the policy);
- ``rollback``: the same, and the entity's ``ctx.state`` is restored to its value before the
  aborted run by a visible restore record;
- ``steer``: offered to the running run (``ctx.take_steer``, at a step boundary of its code's
  choosing): recorded as taken at its step, or run as any message once the run ends without it.

A message always may choose ``enqueue`` or ``reject`` (they touch only itself) and its type's
own policy; a type widens that with ``on_busy_choices``. With no run in progress every policy
is ``enqueue``.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Literal

__all__ = [
    "ABORTS_RUN",
    "ALWAYS_CHOOSABLE",
    "DEFAULT_POLICY",
    "POLICIES",
    "SIGINT_PAYLOAD_KEY",
    "BusyPolicy",
    "BusyPolicyName",
    "PolicyNotAllowed",
    "applied",
    "choices_text",
    "parse",
    "parse_choices",
    "rollback_requested",
    "signal_reason",
]


class BusyPolicy(StrEnum):
    ENQUEUE = "enqueue"
    REJECT = "reject"
    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"
    STEER = "steer"


# What each policy does while a run is in progress, and what it writes: docs/double-texting.md's
# table is generated from this (scripts/gendocs.py), never retyped.
POLICIES: dict[BusyPolicy, tuple[str, str]] = {
    BusyPolicy.ENQUEUE: (
        "the message queues behind the run (the RFC's rule; the default)",
        "the message",
    ),
    BusyPolicy.REJECT: (
        "refused: `ENTITY_BUSY` (gRPC `FAILED_PRECONDITION` with `ErrorInfo`; HTTP 409; CLI exit 4)",
        "nothing",
    ),
    BusyPolicy.INTERRUPT: (
        "a SIGINT aborts the run in progress; the message runs next, ahead of any queued",
        "the SIGINT (inserted and settled `aborted`), then the message, in one commit",
    ),
    BusyPolicy.ROLLBACK: (
        "as `interrupt`, and the entity's `ctx.state` goes back to its value from before the aborted run",
        "as `interrupt`; then the runtime appends the run's own changes and a restore record",
    ),
    BusyPolicy.STEER: (
        "offered to the run in progress (`ctx.take_steer`); run as any message if the run ends without taking it",
        'the message (`"steer": true`); when taken, its `steered` run record',
    ),
}
# A policy's name, as App.entity and a send take it.
BusyPolicyName = Literal["enqueue", "reject", "interrupt", "rollback", "steer"]
DEFAULT_POLICY = BusyPolicy.ENQUEUE
# Policies any message may choose: they act on the message alone, never on another's run.
ALWAYS_CHOOSABLE = frozenset({BusyPolicy.ENQUEUE, BusyPolicy.REJECT})
# Policies whose message aborts the run in progress with a SIGINT in its own write.
ABORTS_RUN = frozenset({BusyPolicy.INTERRUPT, BusyPolicy.ROLLBACK})


# The payload key of the SIGINT an aborting policy appends: {"on_busy": policy, "message": key},
# how the runtime tells a rollback's SIGINT (it then writes the restore record) from a user's.
SIGINT_PAYLOAD_KEY = "on_busy"


def signal_reason(policy: BusyPolicy, message_key: str) -> str:
    """The reason of the SIGINT an aborting ``policy`` appends for message ``message_key``."""
    return f"on_busy={policy.value}: message {message_key} arrived while it ran"


def rollback_requested(payload: object) -> bool:
    """Whether a SIGINT's payload says a rollback policy appended it."""
    return isinstance(payload, dict) and payload.get(SIGINT_PAYLOAD_KEY) == BusyPolicy.ROLLBACK.value


class PolicyNotAllowed(ValueError):
    """A message chose a policy its entity's type does not let it choose."""


def parse(name: str) -> BusyPolicy | None:
    """The policy ``name`` says; "" None (the type's). Raises ``ValueError`` naming the choices."""
    if not name:
        return None
    try:
        return BusyPolicy(name)
    except ValueError:
        names = ", ".join(p.value for p in BusyPolicy)
        raise ValueError(f"unknown busy policy {name!r}: one of {names}") from None


def parse_choices(names: Iterable[str]) -> frozenset[BusyPolicy]:
    """A type's extra choices, each a policy name (``ValueError`` otherwise)."""
    found = set()
    for name in names:
        policy = parse(name)
        if policy is None:
            raise ValueError("an empty busy policy name among the choices")
        found.add(policy)
    return frozenset(found)


def choices_text(choices: Iterable[BusyPolicy | str]) -> str:
    """How a type's extra choices are kept (a record's column): sorted names, comma-joined."""
    return ",".join(sorted({str(c) for c in choices}))


def applied(type_policy: str, type_choices: str, requested: BusyPolicy | None, busy: bool) -> BusyPolicy:
    """The policy a message gets: ``type_policy`` and ``type_choices`` as its type announced them
    ("" none: enqueue, no extras), ``requested`` the message's own (None: the type's), ``busy``
    whether a run is in progress. A choice the type does not allow raises ``PolicyNotAllowed``,
    busy or not, so a sender learns of it before it matters."""
    if requested is None:  # the send's hot path: the type's policy, enqueue unless busy
        return BusyPolicy(type_policy) if busy and type_policy else DEFAULT_POLICY
    own = BusyPolicy(type_policy) if type_policy else DEFAULT_POLICY
    if requested is not None and requested is not own and requested not in ALWAYS_CHOOSABLE:
        extra = {BusyPolicy(c) for c in type_choices.split(",") if c}
        if requested not in extra:
            allowed = ", ".join(sorted({*ALWAYS_CHOOSABLE, own, *extra}))
            raise PolicyNotAllowed(
                f"this entity's type does not let a message choose {requested.value!r} (it allows {allowed})"
            )
    return requested if busy else DEFAULT_POLICY
