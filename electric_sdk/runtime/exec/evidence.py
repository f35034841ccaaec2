"""Generation evidence: what proves that a PID still names the process we started.

A PID alone proves nothing (it is reused); the pair (PID, start time from
``/proc/<pid>/stat``) on the same boot does, for as long as the process is
not reaped. A generation is that pair plus the boot id, the task id and a
generation counter; every action re-observes it first (``observe``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from ..._proto.electric.v1 import types_pb2 as pb

__all__ = ["Evidence", "boot_id", "observe", "start_time"]

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


def start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks after boot), or None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')': split after the last.
    rest = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(rest[19])  # fields 3.. are rest[0..]; field 22 is rest[19]
    except (IndexError, ValueError):
        return None


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
    """None when ``evidence.pid`` still names that generation; else the doubt, in words."""
    now_boot = current_boot_id()
    if now_boot != evidence.boot_id:
        return f"the boot id is {now_boot or 'unreadable'}, not {evidence.boot_id}: the machine restarted"
    now = start_time(evidence.pid)
    if now is None:
        return f"pid {evidence.pid} is not running (/proc/{evidence.pid}/stat is unreadable)"
    if now != evidence.start_time:
        return (
            f"pid {evidence.pid} now belongs to another process (start time {now}, not {evidence.start_time})"
        )
    return None
