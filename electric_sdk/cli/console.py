"""What the CLI prints: aligned tables and one-line summaries for people, JSON for machines.

Human output goes to stdout, errors to stderr as ``electric: CODE: message``.
With ``--json``, stdout carries JSON only: one object per one-shot command, one
record per line (NDJSON, flushed per record) for a streaming one, and on failure
the RFC's error object ``{"error": {"code": ..., "message": ...}}`` as the last
(or only) line; the ``electric: CODE: message`` line still goes to stderr.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TextIO, cast

from .._wire.stop_stages import StageReport
from ..durations import format_ms
from ..errors import ElectricError, InvalidArgument
from ..event_text import event_line as event_line  # noqa: PLC0414 - re-exported: the commands print it
from ..models import (
    PROFILE_PENDING,
    Entity,
    EntityChange,
    LeaseHolder,
    MessageReceipt,
    RunResult,
    SignalResult,
)


class _Lost(io.TextIOBase):
    """A standard stream that was closed when the command started (Python makes it None):
    what is written to it is lost, as whoever closed it chose."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return len(text)


class Console:
    """stdout for results, stderr for errors; every write is flushed (streams are watched live)."""

    def __init__(self, json_mode: bool, stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self.json_mode = json_mode
        self.stdout: TextIO = stdout or sys.stdout or cast(TextIO, _Lost())
        self.stderr: TextIO = stderr or sys.stderr or cast(TextIO, _Lost())

    def record(self, obj: Any) -> None:
        """One JSON value on one line."""
        self.stdout.write(json_text(obj) + "\n")
        self.stdout.flush()

    def line(self, text: str) -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def note(self, text: str) -> None:
        """A remark about the result, for a person: on stderr, so stdout stays the result."""
        self.stderr.write(f"electric: {text}\n")
        self.stderr.flush()

    def error(self, error: ElectricError) -> None:
        self.stderr.write(f"electric: {error.code}: {error.message}\n")
        self.stderr.flush()
        if self.json_mode:
            self.record(error.to_json())


def json_text(obj: Any) -> str:
    """Every JSON the CLI prints: compact, one line, text as it is (not \\u-escaped)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# -- the standard streams -------------------------------------------------------------------------


def keep_standard_fds_open() -> None:
    """Give /dev/null to a standard fd (0, 1, 2) that was closed when the command started.

    Python has made its stream None, which still tells the command it was closed; but the fd
    must not stay free: the next file opened would get it, and what is written to the standard
    stream (gRPC's C core logs to fd 2) would land in that file.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free fd: this one, or one below
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def require_stdout() -> None:
    """A command whose result goes to stdout refuses to act when there is no stdout."""
    if sys.stdout is None:
        raise InvalidArgument(
            "standard output is closed: the result would be lost (redirect it to /dev/null to discard it)",
            code="USAGE",
        )


def discard_stdout() -> None:
    """Once stdout broke (a closed pipe): Python flushes it again at exit; /dev/null keeps that
    flush from failing too."""
    if sys.stdout is not None:
        _to_devnull(sys.stdout.fileno())


def _to_devnull(fd: int) -> None:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


class _Outlet(io.RawIOBase):
    """fd 1 or 2 of a long-running command, under its standard stream (see outlive_closed_output).

    A write whose reader is gone (EPIPE) is dropped, never raised: the fd is pointed at /dev/null,
    which then takes every later write — Python's, gRPC's C core's, Python's last flush at exit —
    and the other stream, while it still works, is told once.
    """

    # The fds whose reader is gone, shared by both outlets so neither says so to a broken one.
    _gone: ClassVar[set[int]] = set()

    def __init__(self, fd: int, name: str, command: str) -> None:
        super().__init__()
        self._fd, self._name, self._command = fd, name, command

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        try:
            return os.write(self._fd, data)
        except (BrokenPipeError, ConnectionResetError):
            self._reader_gone()
            return memoryview(data).nbytes

    def _reader_gone(self) -> None:
        if self._fd in self._gone:
            return
        self._gone.add(self._fd)
        _to_devnull(self._fd)
        other = 2 if self._fd == 1 else 1
        if other not in self._gone:
            note = f"electric {self._command}: {self._name} is closed (its reader is gone): its output is dropped\n"
            # Straight to the fd, past the other stream's buffer and its lock: no thread can be
            # holding that lock while it waits for this one.
            with contextlib.suppress(OSError):
                os.write(other, note.encode())


def outlive_closed_output(command: str) -> None:
    """`server`, `worker` and `dev`: what they print and log is for a person or a collector, and
    what they do must not depend on it. `make run | tee log` and then Ctrl-C kills `tee` with them
    (a terminal signals its whole foreground process group), and their drain still has receipts
    to write: from now on a standard stream whose reader is gone drops what is written to it."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        if not isinstance(old, io.TextIOWrapper):
            continue  # closed at start (None), or already replaced by whoever embeds us
        old.flush()
        raw = _Outlet(fd, name, command)
        # As the interpreter built it: unbuffered under -u / PYTHONUNBUFFERED, else buffered.
        buffer = io.BufferedWriter(raw) if isinstance(old.buffer, io.BufferedWriter) else raw
        setattr(
            sys,
            name,
            io.TextIOWrapper(
                cast(Any, buffer),
                encoding=old.encoding,
                errors=old.errors,
                line_buffering=old.line_buffering,
                write_through=old.write_through,
            ),
        )


# -- values ---------------------------------------------------------------------------------------


def when(dt: datetime, *, ms: bool = False) -> str:
    """UTC, ISO 8601, with a Z: ``2026-03-07T10:00:00Z`` (``.123Z`` with ``ms``)."""
    return dt.astimezone(UTC).isoformat(timespec="milliseconds" if ms else "seconds").replace("+00:00", "Z")


def duration(value: timedelta | None) -> str:
    """``1.5s``; a profile value still pending (None) says so."""
    if value is None:
        return PROFILE_PENDING
    return format_ms(int(value / timedelta(milliseconds=1)))


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: frozenset[int] = frozenset()) -> str:
    """Columns padded to their widest cell; the columns in ``right`` right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def render(cells: Sequence[str]) -> str:
        padded = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    return "\n".join(render(r) for r in [headers, *rows])


# -- entities -------------------------------------------------------------------------------------

ENTITY_HEADERS = ("URL", "STATE", "EVENTS", "GRACE", "IDLE", "UPDATED")
_ENTITY_RIGHT = frozenset({2})


def state_text(entity: Entity) -> str:
    """``idle``, or ``idle, waiting for code v1`` while its run waits for a worker of its version."""
    waiting = entity.waiting_for_code
    return f"{entity.state.value}, waiting for code {waiting}" if waiting else entity.state.value


def entity_row(entity: Entity) -> list[str]:
    return [
        entity.ref.url,
        state_text(entity),
        str(entity.head_offset),
        duration(entity.grace_period),
        duration(entity.idle_timeout),
        when(entity.updated_at),
    ]


def entity_table(entities: Sequence[Entity]) -> str:
    return table(ENTITY_HEADERS, [entity_row(e) for e in entities], _ENTITY_RIGHT)


def entity_detail(entity: Entity, extra: Sequence[tuple[str, str]] = ()) -> str:
    """The entity as an aligned list of fields, its URL first; ``extra``: more fields, last
    (what `get` reads beside the entity, e.g. its children), aligned with the rest."""
    fields = [
        ("state", state_text(entity)),
        ("grace period", duration(entity.grace_period)),
        ("idle timeout", duration(entity.idle_timeout)),
        ("events", str(entity.head_offset)),
        ("closed", "yes" if entity.closed else "no"),
        ("created", when(entity.created_at, ms=True)),
        ("updated", when(entity.updated_at, ms=True)),
        ("txid", str(entity.txid)),
        ("worker", holder_text(entity.holder)),
    ]
    if entity.parent is not None:
        fields.append(("parent", entity.parent.url))
    if entity.awaiting_input is not None:  # ctx.ask: the next message sent is the reply
        asked = entity.awaiting_input
        fields.insert(1, ("awaiting input", f"{asked.question} (asked by the run of {asked.run})"))
    if entity.stopping_deadline is not None:
        fields.insert(1, ("stopping until", when(entity.stopping_deadline, ms=True)))
    if entity.bound_code_version is not None:
        bound = entity.bound_code_version
        if entity.waiting_since is not None:  # its run waits for a worker of its version
            bound += f", waiting for a worker of it since {when(entity.waiting_since, ms=True)}"
        fields.insert(1, ("run on code", bound))
    fields += extra
    width = max(len(name) for name, _ in fields)
    return "\n".join([entity.ref.url, *(f"  {name.ljust(width)}  {value}" for name, value in fields)])


def holder_text(holder: LeaseHolder | None) -> str:
    """Who holds the entity's lease: ``host-1 (session 3f2a9c1d0b7e-4, lease epoch 3)``."""
    if holder is None:
        return "none"
    return f"{holder.worker_id} (session {holder.session}, lease epoch {holder.epoch})"


# -- results --------------------------------------------------------------------------------------


def signal_line(result: SignalResult) -> str:
    """``/type/id: SIGTERM running → stopping (pending, txid 12)``."""
    notes = [result.outcome.value] if result.outcome is not None else []
    notes.append(f"txid {result.txid}")
    transition = f"{result.previous_state.value} → {result.new_state.value}"
    return f"{result.url}: {result.signal.value} {transition} ({', '.join(notes)})"


def stage_line(report: StageReport) -> str:
    """``  unwound     reached at offset 7 (2026-12-06T16:08:28.425Z)`` or ``… not reached: why``."""
    if report.reached:
        where = f"reached at offset {report.offset} ({report.at})"
        return f"  {report.stage.value:<11} {where}" + (f": {report.detail}" if report.detail else "")
    return f"  {report.stage.value:<11} not reached: {report.detail}"


def receipt_line(receipt: MessageReceipt) -> str:
    # A policy other than enqueue acted on the run in progress: the line says so, and how.
    acted = f"; {receipt.policy} by {receipt.signal_key}" if receipt.signal_key else ""
    return (
        f"{receipt.ref.url}: message {receipt.key} at offset {receipt.offset} "
        f"({receipt.state.value}, txid {receipt.txid}{acted})"
    )


def run_line(result: RunResult) -> str:
    """How a waited run ended: its status, then its output or error."""
    parts = [f"run {result.status}"]
    if result.error:
        parts.append(f"error: {result.error}")
    if result.output is not None:
        parts.append(f"output: {result.output}")
    return "  ".join(parts)


# -- entity changes -------------------------------------------------------------------------------


def change_record(change: EntityChange) -> dict[str, Any]:
    """The NDJSON record of ``electric watch --json``."""
    return {
        "snapshot": change.snapshot,
        "entity": change.entity.to_json(),
        "previous_state": change.previous_state.value if change.previous_state else None,
    }


def transition(change: EntityChange) -> str:
    """``running → stopping``; ``→ spawning`` for a new entity; empty for a snapshot row."""
    if change.snapshot:
        return ""
    previous = change.previous_state.value if change.previous_state else ""
    return f"{previous} → {change.entity.state.value}".lstrip()


def change_line(change: EntityChange) -> str:
    entity = change.entity
    what = f"{entity.state.value} (snapshot)" if change.snapshot else transition(change)
    return f"{when(entity.updated_at, ms=True)}  {entity.ref.url}: {what}"
