"""Acting on a generation: every act checked before it is issued, the shutdown policy, the end.

Every act on a process (a forwarded signal, the graceful action, the force)
is planned, passed to the test hook, re-observed and only then issued; any
doubt holds it, and a receipt says why (``Enforcer.act``).

The shutdown's rules (seed 003): the timeout starts only once the graceful
action was issued to the proved generation; an exit before the timeout ends
it with no force; at expiry the generation is re-observed and forced exactly
once; any doubt holds the action, and the receipt says why. The child is
reaped only after the last action on it, so its PID cannot be reused while
an action could still name it.

On the posix backend a generation is its whole process group (as systemd's
``KillMode=control-group``): once its main process has exited, whatever is
left in the group gets the policy too, and the generation ends (its ``exit``
receipt, written once by ``Enforcer.settle``) only when the group is empty.
"""

from __future__ import annotations

import contextlib
import functools
from datetime import UTC, datetime, timedelta

import anyio

from ..fenced import Doorbell
from .generations import Generations
from .hooks import ActionPlan, run_hook
from .process import Child, describe_left
from .receipts import ReceiptLog
from .spec import STDIN_ACTIONS, ExecType

__all__ = ["FORCE_WAIT_S", "OUTPUT_TRAIL_S", "Enforcer"]

# How long a forced process may take to die before the host stops waiting (a process in
# uninterruptible sleep); and how long output may trail the exit before the EXIT receipt.
FORCE_WAIT_S = 5.0
OUTPUT_TRAIL_S = 0.2


class Enforcer:
    """The acts of one exec host on its entity's generations, and the shutdown policy built of them."""

    __slots__ = ("_bell", "_etype", "_generations", "_receipts", "_scope", "_task_id", "killing")

    def __init__(
        self, task_id: str, etype: ExecType, generations: Generations, receipts: ReceiptLog, bell: Doorbell
    ) -> None:
        self._task_id, self._etype = task_id, etype
        self._generations, self._receipts, self._bell = generations, receipts, bell
        self._scope: anyio.CancelScope | None = None  # the shutdown's wait, which a SIGKILL cancels
        self.killing = False  # a SIGKILL's force is under way (ExecHost._force_now)

    def give_way(self) -> None:
        """SIGKILL: a shutdown in progress stops waiting; the force comes at once."""
        if self._scope is not None:
            self._scope.cancel()

    async def act(
        self, child: Child, action: str, name: str, *, group: bool, reason: str, signal_key: str = ""
    ) -> datetime | None:
        """Plan → hook → re-observe → issue. Returns when it was issued, or None (held: receipt written)."""
        plan = ActionPlan(self._task_id, child.evidence, action, name, group, reason)
        await run_hook(plan)
        doubt = child.recheck(group=group)
        if doubt is None:
            try:
                child.send(name, group=group)
                return datetime.now(UTC)
            except OSError as exc:
                doubt = f"{name} failed: {exc}"
        await self._receipts.write(
            action, "held", evidence=child.evidence, name=name, group=group, signal_key=signal_key,
            reason=f"{reason}: nothing sent, because {doubt}",
        )  # fmt: skip
        return None

    async def shut_down(
        self, child: Child, reason: str, signal_key: str, grace_period: timedelta | None
    ) -> None:
        """The shutdown policy on ``child``, to its end (exit, or force then exit); once per
        generation: a second shutdown (a SIGTERM during the idle timeout's or a drain's) joins
        the one under way, since a second graceful action (a second SIGINT) often means "quit
        now" to the process, and the first's deadline already bounds it."""
        if self.killing:
            # A SIGKILL came before this shutdown began (a SIGTERM and a SIGKILL delivered close
            # together): its force ends the generation and says how; a graceful action now would
            # only race it. One that began first is cancelled by the SIGKILL (give_way).
            return
        if (under_way := child.shutting_down) is not None:
            over, first = under_way
            await self._receipts.write(
                "graceful", "refused", evidence=child.evidence, name=self._graceful_for(child)[0],
                signal_key=signal_key,
                reason=f"{reason}: nothing sent again, the shutdown under way ({first}) ends this generation",
            )  # fmt: skip
            await over.wait()
            return
        over = anyio.Event()
        child.shutting_down = (over, reason)
        try:
            await self._shut_down(child, reason, signal_key, grace_period)
        finally:
            over.set()

    async def _shut_down(
        self, child: Child, reason: str, signal_key: str, grace_period: timedelta | None
    ) -> None:
        if child.done():
            await self.settle(child, f"exited before the graceful action ({reason})", signal_key=signal_key)
            return
        timeout, why = self._etype.shutdown_timeout(grace_period)
        graceful, group = self._graceful_for(child)
        earlier = child.graceful_issued
        with anyio.CancelScope() as scope:  # SIGKILL cancels the wait and forces at once
            self._scope = scope
            if earlier is not None and earlier[0] == graceful:
                await self._earlier_graceful(child, earlier, reason, signal_key)
                return
            issued = await self.act(
                child, "graceful", graceful, group=group, reason=reason, signal_key=signal_key
            )
            if issued is None:
                if child.done():
                    await self.settle(
                        child, f"exited before the graceful action ({reason})", signal_key=signal_key
                    )
                return
            start = anyio.current_time()
            self._thaw(child)
            await self._receipts.write(
                "graceful", "issued", evidence=child.evidence, name=graceful, group=group,
                issued_at=issued, deadline=issued + timeout, policy_timeout=timeout,
                reason=f"{reason}; {why}", signal_key=signal_key,
            )  # fmt: skip
            with anyio.move_on_after(max(0.0, start + timeout.total_seconds() - anyio.current_time())):
                await child.exited.wait()
                if not group and child.leftovers():  # the graceful action reached its leader only
                    await self._graceful_to_the_rest(child, reason, signal_key, issued + timeout)
                await child.wait_done()
            if child.done():
                await self.settle(
                    child, f"exited after {graceful}, before the timeout; no force", signal_key=signal_key
                )
                return
            still = describe_left(child.leftovers()) if child.gone() else "still running"
            await self.force(child, f"{reason}: {still} at the deadline", signal_key, issued + timeout)
        if scope.cancelled_caught and self._generations.child is child and not child.reaped:
            return  # SIGKILL took over: _kill settles it

    async def _earlier_graceful(
        self, child: Child, earlier: tuple[str, datetime], reason: str, signal_key: str
    ) -> None:
        """The worker before this one issued the graceful action to this generation, which was then
        taken over: it is not sent again (a second SIGINT often means "quit now"); its deadline
        stands, and the force follows it."""
        name, deadline = earlier
        await self._receipts.write(
            "graceful", "refused", evidence=child.evidence, name=name, group=True, deadline=deadline,
            signal_key=signal_key,
            reason=f"{reason}: nothing sent again, {name} was issued to this generation before it was "
            "taken over; that deadline stands",
        )  # fmt: skip
        with anyio.move_on_after(max(0.0, (deadline - datetime.now(UTC)).total_seconds())):
            await child.wait_done()
        if child.done():
            await self.settle(
                child, f"exited after {name}, before the timeout; no force", signal_key=signal_key
            )
            return
        still = describe_left(child.leftovers()) if child.gone() else "still running"
        await self.force(child, f"{reason}: {still} at the deadline", signal_key, deadline)

    def _graceful_for(self, child: Child) -> tuple[str, bool]:
        """The graceful action for ``child`` and whether it goes to its group: the policy's, unless
        only the rest of its group is left, or it was taken over (no pipes of ours)."""
        if child.backend == "posix" and (child.adopted or child.gone()):
            return self._etype.group_graceful, True
        graceful = self._etype.graceful
        return graceful, graceful not in STDIN_ACTIONS

    async def _graceful_to_the_rest(
        self, child: Child, reason: str, signal_key: str, deadline: datetime
    ) -> None:
        """The leader exited after a stdin action: the rest of its group gets a signal, within the same
        deadline."""
        name = self._etype.group_graceful
        why = (
            f"{reason}: its main process exited ({child.describe_exit()}); {describe_left(child.leftovers())}"
        )
        issued = await self.act(child, "graceful", name, group=True, reason=why, signal_key=signal_key)
        if issued is not None:
            self._thaw(child)
            await self._receipts.write(
                "graceful", "issued", evidence=child.evidence, name=name, group=True, issued_at=issued,
                deadline=deadline, policy_timeout=max(deadline - issued, timedelta(0)),
                reason=f"{why}; the same deadline", signal_key=signal_key,
            )  # fmt: skip

    @staticmethod
    def _thaw(child: Child) -> None:
        """A frozen process cannot act on a graceful action: it is continued after it."""
        if child.frozen and child.backend == "posix":
            with contextlib.suppress(OSError):
                child.send("SIGCONT", group=True)
            child.frozen = False

    async def force(
        self, child: Child, reason: str, signal_key: str, deadline: datetime | None = None
    ) -> None:
        force = self._etype.force
        group = child.backend == "posix"
        issued = await self.act(child, "force", force, group=group, reason=reason, signal_key=signal_key)
        if issued is not None:
            # The receipt's commit overlaps the wait for the death (which a SIGKILL makes short):
            # the exit receipt (settle) waits for both, so it still lands after this one.
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(
                    self._receipts.write, "force", "issued", evidence=child.evidence, name=force,
                    group=group, issued_at=issued, deadline=deadline, escalated=True, reason=reason,
                    signal_key=signal_key,
                ))  # fmt: skip
                with anyio.move_on_after(FORCE_WAIT_S):
                    await child.wait_done()
        if child.done():
            await self.settle(child, reason, escalated=issued is not None, signal_key=signal_key)

    async def settle(
        self, child: Child, reason: str, *, escalated: bool = False, signal_key: str = ""
    ) -> None:
        """The generation is over (its group empty): let its output catch up, reap its leader, and
        say how it ended. Once: a SIGKILL's force and a shutdown may both see the end, and the
        second waits for the first's record (bounded by its output trail and write timeout)."""
        if child.settled is not None:
            with anyio.CancelScope(shield=True):
                await child.settled.wait()
            return
        child.settled = anyio.Event()
        try:
            with anyio.CancelScope(shield=True):
                await self._record_exit(child, reason, escalated, signal_key)
        finally:
            child.settled.set()
        self._bell.ring()

    async def _record_exit(self, child: Child, reason: str, escalated: bool, signal_key: str) -> None:
        """``settle``'s work, done once per generation."""
        with anyio.move_on_after(OUTPUT_TRAIL_S):
            for pump in self._generations.pumps:
                await pump.done.wait()
        status = child.reap()
        self._generations.ended(child, status)
        await self._receipts.write(
            "exit",
            "observed",
            evidence=child.evidence,
            issued_at=datetime.now(UTC),
            exit_status=status,
            escalated=escalated,
            reason=f"{child.describe_exit()}; {reason}",
            signal_key=signal_key,
        )
