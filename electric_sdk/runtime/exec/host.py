"""ExecHost: one leased exec entity, whose code is an OS process (ARCHITECTURE §4).

The process starts when the entity starts or wakes; each message is written
to its stdin as one line (a run that completes once the line is written); its
stdout and stderr go into the stream as ``output`` events; a natural exit
moves the entity to ``idle`` (cause ``process_exited``) and the next message
starts a new generation. Signals map onto the process: SIGTERM runs the
shutdown policy, SIGKILL forces now, SIGSTOP/SIGCONT freeze and thaw the
process group, SIGINT, SIGHUP and SIGUSR are passed on as SIGINT, SIGHUP and
SIGUSR1. Every act writes an ``exec`` receipt. Taking the entity up, judging
signals and the cleanup's frame are host_base.py's, as for Python code; this
module says what the process does.

The shutdown's rules (seed 003): the timeout starts only once the graceful
action was issued to the proved generation; an exit before the timeout ends
it with no force; at expiry the generation is re-observed and forced exactly
once; any doubt holds the action, and the receipt says why. The child is
reaped only after the last action on it, so its PID cannot be reused while
an action could still name it.

On the posix backend a generation is its whole process group (as systemd's
``KillMode=control-group``): once its main process has exited, whatever is
left in the group gets the policy too, and the generation ends (its ``exit``
receipt) only when the group is empty. A generation found running that
another worker started is proved, taken over and shut down before a new one
starts: one entity never has two live generations on one host.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio

from ... import lifecycle
from ..._proto.electric.v1 import runtime_service_pb2 as rt
from ..._proto.electric.v1 import types_pb2 as pb
from ...lifecycle import STATE_RULES, Action, Effect, Outcome, Signal, runtime_outcome
from ..context import Message, SignalInfo
from ..fenced import FINAL_WRITE_TIMEOUT_S, WorkerLink, message_of
from ..host_base import HostBase
from . import receipts
from .evidence import Evidence, prove
from .hooks import ActionPlan, run_hook
from .output import OutputPump
from .process import Adopted, Child, describe_left, describe_status, spawn
from .receipts import stored_generation
from .spec import STDIN_ACTIONS, ExecType

__all__ = ["ExecHost"]

log = logging.getLogger("electric.runtime.exec")

# How long a forced process may take to die before the host stops waiting (a process in
# uninterruptible sleep); and how long output may trail the exit before the EXIT receipt.
FORCE_WAIT_S = 5.0
OUTPUT_TRAIL_S = 0.2
# While a generation that cannot be proved gone blocks new ones, how often it is looked at again.
ORPHAN_RECHECK_S = 0.5
FORWARDED = {
    Signal.SIGINT: "SIGINT",
    Signal.SIGHUP: "SIGHUP",
    Signal.SIGUSR: "SIGUSR1",
    Signal.SIGSTOP: "SIGSTOP",
    Signal.SIGCONT: "SIGCONT",
}
# A scoped SIGINT: its message's line was already written, or it was cancelled before.
_SCOPED_MISSED = runtime_outcome(Action.ABORT_RUN, Effect.NO_TARGET)
_SCOPED_CANCELLED = runtime_outcome(Action.ABORT_RUN, Effect.ACTED)


class ExecHost(HostBase):
    def __init__(self, session: WorkerLink, etype: ExecType, grant: rt.LeaseGranted) -> None:
        super().__init__(session, grant)
        self.etype = etype
        self.spec = etype.spec
        self.task_id = f"{self.lease.ref.type}/{self.lease.ref.id}"
        self.worker_id = str(getattr(session, "worker_id", ""))
        self.child: Child | None = None
        self.generation = 0
        # The last generation we know of and how it ended (None: never started, or still running).
        self.last: Evidence | None = None
        self.last_status: int | None = None
        # A stored generation this worker does not hold and cannot prove gone: never acted on, and no
        # new generation starts while it may run.
        self.orphan: Evidence | None = None
        # A generation taken over that could not be acted on after all: held (``orphan``) from then.
        self._let_go: Child | None = None
        self._exited_in_session = False
        self._start_refused = False  # said once while a held generation blocks new ones
        self._busy = 0  # shutdowns/kills in progress: they settle the exit themselves
        self._pumps: list[OutputPump] = []
        self._seen: set[int] = set()
        self._shutdown_scope: anyio.CancelScope | None = None
        self._killing = False  # a SIGKILL's force is under way (_force_now)
        self._receipt_order = anyio.Lock()
        # Signals delivered with the lease act only once the stored generation has been judged.
        self._recovered = anyio.Event()

    @property
    def alive(self) -> bool:
        return self.child is not None and not self.child.exited.is_set()

    # -- lifetime -------------------------------------------------------------------------------

    async def _after(self) -> None:
        await self._end_child()
        if self._let_go is not None:
            self._let_go.close()  # its pidfd (it is never reaped here: not ours)

    async def _prepare(self) -> None:
        try:
            await self._recover()
        finally:
            self._recovered.set()

    async def _loop(self) -> None:
        while self.end_reason is None:
            state = self.state
            rules = STATE_RULES[state]
            child = self.child
            if rules.terminal:
                if not self._busy:
                    self.end(state.value)
                    return
            elif child is not None and child.exited.is_set() and not self._busy:
                await self._after_exit(child)
                continue
            elif rules.starts_runs and not self._busy:
                if self._draining:
                    await self._shutdown("the worker is draining")
                    self.end("drained")
                    return
                if child is not None and child.adopted:  # it reads no line of ours: it ends first
                    await self._shutdown(
                        f"taken over from {child.evidence.worker_id or 'another worker'}: "
                        "a new generation starts once it has ended"
                    )
                    if not child.reaped and not self._busy:  # held: it could not be acted on
                        self.child, self.orphan, self._let_go = None, child.evidence, child
                    continue
                if child is None:
                    if self._exited_in_session:  # a natural exit: no automatic restart
                        if await self._go_idle("process_exited"):
                            return
                    elif self.orphan is not None:
                        await self._recheck_orphan()
                    else:
                        await self._start_child()
                    continue
                if self._queue:
                    await self._write_message(child, self._queue.pop(0))
                    continue
                if not self.spec.keep:
                    left = self._idle_left_s()
                    if left <= 0:
                        await self._shutdown("idle timeout")
                        if await self._go_idle("idle_timeout"):
                            return
                        continue
                    await self._bell.wait(left)
                    continue
            elif self._draining and not rules.cleanup and not self._busy:
                self.end("drained")
                return
            await self._bell.wait()

    # -- stored evidence ------------------------------------------------------------------------

    async def _recover(self) -> None:
        """Find the last generation in the stream; one this worker does not hold is proved
        (``evidence.prove``): gone, it is recorded so; running, it is taken over (its shutdown
        comes before any new generation); unprovable, it is held and blocks new generations."""
        try:
            history = await self._fenced.session.history(self.lease.ref)
        except Exception as exc:  # e.g. a token without the read scope: numbering starts afresh
            log.warning("%s: cannot read the stream (%s); generations restart at 1", self.task_id, exc)
            return
        stored = stored_generation(history)
        self.generation = max(self.generation, stored.newest)
        started = stored.started
        if started is not None and stored.ended:
            self.last, self.last_status = started, stored.exit_status
        if started is None or stored.ended:
            return
        proof = prove(started)
        by = started.worker_id or "another worker"
        if proof.gone is not None:
            self.last = started
            await self._receipt(
                "recover", "observed", evidence=started, reason=f"{started.describe()} is gone: {proof.gone}"
            )
        elif proof.pidfd is not None and self.spec.backend == "posix":
            child = Adopted(started, proof.pidfd)
            self.child = child
            assert self._tg is not None
            self._tg.start_soon(self._watch, child)
            await self._receipt(
                "recover", "issued", evidence=started, issued_at=datetime.now(UTC),
                reason=(
                    f"{started.describe()} is still running (proved: a pidfd opened, then its start time "
                    f"and boot id matched); started by {by}, which no longer holds it: this worker takes it "
                    "over, and its shutdown policy runs before any new generation starts"
                ),
            )  # fmt: skip
        else:
            if proof.pidfd is not None:  # running, but this backend has no way to act on it
                os.close(proof.pidfd)
            doubt = (
                proof.doubt or f"the {self.spec.backend} backend cannot take over a process it did not start"
            )
            self.orphan = started
            await self._receipt(
                "recover", "held", evidence=started,
                reason=(
                    f"{started.describe()}, started by {by}, may still be running: {doubt}; "
                    "this worker never signals it, and starts no new generation while it may run"
                ),
            )  # fmt: skip

    # -- the process ------------------------------------------------------------------------------

    async def _start_child(self) -> None:
        self.generation += 1
        cwd = self.spec.cwd
        try:
            child = spawn(self.spec, self.task_id, self.generation, self.worker_id, cwd)
        except OSError as exc:
            log.warning("%s: cannot start %s: %s", self.task_id, self.spec.argv, exc)
            self._exited_in_session = True
            await self._receipt("start", "refused", reason=f"cannot start {self.spec.argv[0]!r}: {exc}")
            return
        self.child = child
        self._idle_since = self._fenced.session.now_s()
        assert self._tg is not None
        self._tg.start_soon(self._watch, child)
        self._pumps = []
        assert child.popen is not None  # spawned here: its pipes are ours
        for name, stream in (("stdout", child.popen.stdout), ("stderr", child.popen.stderr)):
            if stream is not None:
                pump = OutputPump(
                    stream, name, self.task_id, self.generation, self.spec.output_limit, self._emit
                )
                self._pumps.append(pump)
                self._tg.start_soon(pump.run)
        await self._receipt(
            "start",
            "observed",
            evidence=child.evidence,
            issued_at=datetime.now(UTC),
            reason=f"started {self.spec.argv!r}",
            tags=list(self.spec.tags),
        )

    async def _watch(self, child: Child) -> None:
        await child.watch()
        self._bell.ring()

    async def _emit(self, chunk: pb.ExecOutput) -> None:
        await self._fenced.write(retry=True, output=chunk)

    async def _after_exit(self, child: Child) -> None:
        """The main process exited on its own: what it left in its group gets the policy first."""
        reason = "exited on its own"
        if left := child.leftovers():
            await self._shutdown(f"its main process exited ({child.describe_exit()}); {describe_left(left)}")
            if child.reaped or self._busy:
                return  # the policy ended it, or SIGKILL took over
            reason = f"exited on its own; {describe_left(child.leftovers())} could not be stopped"
        await self._settle(child, reason)

    async def _settle(
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
        """``_settle``'s work, done once per generation."""
        with anyio.move_on_after(OUTPUT_TRAIL_S):
            for pump in self._pumps:
                await pump.done.wait()
        status = child.reap()
        if self.child is child:
            self.child = None
            # A generation taken over ends to make room for ours; one of ours ending is an exit.
            self._exited_in_session = not child.adopted
        self.last, self.last_status = child.evidence, status
        await self._receipt(
            "exit",
            "observed",
            evidence=child.evidence,
            issued_at=datetime.now(UTC),
            exit_status=status,
            escalated=escalated,
            reason=f"{child.describe_exit()}; {reason}",
            signal_key=signal_key,
        )

    async def _act(
        self, child: Child, action: str, name: str, *, group: bool, reason: str, signal_key: str = ""
    ) -> datetime | None:
        """Plan → hook → re-observe → issue. Returns when it was issued, or None (held: receipt written)."""
        plan = ActionPlan(self.task_id, child.evidence, action, name, group, reason)
        await run_hook(plan)
        doubt = child.recheck(group=group)
        if doubt is None:
            try:
                child.send(name, group=group)
                return datetime.now(UTC)
            except OSError as exc:
                doubt = f"{name} failed: {exc}"
        await self._receipt(
            action, "held", evidence=child.evidence, name=name, group=group, signal_key=signal_key,
            reason=f"{reason}: nothing sent, because {doubt}",
        )  # fmt: skip
        return None

    async def _shutdown(self, reason: str, signal_key: str = "") -> None:
        """The shutdown policy on the current generation, to its end (exit, or force then exit)."""
        child = self.child
        if child is None or child.reaped:
            return
        self._busy += 1
        try:
            await self._shutdown_child(child, reason, signal_key)
        finally:
            self._busy -= 1
            self._bell.ring()

    async def _shutdown_child(self, child: Child, reason: str, signal_key: str) -> None:
        if self._killing:
            # A SIGKILL came before this shutdown began (a SIGTERM and a SIGKILL delivered close
            # together): its force ends the generation and says how; a graceful action now would
            # only race it. One that began first is cancelled by the SIGKILL (_shutdown_scope).
            return
        if child.done():
            await self._settle(child, f"exited before the graceful action ({reason})", signal_key=signal_key)
            return
        timeout, why = self.etype.shutdown_timeout(self.entity.grace_period)
        graceful, group = self._graceful_for(child)
        with anyio.CancelScope() as scope:  # SIGKILL cancels the wait and forces at once
            self._shutdown_scope = scope
            issued = await self._act(
                child, "graceful", graceful, group=group, reason=reason, signal_key=signal_key
            )
            if issued is None:
                if child.done():
                    await self._settle(
                        child, f"exited before the graceful action ({reason})", signal_key=signal_key
                    )
                return
            start = anyio.current_time()
            self._thaw(child)
            await self._receipt(
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
                await self._settle(
                    child, f"exited after {graceful}, before the timeout; no force", signal_key=signal_key
                )
                return
            still = describe_left(child.leftovers()) if child.gone() else "still running"
            await self._force(child, f"{reason}: {still} at the deadline", signal_key, issued + timeout)
        if scope.cancelled_caught and self.child is child and not child.reaped:
            return  # SIGKILL took over: _kill settles it

    def _graceful_for(self, child: Child) -> tuple[str, bool]:
        """The graceful action for ``child`` and whether it goes to its group: the policy's, unless
        only the rest of its group is left, or it was taken over (no pipes of ours)."""
        if child.backend == "posix" and (child.adopted or child.gone()):
            return self.etype.group_graceful, True
        graceful = self.etype.graceful
        return graceful, graceful not in STDIN_ACTIONS

    async def _graceful_to_the_rest(
        self, child: Child, reason: str, signal_key: str, deadline: datetime
    ) -> None:
        """The leader exited after a stdin action: the rest of its group gets a signal, within the same
        deadline."""
        name = self.etype.group_graceful
        why = (
            f"{reason}: its main process exited ({child.describe_exit()}); {describe_left(child.leftovers())}"
        )
        issued = await self._act(child, "graceful", name, group=True, reason=why, signal_key=signal_key)
        if issued is not None:
            self._thaw(child)
            await self._receipt(
                "graceful", "issued", evidence=child.evidence, name=name, group=True, issued_at=issued,
                deadline=deadline, policy_timeout=max(deadline - issued, timedelta(0)),
                reason=f"{why}; the same deadline", signal_key=signal_key,
            )  # fmt: skip

    def _thaw(self, child: Child) -> None:
        """A frozen process cannot act on a graceful action: it is continued after it."""
        if child.frozen and child.backend == "posix":
            with contextlib.suppress(OSError):
                child.send("SIGCONT", group=True)
            child.frozen = False

    async def _force(
        self, child: Child, reason: str, signal_key: str, deadline: datetime | None = None
    ) -> None:
        force = self.etype.force
        group = child.backend == "posix"
        issued = await self._act(child, "force", force, group=group, reason=reason, signal_key=signal_key)
        if issued is not None:
            await self._receipt(
                "force", "issued", evidence=child.evidence, name=force, group=group, issued_at=issued,
                deadline=deadline, escalated=True, reason=reason, signal_key=signal_key,
            )  # fmt: skip
            with anyio.move_on_after(FORCE_WAIT_S):
                await child.wait_done()
        if child.done():
            await self._settle(child, reason, escalated=issued is not None, signal_key=signal_key)

    async def _end_child(self) -> None:
        """Hosting ended: a generation still running must not outlive its lease."""
        child = self.child
        if child is None or child.reaped:
            return
        with anyio.move_on_after(FORCE_WAIT_S + FINAL_WRITE_TIMEOUT_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(child.watch)  # the host's watcher went with its task group
                if not child.done():
                    await self._force(child, f"hosting ended ({self.end_reason})", "")
                else:
                    await self._settle(child, f"exited as hosting ended ({self.end_reason})")
                tg.cancel_scope.cancel()
        if not child.reaped and not child.done():
            log.error("%s: %s did not die; left unreaped", self.task_id, child.evidence.describe())

    # -- messages -------------------------------------------------------------------------------

    def _line(self, message: Message) -> str:
        if self.spec.stdin_format == "json":
            body = {"key": message.key, "text": message.text, "data": message.data, "sender": message.sender}
            return json.dumps(body | {"attempt": message.attempt}, separators=(",", ":"))
        if not message.text and message.data is not None:
            return json.dumps(message.data, separators=(",", ":"))
        return message.text.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")

    async def _write_message(self, child: Child, message: Message) -> None:
        if await self._started(message) is None:
            return
        status, error = pb.RUN_STATUS_COMPLETED, ""
        try:
            await child.write(self._line(message))
        except OSError as exc:
            status, error = pb.RUN_STATUS_FAILED, f"the process does not read stdin: {exc}"
        with anyio.CancelScope(shield=True), anyio.move_on_after(FINAL_WRITE_TIMEOUT_S):
            await self._ended(message, status, error=error)
        self._idle_since = self._fenced.session.now_s()

    # -- signals --------------------------------------------------------------------------------

    def _on_message(self, event: pb.Event, attempt: int) -> None:
        if event.offset not in self._seen:
            self._seen.add(event.offset)
            self._queue.append(message_of(event, attempt))
            self._bell.ring()

    def _run_in_progress(self, event: pb.Event, info: SignalInfo, cell: lifecycle.Cell) -> bool:
        return self.alive  # the process stands for the run

    def _scoped_sigint(self, info: SignalInfo, pending: bool) -> None:
        assert self._tg is not None
        self._tg.start_soon(self._cancel_queued, info, pending)

    def _kill(self, info: SignalInfo, pending: bool) -> None:
        assert self._tg is not None
        self._busy += 1  # at once: the loop must not end the hosting before the kill has run
        self._killing = True
        self._tg.start_soon(self._force_now, info, pending)

    def _enforce(self, info: SignalInfo, pending: bool, decision: lifecycle.Decision) -> None:
        assert self._tg is not None
        assert decision.action is not None
        self._tg.start_soon(self._forward, info, pending, decision.action)

    async def _forward(self, info: SignalInfo, pending: bool, action: Action) -> None:
        await self._recovered.wait()
        name = FORWARDED[info.signal]
        child = self.child
        effect, detail = Effect.DELIVERED, ""
        if child is None or child.exited.is_set():
            effect, detail = Effect.NO_TARGET, "no process is running"
            # An ignored signal says why a stored PID is left alone.
            ignored = runtime_outcome(action, effect) is Outcome.IGNORED
            if ignored and (self.last is not None or self.orphan is not None):
                evidence = self.orphan or self.last
                await self._receipt(
                    "forward", "refused", evidence=evidence, name=name, signal_key=info.key,
                    reason=self._no_generation(),
                )  # fmt: skip
        elif child.backend != "posix":
            effect, detail = Effect.UNSUPPORTED, f"the {child.backend} backend has no {name}"
            await self._receipt(
                "forward", "refused", evidence=child.evidence, name=name, signal_key=info.key, reason=detail
            )
        else:
            issued = await self._act(
                child,
                "forward",
                name,
                group=True,
                reason=f"{info.signal.value} {info.key}",
                signal_key=info.key,
            )
            if issued is None:
                effect, detail = Effect.FAILED, "the generation could not be proved; nothing sent"
            else:
                child.frozen = info.signal is Signal.SIGSTOP or (
                    child.frozen and info.signal is not Signal.SIGCONT
                )
                detail = f"{name} sent to {child.evidence.describe()}"
                await self._receipt(
                    "forward", "issued", evidence=child.evidence, name=name, group=True, issued_at=issued,
                    signal_key=info.key, reason=f"{info.signal.value}",
                )  # fmt: skip
        if pending:
            await self._fenced.outcome(info, runtime_outcome(action, effect), detail)
        self._bell.ring()

    async def _cancel_queued(self, info: SignalInfo, pending: bool) -> None:
        queued = next((m for m in self._queue if m.key == info.message_key), None)
        if queued is None:
            if pending:
                await self._fenced.outcome(info, _SCOPED_MISSED, "that message's line was already written")
            return
        self._queue.remove(queued)
        await self._ended(queued, pb.RUN_STATUS_ABORTED, error="cancelled before it started")
        if pending:
            await self._fenced.outcome(info, _SCOPED_CANCELLED, "cancelled before its line was written")

    async def _force_now(self, info: SignalInfo, pending: bool) -> None:
        """SIGKILL: the shutdown in progress gives way; the generation is forced at once."""
        try:
            await self._recovered.wait()
            if self._shutdown_scope is not None:
                self._shutdown_scope.cancel()
            child = self.child
            if child is not None and not child.reaped:
                await self._force(child, f"SIGKILL {info.key}", info.key)
            if pending:
                await self._fenced.outcome(info, runtime_outcome(Action.KILL, Effect.ACTED))
        finally:
            self._busy -= 1
            self.end("killed")

    # -- SIGTERM ----------------------------------------------------------------------------------

    def _start_cleanup(self, info: SignalInfo | None, pending: bool) -> None:
        if not self._cleanup_started:
            self._busy += 1  # at once: the loop must not end the hosting before the cleanup has run
        super()._start_cleanup(info, pending)

    async def _clean_up(self, info: SignalInfo | None, pending: bool) -> bool:
        """The shutdown policy on the current generation (leased for the cleanup: nothing of ours runs)."""
        await self._recovered.wait()
        key = info.key if info is not None else ""
        await self._cleanup_requested(info, pending)
        if self._killing:
            pass  # a SIGKILL came meanwhile: its force ends the generation, and its receipts say so
        elif self.child is not None and not self.child.reaped:
            await self._shutdown_child(self.child, f"SIGTERM {key}".strip(), key)
        else:
            await self._receipt(
                "graceful", "refused", evidence=self.orphan or self.last, name=self.etype.graceful,
                signal_key=key, reason=self._no_generation(),
            )  # fmt: skip
        # Past the grace deadline the cleanup did not complete: the server writes `grace_expired`
        # (once the exit receipt is in, or its settle has passed), as it would for Python code.
        return self.grace_deadline is None or datetime.now(UTC) < self.grace_deadline

    def _cleanup_ended(self) -> None:
        self._busy -= 1
        # A SIGKILL that cut the cleanup short has its force under way: it ends the hosting (as
        # killed) once the process is dead. Ended here, the force would be cancelled half-way and
        # issued a second time, as "hosting ended", by _end_child.
        log.debug(
            "%s: the cleanup is over%s", self.task_id, " (cut short by SIGKILL)" if self._killing else ""
        )
        if not self._killing:
            super()._cleanup_ended()

    async def _recheck_orphan(self) -> None:
        """No new generation beside a held one that may still run: the start is refused (said once),
        and the held one is looked at again now and then until it is proved gone (messages queue
        meanwhile; SIGTERM and SIGKILL still end the entity)."""
        orphan = self.orphan
        assert orphan is not None
        proof = prove(orphan)
        if proof.pidfd is not None:
            os.close(proof.pidfd)
        if proof.gone is not None:
            self.orphan, self.last, self.last_status = None, orphan, None
            await self._receipt(
                "recover", "observed", evidence=orphan, reason=f"{orphan.describe()} is gone: {proof.gone}"
            )
            return
        if not self._start_refused:
            self._start_refused = True
            doubt = proof.doubt or f"the {self.spec.backend} backend cannot take it over"
            await self._receipt(
                "start", "refused", evidence=orphan,
                reason=(
                    f"no new generation while {orphan.describe()}, started by "
                    f"{orphan.worker_id or 'another worker'}, may still be running: {doubt}"
                ),
            )  # fmt: skip
        await self._bell.wait(ORPHAN_RECHECK_S)

    def _no_generation(self) -> str:
        if self.orphan is not None:
            return (
                f"this worker holds no generation: {self.orphan.describe()} was started by "
                f"{self.orphan.worker_id or 'another worker'} and cannot be proved here; nothing sent"
            )
        if self.last is not None:
            how = describe_status(self.last_status)
            return (
                f"no live generation: {self.last.describe()} ended ({how}) and was reaped; "
                f"pid {self.last.pid} is not signalled"
            )
        return "no process was ever started; nothing sent"

    # -- receipts -------------------------------------------------------------------------------

    async def _receipt(self, action: str, disposition: str, **fields: Any) -> None:
        """Write an ``exec`` receipt (``receipts.build`` names the fields), even while cancelled."""
        receipt = receipts.build(self.task_id, self.spec.backend, action, disposition, **fields)
        name, reason = fields.get("name", ""), fields.get("reason", "")
        log.info("%s: exec %s %s %s %s", self.task_id, action, name, disposition, reason)
        # One at a time, so they land in the order of the acts: a receipt refused because the state
        # moved (a SIGKILL during a SIGTERM's) is retried, and must not land after the receipt of an
        # act that came after its own. Each write keeps its own bound; the wait for the lock is
        # bounded by the writes before it.
        with anyio.CancelScope(shield=True):
            async with self._receipt_order:
                with anyio.move_on_after(FINAL_WRITE_TIMEOUT_S):
                    await self._fenced.write(retry=True, exec=receipt)
