"""This replica's own view of its worker sessions and the leases they hold.

The lease itself (epoch and holder) is the entity's row (store/sessions.py);
what is here serves the sessions connected to this process: their outboxes,
the messages and signals each lease was given, and what its runtime still
owes an outcome for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import types_pb2 as pb

from ..core.auth import ANONYMOUS, Principal
from ..store.base import Ref

__all__ = ["Lease", "WorkerSession", "owe"]


@dataclass(eq=False)
class WorkerSession:
    id: str  # the session book's (store/sessions.py): a lease's holder
    worker_id: str
    types: frozenset[str]
    code_version: str
    announced: int
    capacity: int
    outbox: asyncio.Queue[rt.ConnectResponse | None] = field(default_factory=asyncio.Queue)
    leases: dict[Ref, Lease] = field(default_factory=dict)
    last_seen: float = field(default_factory=time.monotonic)
    closed: bool = False
    draining: bool = False  # takes no new lease
    # Per entity, the newest of this worker's requests still being applied (see WorkerRequests.handle).
    tails: dict[Ref, asyncio.Task[None]] = field(default_factory=dict)
    # Who opened it: an announce (the worker's code changed) is checked against what it may host.
    principal: Principal = ANONYMOUS
    # Per hosted type, its double-texting policy and choices (announcements.busy_policy): each
    # lease granted to this session sets them on the entity's record.
    busy: dict[str, tuple[str, str]] = field(default_factory=dict)

    def send(self, message: rt.ConnectResponse) -> None:
        if not self.closed:
            self.outbox.put_nowait(message)


@dataclass(eq=False)
class Lease:
    ref: Ref
    epoch: int
    session: WorkerSession
    next_message: int
    first_attempt: int  # the attempt number for the message at the cursor when leased
    cursor: int
    pumping: bool = False
    pump_again: bool = False
    # Signals given to this lease still `pending`: key → the stored insert's value. Its runtime may
    # report their outcomes (written whole from the insert), and no other signal's.
    pending: dict[str, pb.SignalValue] = field(default_factory=dict)
    # Of those, the ones it owes an outcome before it lets go (settled `ignored` when the lease ends).
    unsettled: dict[str, pb.SignalValue] = field(default_factory=dict)

    def inserts(self, writes: Iterable[rt.RuntimeWrite]) -> dict[str, pb.SignalValue]:
        """The inserts of the pending signals ``writes`` report on (a copy: decide functions may
        run on the store's thread)."""
        keys = {u.signal_key for w in writes for u in w.transition.outcomes}
        keys.update(w.signal_outcome.signal_key for w in writes if w.HasField("signal_outcome"))
        return {key: self.pending[key] for key in keys if key in self.pending}

    def settled(self, key: str) -> None:
        self.pending.pop(key, None)
        self.unsettled.pop(key, None)

    def pb(self) -> rt.Lease:
        return rt.Lease(ref=pb.EntityRef(type=self.ref[0], id=self.ref[1]), epoch=self.epoch)


def owe(lease: Lease, message: pb.Event) -> None:
    """A pending signal the lease holder must report on. A SIGTERM's cleanup and a SIGINT scoped to a
    message still to come outlive a lease: they are left for the next one (pending-signal delivery)."""
    signal = message.signal
    lease.pending[message.key] = signal
    if signal.signal != pb.SIGNAL_SIGTERM and not signal.message_key:
        lease.unsettled[message.key] = signal
