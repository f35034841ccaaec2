"""`electric run TYPE/ID --message TEXT`: a headless run (ARCHITECTURE §5, docs/cli.md).

It sends one message, follows the entity's stream from that message and
prints the events of its run, and ends when the run ends. With ``--json``
stdout is NDJSON in the versioned schema ``SCHEMA`` (docs/cli.md): every
record has a ``type``, and the last two are ``error`` (unless the run
completed) and ``session_complete``.

Our own process's signals (seed 004): the first SIGINT or SIGTERM interrupts
the command's own run through the control plane, with an entity SIGINT scoped
to its message (it aborts that message's run if it is the current one,
cancels the message if it has not started, touches nothing else); the command
then waits up to ``--grace`` for that SIGINT to reach the stage ``--stop-wait``
names (``unwound``: the run ended and is recorded; run_stages.py) and for the
run's end, prints each stage reached and what really happened to the run, and
exits 130 or 143. A second signal exits at once (128 + its number);
so does the grace running out, after saying the run's fate is unknown. Only
the command's own ``--timeout`` is a timeout (124). The handlers exist only
while the run is followed; the dispositions before it are restored after it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
from anyio.abc import TaskGroup

from .. import errors
from .._signals import two_stage_signals
from .._wire.run_outcome import RunFollow
from ..client import AsyncClient, ClientOptions, RetryPolicy
from ..durations import format_ms
from ..lifecycle import STATE_RULES, Signal, Stage
from ..models import EntityRef, Event, MessageReceipt
from . import console, exit_codes
from .commands import DEFAULT_ADDRESS, STREAM_RECONNECT_S, duration_s, parse_json, with_hint
from .console import Console
from .run_stages import DEFAULT_STOP_WAIT, STOP_STAGES, Receipts

SCHEMA = "electric.run/v1"
DEFAULT_GRACE = "5s"
DEFAULT_CALL_TIMEOUT = "10s"
# How long past the grace a wedged process (e.g. stuck writing to a full pipe) waits before the
# watchdog thread ends it: the event loop normally exits right at the grace.
WATCHDOG_MARGIN_S = 1.0
# Records about some message: another message's are not shown.
_OTHERS_RECORDS = ("message", "run", "signal")
_UNCERTAIN = (errors.Unavailable, errors.DeadlineExceeded)


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    summary = "send a message and follow its run until it ends (headless; --json: NDJSON)"
    p = sub.add_parser("run", help=summary, description=summary[0].upper() + summary[1:] + ".")
    p.add_argument("ref", metavar="TYPE/ID", help="the entity, e.g. my_agent/agent_1")
    p.add_argument("-m", "--message", metavar="TEXT", help="the message text; '-' reads it from stdin")
    p.add_argument("--data", metavar="JSON", help="a JSON value sent with the text")
    p.add_argument("--spawn", action="store_true", help="create the entity first if it does not exist")
    p.add_argument(
        "--grace",
        metavar="DURATION",
        default=DEFAULT_GRACE,
        help="after a signal or --timeout, how long to wait for the interrupt's stage and the run's end "
        "(default %(default)s)",
    )
    p.add_argument(
        "--stop-wait",
        metavar="STAGE",
        choices=STOP_STAGES,
        default=DEFAULT_STOP_WAIT,
        help="after a signal or --timeout, the stage the run's interrupt (a SIGINT) must reach before "
        "the command exits, printed with each stage reached: accepted (committed), unwound (the run "
        "ended and is recorded), downstream (and its MCP calls told) (default %(default)s)",
    )
    p.add_argument(
        "--call-timeout",
        metavar="DURATION",
        default=DEFAULT_CALL_TIMEOUT,
        help="deadline of each call to the server, retries included (default %(default)s)",
    )
    group = p.add_argument_group("global options (before or after the command)")
    # SUPPRESS: a global flag given before the command is kept. For `run`, --timeout bounds the run.
    group.add_argument("--address", metavar="HOST:PORT", default=argparse.SUPPRESS, help="the server")
    group.add_argument("--token", default=argparse.SUPPRESS, help="bearer token (env ELECTRIC_TOKEN)")
    group.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help=f"NDJSON records ({SCHEMA})"
    )
    group.add_argument(
        "--timeout",
        metavar="DURATION",
        default=argparse.SUPPRESS,
        help="the run's own timeout, from the message's acceptance: interrupt it, exit 124 (default none)",
    )
    p.set_defaults(func=command)


# -- settings -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    ref: EntityRef
    text: str
    data: Any
    spawn: bool
    grace_s: float
    timeout_s: float | None
    options: ClientOptions
    stop_wait: Stage = Stage.UNWOUND

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Settings:
        try:
            ref = EntityRef.parse(args.ref)
        except ValueError as exc:
            raise errors.InvalidArgument(str(exc), code="INVALID_NAME") from None
        data = parse_json(args.data, "--data")
        text = _read_stdin() if args.message == "-" else (args.message or "")
        if not text and data is None:
            raise errors.InvalidArgument(
                "a message needs --message TEXT or --data JSON", code="EMPTY_MESSAGE"
            )
        call_s = duration_s(args.call_timeout, "--call-timeout")
        return cls(
            ref=ref,
            text=text,
            data=data,
            spawn=args.spawn,
            grace_s=duration_s(args.grace, "--grace"),
            timeout_s=duration_s(args.timeout, "--timeout") if args.timeout else None,
            options=ClientOptions(
                address=args.address or os.environ.get("ELECTRIC_ADDRESS") or DEFAULT_ADDRESS,
                token=args.token or os.environ.get("ELECTRIC_TOKEN") or None,
                timeout_s=call_s,
                retry=RetryPolicy(total_s=call_s),
                reconnect_s=max(call_s, STREAM_RECONNECT_S),
            ),
            stop_wait=Stage(args.stop_wait),
        )


def _read_stdin() -> str:
    """``--message -``: the text on standard input, which must be there and be UTF-8."""
    if sys.stdin is None:
        raise errors.InvalidArgument(
            "--message -: standard input is closed; pipe the text in, or give it as --message TEXT",
            code="USAGE",
        )
    try:  # bytes, decoded strictly below (a text stream might have mangled them already)
        buffer = getattr(sys.stdin, "buffer", None)
        data = buffer.read() if buffer is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
    except OSError as exc:
        raise errors.InvalidArgument(
            f"--message -: cannot read standard input: {exc}", code="USAGE"
        ) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.InvalidArgument(
            f"--message -: standard input is not UTF-8 text (byte {exc.start}: {exc.reason})",
            code="INVALID_TEXT",
        ) from None


# -- how a session ends ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Stop:
    """Why the command stopped waiting for its run: a signal to this process, or --timeout."""

    name: str  # interrupted | terminated | timeout
    exit_code: int
    signal: str | None

    @classmethod
    def of_signal(cls, signum: int) -> Stop:
        if signum == signal.SIGTERM:
            return cls("terminated", exit_codes.TERMINATED, "SIGTERM")
        return cls("interrupted", exit_codes.INTERRUPTED, signal.Signals(signum).name)


TIMED_OUT = Stop("timeout", exit_codes.TIMEOUT, None)


@dataclass
class RunView(RunFollow):
    """What the stream said about the command's message and its run (``RunFollow``, the fold
    every door's wait shares), before the send and after a lost connection too."""

    # not_sent, then RunFollow's (queued | started, then how it ended), or unknown (not seen)
    message_key: str = ""
    status: str = "not_sent"
    # The offset of each scoped SIGINT to the message, by signal key.
    interrupt_offsets: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "started": self.started,
            "attempt": self.attempt,
            "output": self.output,
            "error": self.error,
            **({"question": self.question} if self.question is not None else {}),
        }


@dataclass(frozen=True)
class Ending:
    name: str  # completed, or the error record's name
    exit_code: int
    code: str = ""  # the error code on stderr (ERROR_CODE of `electric: ERROR_CODE: message`)
    message: str = ""
    signal: str | None = None


_RUN_FATE = {
    "aborted": "the run was aborted",
    "cancelled": "the message was cancelled before its run started",
    "completed": "the run had completed before the interrupt landed",
    "failed": "the run had failed before the interrupt landed",
    "input_required": "the run had asked for input before the interrupt landed",
    "steered": "the message had steered the run in progress before the interrupt landed",
    "unknown": "what became of the run is unknown: its end was not seen within the grace",
    "not_sent": "the message was not sent",
    # --stop-wait accepted: the command left once the interrupt was committed.
    "queued": "the interrupt was accepted; what it did to the message was not waited for",
    "started": "the interrupt was accepted; the run's end was not waited for",
}
# The entity states (as the stream names them) in which its runs are over for good.
_SHUTTING_DOWN = frozenset(state.value for state, rules in STATE_RULES.items() if rules.shutting_down)


def _from_error(error: errors.ElectricError) -> Ending:
    return Ending(error.code.lower(), exit_codes.for_error(error), error.code, error.message)


# -- the session ----------------------------------------------------------------------------------


class HeadlessRun:
    def __init__(self, out: Console, settings: Settings) -> None:
        self.out = out
        self.settings = settings
        self.ref = settings.ref
        self.run = RunView()
        self.receipt: MessageReceipt | None = None
        self.stop: Stop | None = None
        self.spawned = False
        self._client: AsyncClient | None = None
        self._tg: TaskGroup | None = None
        self._scope: anyio.CancelScope | None = None  # made on the loop, in main()
        self._follow_scope: anyio.CancelScope | None = None
        self.receipts = Receipts(settings.stop_wait)
        self._interrupt_answered: anyio.Event | None = None
        self._signalled: list[int] = []
        self._signal_arrived: anyio.Event | None = None
        self._send_started = False
        self._timeout_fired = False
        self._interrupts_sent: list[str] = []
        self._interrupts_in_flight = 0
        self._watchdog: threading.Timer | None = None
        self._started_at = time.monotonic()

    # -- output -------------------------------------------------------------------------------

    def _record(self, record: dict[str, Any]) -> None:
        if self.out.json_mode:
            self.out.record(record)

    def _note(self, text: str) -> None:
        """Progress for people: on stderr, so that stdout carries just the run's output."""
        if not self.out.json_mode:
            self.out.stderr.write(text + "\n")
            self.out.stderr.flush()

    def _warn(self, text: str) -> None:
        with contextlib.suppress(OSError):  # a note nobody can read is no reason to fail the run
            self.out.stderr.write(f"electric run: {text}\n")
            self.out.stderr.flush()

    def _show(self, event: Event) -> None:
        self._record(event.to_json())
        self._note(console.event_line(event))

    def finish(self, ending: Ending) -> int:
        """The terminal records: the interrupts' ``stop_stages``, ``error`` (unless the run
        completed), then ``session_complete``."""
        run = self.run
        stop = self.receipts.print_answers(self._record, self._note, SCHEMA)
        if ending.code:
            self.out.stderr.write(f"electric: {ending.code}: {ending.message}\n")
            self.out.stderr.flush()
            self._record(
                {
                    "type": "error",
                    "version": SCHEMA,
                    "name": ending.name,
                    "code": ending.code,
                    "message": ending.message,
                    "signal": ending.signal,
                    "run_status": run.status,
                }
            )
        self._record(
            {
                "type": "session_complete",
                "version": SCHEMA,
                "status": ending.name,
                "exit_code": ending.exit_code,
                "url": self.ref.url,
                "message_key": self.receipt.key if self.receipt else None,
                "run": run.to_json(),
                "entity_state": run.entity_state,
                "stop": stop,
                "elapsed_ms": round((time.monotonic() - self._started_at) * 1000),
            }
        )
        if not self.out.json_mode and run.output:
            self.out.stdout.write(run.output if run.output.endswith("\n") else run.output + "\n")
            self.out.stdout.flush()
        return ending.exit_code

    # -- the run ------------------------------------------------------------------------------

    async def main(self) -> int:
        self._scope = anyio.CancelScope()
        self._follow_scope = anyio.CancelScope()
        self._signal_arrived = anyio.Event()
        self._interrupt_answered = anyio.Event()
        async with AsyncClient(options=self.settings.options) as client, anyio.create_task_group() as tg:
            self._client, self._tg = client, tg
            tg.start_soon(self._stop_on_signal)
            with two_stage_signals(self._on_first_signal):
                try:
                    code = self.finish(await self._session())
                except BrokenPipeError:
                    console.discard_stdout()
                    code = exit_codes.BROKEN_PIPE
                if self.stop is not None and self.run.status == "unknown":
                    # The grace ran out: exit now, as a second signal would, without waiting for
                    # the connection to close or anything else to wind down.
                    os._exit(code)
            if self._watchdog is not None:
                self._watchdog.cancel()
            tg.cancel_scope.cancel()
        return code

    async def _session(self) -> Ending:
        assert self._scope is not None
        assert self._follow_scope is not None
        error: errors.ElectricError | None = None
        with self._scope:
            try:
                await self._send()
                with self._follow_scope:  # cut once the interrupt is accepted, with --stop-wait accepted
                    await self._follow()
                await self._interrupts_answered()
            except errors.ElectricError as exc:
                error = with_hint(exc, self.settings.options.address)  # as every command says it
                if isinstance(exc, errors.EntityNotFound) and not self.settings.spawn:
                    error = errors.EntityNotFound(f"{exc.message} (add --spawn to create it)", code=exc.code)
                if self.run.status != "not_sent" or (self._send_started and isinstance(exc, _UNCERTAIN)):
                    self.run.status = "unknown"  # the connection was lost: the run may go on
        if self._scope.cancelled_caught and self._send_started:
            self.run.status = "unknown"  # the grace ran out before the run's end was seen
            self.receipts.close(
                f"not reached within --grace {format_ms(round(self.settings.grace_s * 1000))}"
            )
        elif error is not None:
            self.receipts.close(f"not seen: the stream was lost ({error.code})")
        else:  # every stage of a SIGINT comes by its run's end
            self.receipts.close("not reached by the end of the run")
        return self._ending(error)

    def _ending(self, error: errors.ElectricError | None) -> Ending:
        run, stop = self.run, self.stop
        if stop is not None:  # the exit code follows the signal (or --timeout); the run says what happened
            if stop is TIMED_OUT:
                timeout_ms = round((self.settings.timeout_s or 0) * 1000)
                head = f"the run did not end within --timeout {format_ms(timeout_ms)}"
            else:
                head = f"{stop.name} by {stop.signal}"
                head += " after --timeout had expired" if self._timeout_fired else ""
            if error is None:
                message = f"{head}: {_RUN_FATE[run.status]}"
            else:  # the server was lost, or the message could not be sent
                fate = (
                    "what became of the run is unknown" if run.status == "unknown" else _RUN_FATE[run.status]
                )
                message = f"{head}: {fate} ({error.code}: {error.message})"
            return Ending(stop.name, stop.exit_code, stop.name.upper(), message, stop.signal)
        if error is not None:
            return _from_error(error)
        if run.status in ("completed", "input_required", "steered"):
            # Ends that are no failure: the run asked its question (the next message replies), or
            # the message was taken by the run in progress (docs/double-texting.md).
            return Ending(run.status, exit_codes.OK)
        if run.status == "failed":
            return Ending("run_failed", exit_codes.RUN_FAILED, "RUN_FAILED", f"the run failed: {run.error}")
        by_entity_signal = run.error in (Signal.SIGTERM.value, Signal.SIGKILL.value)
        if by_entity_signal or run.entity_state in _SHUTTING_DOWN:
            message = f"the entity is {run.entity_state or 'stopping'}: {_RUN_FATE[run.status]}"
            return Ending("entity_stopped", exit_codes.RUN_ABORTED, "ENTITY_STOPPED", message)
        message = _RUN_FATE[run.status] + (f" ({run.error})" if run.error else "")
        return Ending("run_aborted", exit_codes.RUN_ABORTED, "RUN_ABORTED", message)

    async def _send(self) -> None:
        client, s = self._client, self.settings
        assert client is not None
        if s.spawn:
            try:
                await client.get(self.ref)
            except errors.EntityNotFound:
                try:
                    await client.spawn(self.ref)
                    self.spawned = True
                except errors.EntityExists:
                    pass  # spawned meanwhile by someone else: use it
        self._send_started = True
        receipt = await client.send(self.ref, s.text, data=s.data)
        self.receipt = receipt
        self.run.message_key = receipt.key
        self.run.status, self.run.entity_state = "queued", receipt.state.value
        self._record(
            {
                "type": "session_start",
                "version": SCHEMA,
                "url": self.ref.url,
                "message_key": receipt.key,
                "message_offset": receipt.offset,
                "txid": str(receipt.txid),
                "state": receipt.state.value,
                "spawned": self.spawned,
            }
        )
        self._note(console.receipt_line(receipt))
        if s.timeout_s is not None:
            assert self._tg is not None
            self._tg.start_soon(self._time_out, s.timeout_s)
        self._reconsider()  # a signal that came during the send interrupts now

    async def _follow(self) -> None:
        assert self._client is not None
        assert self.receipt is not None
        run = self.run
        # watch() is an async generator: closing it when the run ends cancels the stream now.
        watch = cast(AsyncGenerator[Event, None], self._client.watch(self.ref, self.receipt.offset))
        async with contextlib.aclosing(watch) as events:
            async for event in events:
                self.receipts.see(event)
                was_started = run.started_offset
                if run.see(event.type, event.key, event.value, event.offset):
                    self._show(event)
                    if event.type == "signal":
                        scoped = event.value.get("signal") == Signal.SIGINT.value
                        if scoped and event.operation == "insert":
                            run.interrupt_offsets[event.key] = event.offset
                    elif run.ended:
                        return
                    elif run.started_offset != was_started:
                        self._reconsider()
                elif event.type == "state" or (event.type == "signal" and not event.value.get("message_key")):
                    self._show(event)
                elif event.type not in _OTHERS_RECORDS and run.started:
                    self._show(event)  # a custom event written while the run is in progress
        run.stream_closed()
        self.receipts.stream_closed()

    # -- stopping -------------------------------------------------------------------------------

    def _on_first_signal(self, signum: int) -> None:
        # Called on the loop, outside any task: the stopping itself happens in _stop_on_signal.
        assert self._signal_arrived is not None
        self._signalled.append(signum)
        self._signal_arrived.set()

    async def _stop_on_signal(self) -> None:
        assert self._signal_arrived is not None
        await self._signal_arrived.wait()
        name = signal.Signals(self._signalled[0]).name
        what = f"interrupting the run of {self.receipt.key}" if self.receipt else "stopping"
        self._warn(f"received {name}: {what} (send it again to exit at once)")
        self._request_stop(Stop.of_signal(self._signalled[0]))

    async def _time_out(self, seconds: float) -> None:
        await anyio.sleep(seconds)
        if self.stop is None:
            self._timeout_fired = True
            assert self.receipt is not None
            self._warn(
                f"--timeout {format_ms(round(seconds * 1000))} expired: interrupting the run of {self.receipt.key}"
            )
            self._request_stop(TIMED_OUT)

    def _request_stop(self, stop: Stop) -> None:
        assert self._scope is not None
        if self.stop is not None:
            if self.stop is TIMED_OUT and stop.signal:
                self.stop = stop  # a signal is never reported as a timeout: it takes over
            return
        self.stop = stop
        self.receipts.start()  # before any interrupt: what the watch shows from now on may follow it
        self._scope.deadline = min(self._scope.deadline, anyio.current_time() + self.settings.grace_s)
        # A backstop on its own thread: the loop ends the command at the deadline unless it is wedged.
        self._watchdog = threading.Timer(self.settings.grace_s + WATCHDOG_MARGIN_S, self._watchdog_exit)
        self._watchdog.daemon = True
        self._watchdog.start()
        if not self._send_started:
            self._scope.cancel()  # nothing was sent: nothing to interrupt
        self._reconsider()

    async def _interrupts_answered(self) -> None:
        """After the run's end: the answers of interrupts still in flight, whose receipts it
        settles (an interrupt that landed after the run's end is at once all it will be)."""
        while self._interrupts_in_flight:
            assert self._interrupt_answered is not None
            self._interrupt_answered = anyio.Event()
            await self._interrupt_answered.wait()

    def _watchdog_exit(self) -> None:
        os._exit(self.stop.exit_code if self.stop else exit_codes.ERROR)

    def _reconsider(self) -> None:
        """Send a scoped SIGINT unless one already sent can still stop the run.

        One the stream has not shown yet lands after everything seen so far, so
        it acts on the run in progress, or cancels the message while it is queued
        (the server does that at once, in the interrupt's own transaction). One
        that predates the run's latest STARTED record cannot act on that run (a
        signal acts on the run in progress when it is appended; e.g. a run
        started again after its worker was lost): then the run is interrupted
        again, now that it is current.
        """
        run = self.run
        if self.stop is None or self.receipt is None or run.ended or self._interrupts_in_flight:
            return
        offsets = [run.interrupt_offsets.get(key) for key in self._interrupts_sent]
        if any(offset is None or offset > run.started_offset for offset in offsets):
            return
        assert self._tg is not None
        self._interrupts_in_flight += 1
        self._tg.start_soon(self._interrupt, self.receipt.key)

    async def _interrupt(self, message_key: str) -> None:
        assert self._client is not None
        assert self.stop is not None
        try:
            result = await self._client.signal(
                self.ref, Signal.SIGINT, reason=f"electric run: {self.stop.name}", message_key=message_key
            )
        except errors.ElectricError as exc:  # e.g. the entity was stopped meanwhile: its stream ends
            self._warn(f"could not interrupt the run: {exc.code}: {exc.message}")
            return
        finally:
            self._interrupts_in_flight -= 1
            assert self._interrupt_answered is not None
            self._interrupt_answered.set()
        self._interrupts_sent.append(result.key)
        self.receipts.add(result, message_key)
        if self.receipts.wait is Stage.ACCEPTED:
            assert self._follow_scope is not None
            self._follow_scope.cancel()  # no later stage is waited for, nor the run's end
        self._reconsider()  # its record may already have been seen, before a later STARTED


def command(args: argparse.Namespace) -> int:
    out = Console(bool(args.json))
    try:
        try:
            console.require_stdout()
            settings = Settings.from_args(args)  # may read the message from stdin
        except errors.ElectricError as exc:
            return HeadlessRun(out, _placeholder(args)).finish(_from_error(exc))
        return asyncio.run(HeadlessRun(out, settings).main())
    except KeyboardInterrupt:  # Ctrl-C before the handlers were installed, or after they were removed
        return exit_codes.INTERRUPTED


def _placeholder(args: argparse.Namespace) -> Settings:
    """Settings good enough to report an error in the settings themselves."""
    try:
        ref = EntityRef.parse(args.ref)
    except ValueError:
        ref = EntityRef("-", "-")
    # Not ClientOptions(): its defaults read the environment, whose values may be the error.
    return Settings(ref, "", None, False, 0.0, None, ClientOptions(address=DEFAULT_ADDRESS, token=None))
