"""CPU per trip, by process: what one trip of a latency figure costs each process it crosses.

On a machine with fewer cores than busy processes (bench_dbos's SIGINT → `unwound`: a client, a
server, a worker and PostgreSQL on two cores), a trip's latency is bounded by the CPU all of them
spend in the same milliseconds as much as by any one part that waits. These readings say how
much, per process, beside the same trip built bare (chain_floor.py), in the same run.

Each trip is read before and after: the other processes' CPU from ``common.proc_cpu_ns`` (the
scheduler's exact count, every thread: a trip is far shorter than a clock tick), the caller's own
from ``getrusage``, read last before the trip and first after it, so that reading the others is
not charged to it. A reading of the others lands just after the trip's end: it includes what each does
right behind the answer (an acknowledgement, a watch's copy), which is that trip's cost too. The
reads add nothing to a trip's window, but do to the machine: take them in a loop of their own, not
in one whose latency is the figure. Linux only: elsewhere ``available()`` is False and a bench
leaves its CPU rows out.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

SELF = "client"  # the group the caller's own process is read as

# A PostgreSQL server's processes that do a commit's work: the backends of one database (found
# by the caller, e.g. with BACKENDS_SQL) and the WAL writer, which flushes what they leave.
BACKENDS_SQL = (
    "SELECT pid FROM pg_stat_activity WHERE (datname = current_database() "
    "AND backend_type = 'client backend' AND pid <> pg_backend_pid()) OR backend_type = 'walwriter'"
)


def available() -> bool:
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat")


async def backends(url: str) -> list[int]:
    """The pids of the database at ``url``'s backends (this reader's own excepted) and of its
    server's WAL writer: read once the processes under test have connected."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return [row["pid"] for row in await conn.fetch(BACKENDS_SQL)]
    finally:
        await conn.close()


def _own_ns() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return round((r.ru_utime + r.ru_stime) * 1e9)


class TripCPU:
    """CPU per trip of the processes in ``groups`` (name → pids) and of the caller (``SELF``)."""

    def __init__(self, groups: Mapping[str, Sequence[int]]) -> None:
        self.groups = {name: tuple(pids) for name, pids in groups.items()}
        self.totals_ns = dict.fromkeys((SELF, *self.groups), 0)
        self.trips = 0
        self._before: dict[str, int] = {}

    def _others(self) -> dict[str, int]:
        return {name: sum(common.proc_cpu_ns(p) for p in pids) for name, pids in self.groups.items()}

    def before(self) -> None:
        self._before = self._others()
        self._before[SELF] = _own_ns()  # last: the reads above are not the trip's

    def after(self) -> None:
        own = _own_ns()  # first: the reads below are not the trip's
        now = self._others()
        now[SELF] = own
        for name, value in now.items():
            self.totals_ns[name] += value - self._before[name]
        self.trips += 1

    def result(self) -> dict[str, Any]:
        """What ``per_trip_ms`` adds up across rounds (it crosses processes as JSON would)."""
        return {"totals_ns": dict(self.totals_ns), "trips": self.trips}


def per_trip_ms(results: Sequence[Mapping[str, Any] | None]) -> dict[str, float]:
    """Each group's CPU per trip over ``results`` (``TripCPU.result()``s; None: a round that read
    none), in milliseconds, and ``all`` of them; empty when no trip was read."""
    trips = sum(r["trips"] for r in results if r)
    if not trips:
        return {}
    totals: dict[str, int] = {}
    for r in results:
        for name, ns in (r or {}).get("totals_ns", {}).items():
            totals[name] = totals.get(name, 0) + ns
    out = {name: ns / trips / 1e6 for name, ns in totals.items()}
    out["all"] = sum(out.values())
    return out
