"""ExecHost: one leased exec entity, whose code is an OS process (ARCHITECTURE §4).

The process starts when the entity starts or wakes; each message is written
to its stdin as one line (a run that completes once the line is written, or,
for a type with a ``Reply``, once its reply has been read from stdout: the
run's output; reply.py); its stdout and stderr go into the stream as
``output`` events; a natural exit
moves the entity to ``idle`` (cause ``process_exited``) and the next message
starts a new generation. Signals map onto the process: SIGTERM runs the
shutdown policy, SIGKILL forces now, SIGSTOP/SIGCONT freeze and thaw the
process group, SIGINT, SIGHUP and SIGUSR are passed on as SIGINT, SIGHUP and
SIGUSR1. Every act writes an ``exec`` receipt. Taking the entity up, judging
signals and the cleanup's frame are host_base.py's, as for Python code; this
module says what the process does, and when.

Its parts: ``generations`` (which generation runs, which ended, which is held,
and the stored one judged at the lease), ``shutdown`` (each act on a
generation, the shutdown policy, the end recorded once) and ``receipts``
(written in the order of the acts).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

import anyio

from ... import lifecycle
from ..._proto.electric.v1 import runtime_service_pb2 as rt
from ..._proto.electric.v1 import types_pb2 as pb
from ...lifecycle import STATE_RULES, Action, Effect, Outcome, Signal, runtime_outcome
from ..context import Message, SignalInfo
from ..fenced import FINAL_WRITE_TIMEOUT_S, WorkerLink, message_of
from ..host_base import HostBase
from .generations import Generations
from .output import OutputPump
from .process import Adopted, Child, describe_left, spawn
from .receipts import ReceiptLog, stored_generation
from .reply import ReplyReader
from .shutdown import FORCE_WAIT_S, Enforcer
from .spec import ExecType

__all__ = ["ExecHost"]

log = logging.getLogger("electric.runtime.exec")

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
        self.receipts = ReceiptLog(self.task_id, self.spec.backend, self._fenced)
        self.generations = Generations(self.spec.backend, self.receipts)
        self.enforcer = Enforcer(self.task_id, etype, self.generations, self.receipts, self._bell)
        self._busy = 0  # shutdowns/kills in progress: they settle the exit themselves
        self._seen: set[int] = set()
        # Signals delivered with the lease act only once the stored generation has been judged.
        self._recovered = anyio.Event()
        self._replies: ReplyReader | None = None  # the current generation's stdout, as replies
        # The run waiting for its reply: its message key and the scope a SIGINT cancels.
        self._reply_wait: tuple[str, anyio.CancelScope] | None = None

    @property
    def alive(self) -> bool:
        return self.generations.alive

    # -- lifetime -------------------------------------------------------------------------------

    async def _after(self) -> None:
        await self._end_child()
        self.generations.close()

    async def _prepare(self) -> None:
        try:
            await self._recover()
        finally:
            self._recovered.set()

    async def _loop(self) -> None:
        while self.end_reason is None:
            state = self.state
            rules = STATE_RULES[state]
            child = self.generations.child
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
                        self.generations.hold(child)
                    continue
                if child is None:
                    if self.generations.exited_in_session:  # a natural exit: no automatic restart
                        if await self._go_idle("process_exited"):
                            return
                    elif self.generations.orphan is not None:
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
                        # A SIGTERM during that shutdown moved the entity to stopping: its cleanup ends it.
                        if STATE_RULES[self.state].starts_runs and await self._go_idle("idle_timeout"):
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
        """Judge the last generation in the stream (``Generations.recover``)."""
        try:
            history = await self._fenced.session.history(self.lease.ref)
        except Exception as exc:  # e.g. a token without the read scope: numbering starts afresh
            log.warning("%s: cannot read the stream (%s); generations restart at 1", self.task_id, exc)
            return
        await self.generations.recover(stored_generation(history), self._adopt)

    def _adopt(self, child: Adopted) -> None:
        """A generation taken over is watched as one of ours."""
        assert self._tg is not None
        self._tg.start_soon(self._watch, child)

    async def _recheck_orphan(self) -> None:
        if not await self.generations.recheck_orphan():
            await self._bell.wait(ORPHAN_RECHECK_S)

    # -- the process ------------------------------------------------------------------------------

    async def _start_child(self) -> None:
        self.generations.number += 1
        cwd = self.spec.cwd
        try:
            child = spawn(self.spec, self.task_id, self.generations.number, self.worker_id, cwd)
        except OSError as exc:
            log.warning("%s: cannot start %s: %s", self.task_id, self.spec.argv, exc)
            self.generations.exited_in_session = True
            await self.receipts.write("start", "refused", reason=f"cannot start {self.spec.argv[0]!r}: {exc}")
            return
        self.generations.started(child)
        self._idle_since = self._fenced.session.now_s()
        assert self._tg is not None
        self._tg.start_soon(self._watch, child)
        assert child.popen is not None  # spawned here: its pipes are ours
        replies = self._replies = ReplyReader(self.spec.reply) if self.spec.reply is not None else None
        for name, stream in (("stdout", child.popen.stdout), ("stderr", child.popen.stderr)):
            if stream is not None:
                tap = replies.feed if replies is not None and name == "stdout" else None
                pump = OutputPump(
                    stream,
                    name,
                    self.task_id,
                    self.generations.number,
                    self.spec.output_limit,
                    self._emit,
                    tap,
                )
                self.generations.pumps.append(pump)
                self._tg.start_soon(pump.run)
        await self.receipts.write(
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
        await self.enforcer.settle(child, reason)

    async def _shutdown(self, reason: str, signal_key: str = "") -> None:
        """The shutdown policy on the current generation, to its end (exit, or force then exit)."""
        child = self.generations.child
        if child is None or child.reaped:
            return
        self._busy += 1
        try:
            await self.enforcer.shut_down(child, reason, signal_key, self.entity.grace_period)
        finally:
            self._busy -= 1
            self._bell.ring()

    async def _end_child(self) -> None:
        """Hosting ended: a generation still running must not outlive its lease."""
        child = self.generations.child
        if child is None or child.reaped:
            return
        with anyio.move_on_after(FORCE_WAIT_S + FINAL_WRITE_TIMEOUT_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(child.watch)  # the host's watcher went with its task group
                if not child.done():
                    await self.enforcer.force(child, f"hosting ended ({self.end_reason})", "")
                else:
                    await self.enforcer.settle(child, f"exited as hosting ended ({self.end_reason})")
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
        status, error, output = pb.RUN_STATUS_COMPLETED, "", ""
        replies = self._replies
        if replies is not None:
            replies.begin()  # before the line: a quick reply is not missed
        try:
            await child.write(self._line(message))
        except OSError as exc:
            status, error = pb.RUN_STATUS_FAILED, f"the process does not read stdin: {exc}"
        else:
            if replies is not None:
                status, error, output = await self._read_reply(replies, message)
        with anyio.CancelScope(shield=True), anyio.move_on_after(FINAL_WRITE_TIMEOUT_S):
            await self._ended(message, status, error=error, output=output)
        self._idle_since = self._fenced.session.now_s()

    async def _read_reply(
        self, replies: ReplyReader, message: Message
    ) -> tuple[pb.RunStatus.ValueType, str, str]:
        """The run's end once its reply is read: completed with it; aborted, with what was read,
        when stdout ended first or a SIGINT came; failed, with what was read, past its timeout."""
        reply = replies.reply
        with anyio.move_on_after(reply.timeout_s):
            with anyio.CancelScope() as scope:
                self._reply_wait = (message.key, scope)
                try:
                    text, whole = await replies.read()
                finally:
                    self._reply_wait = None
                if whole:
                    return pb.RUN_STATUS_COMPLETED, "", text
                return pb.RUN_STATUS_ABORTED, "the process's stdout ended before its reply was read", text
            return pb.RUN_STATUS_ABORTED, Signal.SIGINT.value, replies.partial
        assert reply.timeout_s is not None, "only the reply's timeout cancels this wait"
        return (
            pb.RUN_STATUS_FAILED,
            f"no reply ({reply.describe()}) within its timeout ({reply.timeout_s * 1000:.0f} ms)",
            replies.partial,
        )

    def _abort_reply(self, message_key: str | None = None) -> bool:
        """Abort the run waiting for its reply (only ``message_key``'s, if given); whether one was."""
        waiting = self._reply_wait
        if waiting is None or (message_key is not None and waiting[0] != message_key):
            return False
        waiting[1].cancel()
        return True

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
        self.enforcer.killing = True
        self._tg.start_soon(self._force_now, info, pending)

    def _enforce(self, info: SignalInfo, pending: bool, decision: lifecycle.Decision) -> None:
        assert self._tg is not None
        assert decision.action is not None
        if info.signal is Signal.SIGINT:
            self._abort_reply()  # the run is the reply's wait; the process gets its SIGINT too
        self._tg.start_soon(self._forward, info, pending, decision.action)

    async def _forward(self, info: SignalInfo, pending: bool, action: Action) -> None:
        await self._recovered.wait()
        name = FORWARDED[info.signal]
        child = self.generations.child
        effect, detail = Effect.DELIVERED, ""
        if child is None or child.exited.is_set():
            effect, detail = Effect.NO_TARGET, "no process is running"
            # An ignored signal says why a stored PID is left alone.
            ignored = runtime_outcome(action, effect) is Outcome.IGNORED
            evidence = self.generations.last_known
            if ignored and evidence is not None:
                await self.receipts.write(
                    "forward", "refused", evidence=evidence, name=name, signal_key=info.key,
                    reason=self.generations.nothing_sent(),
                )  # fmt: skip
        elif child.backend != "posix":
            effect, detail = Effect.UNSUPPORTED, f"the {child.backend} backend has no {name}"
            await self.receipts.write(
                "forward", "refused", evidence=child.evidence, name=name, signal_key=info.key, reason=detail
            )
        else:
            issued = await self.enforcer.act(
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
                await self.receipts.write(
                    "forward", "issued", evidence=child.evidence, name=name, group=True, issued_at=issued,
                    signal_key=info.key, reason=f"{info.signal.value}",
                )  # fmt: skip
        if pending:
            await self._fenced.outcome(info, runtime_outcome(action, effect), detail)
        self._bell.ring()

    async def _cancel_queued(self, info: SignalInfo, pending: bool) -> None:
        queued = next((m for m in self._queue if m.key == info.message_key), None)
        if queued is None and self._abort_reply(info.message_key):
            if pending:
                await self._fenced.outcome(info, _SCOPED_CANCELLED, "its wait for the reply was aborted")
            return
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
            self.enforcer.give_way()
            child = self.generations.child
            if child is not None and not child.reaped:
                await self.enforcer.force(child, f"SIGKILL {info.key}", info.key)
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
        child = self.generations.child
        if self.enforcer.killing:
            pass  # a SIGKILL came meanwhile: its force ends the generation, and its receipts say so
        elif child is not None and not child.reaped:
            await self.enforcer.shut_down(child, f"SIGTERM {key}".strip(), key, self.entity.grace_period)
        else:
            await self.receipts.write(
                "graceful", "refused", evidence=self.generations.last_known, name=self.etype.graceful,
                signal_key=key, reason=self.generations.nothing_sent(),
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
            "%s: the cleanup is over%s",
            self.task_id,
            " (cut short by SIGKILL)" if self.enforcer.killing else "",
        )
        if not self.enforcer.killing:
            super()._cleanup_ended()
