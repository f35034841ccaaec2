"""Generation evidence: what proves that a PID still names the process we started.

A PID alone proves nothing (it is reused); the pair (PID, start time from
``/proc/<pid>/stat``) on the same boot does, for as long as the process is
not reaped. A generation is that pair plus the boot id, the task id and a
generation counter; every action re-observes it first (``observe``). A
generation this worker did not start (its stored evidence, found after a
worker died) is proved with a pidfd opened before the comparison (``prove``).
"""

from __future__ import annotations

import os
import select
from dataclasses import dataclass
from functools import cache

from ..._proto.electric.v1 import types_pb2 as pb

__all__ = ["Evidence", "ProcStat", "Proof", "boot_id", "observe", "proc_stat", "prove", "start_time"]

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


@cache
def boot_id() -> str:
    """This boot's id, for the evidence; empty where the platform has none."""
    return current_boot_id()


def current_boot_id() -> str:
    """Read afresh (``boot_id`` is cached): a re-observation must not trust a cache."""
    try:
        with open(_BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class ProcStat:
    """What ``/proc/<pid>/stat`` says of a process: the fields the runtime judges it by."""

    pid: int
    state: str  # field 3: R, S, D, T, Z (exited, not yet reaped), X, ...
    ppid: int  # field 4
    pgrp: int  # field 5
    start_time: int  # field 22: clock ticks after boot

    @property
    def exited(self) -> bool:
        """A zombie (or a dead task): it exited and only waits to be reaped; it can do nothing more."""
        return self.state in ("Z", "X")


def proc_stat(pid: int) -> ProcStat | None:
    """The process's stat line, or None when it is unreadable (no such process, or not visible)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')': split after the last.
    rest = stat[stat.rfind(b")") + 2 :].split()
    try:  # fields 3.. are rest[0..]
        return ProcStat(pid, rest[0].decode(), int(rest[1]), int(rest[2]), int(rest[19]))
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks after boot), or None when unreadable."""
    stat = proc_stat(pid)
    return stat.start_time if stat is not None else None


@dataclass(frozen=True)
class Evidence:
    task_id: str
    generation: int
    pid: int
    start_time: int
    boot_id: str
    worker_id: str

    def to_pb(self) -> pb.ProcessGeneration:
        return pb.ProcessGeneration(
            task_id=self.task_id,
            generation=self.generation,
            pid=self.pid,
            start_time=self.start_time,
            boot_id=self.boot_id,
            worker_id=self.worker_id,
        )

    @classmethod
    def from_json(cls, value: dict[str, object]) -> Evidence:
        def num(key: str) -> int:
            v = value.get(key)
            return int(v) if isinstance(v, int | str) else 0

        return cls(
            str(value.get("task_id", "")),
            num("generation"),
            num("pid"),
            num("start_time"),
            str(value.get("boot_id", "")),
            str(value.get("worker_id", "")),
        )

    def describe(self) -> str:
        return f"generation {self.generation} (pid {self.pid}, start time {self.start_time})"


def observe(evidence: Evidence) -> str | None:
    """None when ``evidence.pid`` still names that generation and it has not exited; else the doubt,
    in words. A zombie still has its start time, but it is gone: it is never called running."""
    now_boot = current_boot_id()
    if now_boot != evidence.boot_id:
        return f"the boot id is {now_boot or 'unreadable'}, not {evidence.boot_id}: the machine restarted"
    now = proc_stat(evidence.pid)
    if now is None:
        return f"pid {evidence.pid} is not running (/proc/{evidence.pid}/stat is unreadable)"
    return _judge(evidence, now)


def _judge(evidence: Evidence, now: ProcStat) -> str | None:
    if now.start_time != evidence.start_time:
        return (
            f"pid {evidence.pid} now belongs to another process "
            f"(start time {now.start_time}, not {evidence.start_time})"
        )
    if now.exited:
        return f"pid {evidence.pid} has exited (a zombie its parent, pid {now.ppid}, has not reaped yet)"
    return None


@dataclass(frozen=True)
class Proof:
    """What re-observing a generation another process started found.

    ``pidfd``: it is running and proved, and this pidfd names it (the caller owns it);
    ``gone``: it is not running (why); ``doubt``: it may be running but nothing proves it (why)."""

    pidfd: int | None = None
    gone: str | None = None
    doubt: str | None = None


def prove(evidence: Evidence) -> Proof:
    """Prove a generation that is not this process's child: open a pidfd for its PID first, then
    compare the start time and the boot id. A match after the pidfd was opened means the pidfd
    names that very process (a PID names one process at a time, and a process that was running then
    and is running now never stopped), so signals sent through it cannot reach a successor."""
    now_boot = current_boot_id()
    if now_boot != evidence.boot_id:
        return Proof(gone=observe(evidence))
    try:
        pidfd = os.pidfd_open(evidence.pid)
    except ProcessLookupError:
        return Proof(gone=f"pid {evidence.pid} is not running")
    except (OSError, AttributeError) as exc:  # AttributeError: no pidfds on this platform
        return Proof(doubt=f"no pidfd for pid {evidence.pid} ({exc}): nothing proves which process it is")
    now = proc_stat(evidence.pid)
    if now is None and _exited(pidfd):
        reason: str | None = f"pid {evidence.pid} has exited"
    elif now is None:
        os.close(pidfd)
        return Proof(doubt=f"pid {evidence.pid} is running, but /proc/{evidence.pid}/stat is unreadable")
    else:
        reason = _judge(evidence, now)
    if reason is not None:
        os.close(pidfd)
        return Proof(gone=reason)
    return Proof(pidfd=pidfd)


def _exited(pidfd: int) -> bool:
    """A pidfd turns readable once its process has exited (whoever its parent is)."""
    return bool(select.select([pidfd], [], [], 0)[0])
