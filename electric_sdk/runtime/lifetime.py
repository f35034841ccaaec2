"""What every host shares (``EntityHost``, ``ExecHost``): its lease, what it last saw of the
entity, and how its hosting ends (ended, revoked, drained)."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup

from .. import lifecycle
from .._proto.electric.v1 import runtime_service_pb2 as rt
from .._proto.electric.v1 import types_pb2 as pb
from ..lifecycle import State
from ..models import Entity
from .context import SignalInfo
from .fenced import Doorbell, Fenced, WorkerLink, signal_info

__all__ = ["Lifetime"]

log = logging.getLogger("electric.runtime")


class Lifetime(ABC):
    # Slots: a worker may host ten thousand entities (a dict per host costs more than its fields).
    __slots__ = (
        "_bell",
        "_draining",
        "_early",
        "_fenced",
        "_tg",
        "a2a",
        "end_reason",
        "lease",
        "mcp",
        "on_end",
        "revoked",
    )

    def __init__(self, session: WorkerLink, grant: rt.LeaseGranted) -> None:
        self.lease = rt.Lease()
        self.lease.CopyFrom(grant.lease)  # a copy: a sub-message would keep the whole grant alive
        self._bell = Doorbell()
        self._fenced = Fenced(session, self.lease, grant.entity, self._bell.ring, self.end)
        self._tg: TaskGroup | None = None
        # Deliveries that came before the host's task started: replayed once it has (``started``).
        self._early: list[tuple[pb.Event, int]] | None = []
        self._draining = False
        self.end_reason: str | None = None
        self.revoked = False
        # The host's MCP sessions (mcp.py), opened at a run's first tool call; closed at the end.
        self.mcp: Any = None
        # Its A2A clients (a2a_calls.py), made at a run's first call to an agent; closed at the end.
        self.a2a: Any = None
        # Called with the host when its task ends (the worker forgets it and gives the lease back).
        self.on_end: Callable[[Lifetime], None] | None = None

    async def run(self) -> None:
        """Host the entity until its session ends (idle, reload, stopped, killed, revoked, drained).
        The host's own loop runs in this task: one task, and one frame chain, per hosted entity."""
        try:
            async with anyio.create_task_group() as tg:
                self.started(tg)
                await self._main()
        except Exception:
            log.exception("%s/%s: host failed", self.lease.ref.type, self.lease.ref.id)
        finally:
            with anyio.CancelScope(shield=True):
                await self._after()
                if self.mcp is not None:
                    await self.mcp.aclose()
                if self.a2a is not None:
                    await self.a2a.aclose()
            if self.on_end is not None:
                self.on_end(self)

    @abstractmethod
    async def _main(self) -> None:
        """The host's own loop, until its hosting ends."""

    async def _after(self) -> None:
        """What must happen once hosting ended, even under cancellation (an exec host's child)."""
        return  # an entity of Python code leaves nothing behind

    @property
    def entity(self) -> Entity:
        """The entity as last seen (deliveries and write results, newest txid wins)."""
        return self._fenced.entity

    @property
    def state(self) -> State:
        return self._fenced.state

    async def wait_state(self, *states: State) -> State:
        """Wait until the host has seen the entity enter one of ``states`` (or stops hosting it)."""
        while self.state not in states and self.end_reason is None:
            await self._bell.wait()
        return self.state

    def deliver(self, event: pb.Event, attempt: int) -> None:
        """A delivered stream event (signals act at once); kept until the host's task runs."""
        if self._early is not None:
            self._early.append((event, attempt))
        else:
            self._on_delivery(event, attempt)

    @abstractmethod
    def _on_delivery(self, event: pb.Event, attempt: int) -> None:
        """A delivered event, once the host's task runs."""

    def _signal_event(self, event: pb.Event) -> tuple[SignalInfo, bool, lifecycle.Cell] | None:
        """A delivered signal: what it is, whether its outcome is still ours to write, and its table
        cell (judged in the state the server judged it in); None if the table cannot judge it."""
        info = signal_info(event, self.entity)
        pending = event.signal.outcome == pb.SIGNAL_OUTCOME_PENDING
        self._fenced.observe_state(info.new_state, event.headers.txid)
        try:
            return info, pending, lifecycle.cell(info.previous_state, info.signal)
        except lifecycle.LifecycleError:
            log.exception("%s/%s: cannot judge %s", self.lease.ref.type, self.lease.ref.id, info.signal.value)
            return None

    def started(self, tg: TaskGroup) -> None:
        """The host's task runs, in ``tg``: from now on deliveries act at once."""
        self._tg = tg
        early, self._early = self._early or [], None
        for event, attempt in early:
            self._on_delivery(event, attempt)

    def end(self, reason: str) -> None:
        """Stop hosting now: everything in the task group is cancelled."""
        self._bell.ring()
        if self.end_reason is None:
            self.end_reason = reason
            log.debug("%s/%s: hosting ends (%s)", self.lease.ref.type, self.lease.ref.id, reason)
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    @property
    def lease_returned(self) -> bool:
        """The server has ended the lease (revoked, or given back with a write): no Release owed."""
        return self.revoked or self._fenced.released

    @property
    def lease_lost(self) -> str | None:
        """Why this host no longer holds the entity's lease (revoked, fenced off, its session
        ended), or None while it does (or its hosting ended its own way: idle, stopped, drained)."""
        if self.revoked:
            return self.end_reason
        return self._fenced.lost

    def left_behind(self, what: str, exc: Exception) -> bool:
        """Whether ``what`` (a run, a handler) raised ``exc`` after this host lost its lease: then
        it is no longer the entity's (the next holder runs the message again), and one WARNING
        line says so, with no traceback and no record (the worker may write none)."""
        if (lost := self.lease_lost) is None:
            return False
        log.warning(
            "%s/%s: fenced out (%s): this worker no longer holds the lease; its %s ended with %s: %s",
            self.lease.ref.type,
            self.lease.ref.id,
            lost,
            what,
            type(exc).__name__,
            exc,
        )
        return True

    def revoke(self, reason: str) -> None:
        self.revoked = True
        self.end(f"revoked: {reason}")

    def drain(self) -> None:
        """Finish what is under way (a run, a cleanup), start nothing new, then end."""
        self._draining = True
        self._bell.ring()
