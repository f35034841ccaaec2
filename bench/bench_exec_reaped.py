"""SIGTERM → an exec entity's `reaped` stage, beside coreutils `timeout -k` on the same process.

Processes: ``electric server`` (fresh data dir), ``electric worker --exec
tasks.toml`` (one exec type, shutdown policy: SIGTERM, then SIGKILL after T)
and this script as the client and the waiter. The child is the same small
Python program in both halves (bench_exec.py's): it prints ``ready``, catches
SIGTERM, prints ``time.time()`` when it arrives (and otherwise ignores it),
and sleeps, so every run ends in the force action, T after the TERM.

Both halves measure "signal sent → process gone, as a waiter sees it", one
run of each in turn (so both see the same load):

- electric: spawn ``trap/N``, wait for ``ready`` in its output events, then
  ``signal(ref, "SIGTERM", wait="reaped")``: from the call to the answer
  saying ``reaped`` (the EXIT receipt: the generation's exit observed by pid
  and start time, and reaped). This is the whole control-plane path: the
  signal's commit, the worker's graceful action, T, the force, the reap, the
  receipt's commit and the watch that brings it back.
- ceiling: ``timeout -k T T child``: from the TERM (the time the child
  printed when it arrived) to the moment a pidfd tells this script that
  ``timeout`` exited (its child killed and reaped). `timeout` has no control
  plane to cross, so the ratio is what that costs on top of T.

Info: electric from the same start as the ceiling (the child's TERM time, in
its output) to the answer: what is left once the signal has reached the
process.

Target (issue 48): p50 and p99 ≤ 1.2× the ceiling, 50 runs, T = 200 ms.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from bench_exec import CHILD, tasks_file

WAIT_S = 30.0


def _term_time(events: list[Any]) -> float | None:
    """The child's TERM time, from its ``term <time.time()>`` output line."""
    for ev in events:
        if ev.type == "output":
            for line in ev.value["text"].splitlines():
                if line.startswith("term "):
                    return float(line.split()[1])
    return None


# Where electric's time goes, from the stream's records (server and worker clocks: one machine).
LEGS = (
    "sent → accepted",
    "accepted → TERM issued",
    "deadline → KILL issued",
    "KILL → exit seen",
    "exit → answer",
)


def _legs(sent: float, answered: float, accepted: float, receipts: dict[int, Any]) -> dict[str, float]:
    from electric_sdk._proto.electric.v1 import types_pb2 as pb

    actions = (pb.EXEC_ACTION_GRACEFUL, pb.EXEC_ACTION_FORCE, pb.EXEC_ACTION_EXIT)
    graceful, force, end = (receipts[a] for a in actions)
    issued, deadline = graceful.issued_at.ToNanoseconds() / 1e9, graceful.deadline.ToNanoseconds() / 1e9
    killed, exited = force.issued_at.ToNanoseconds() / 1e9, end.issued_at.ToNanoseconds() / 1e9
    spans = (accepted - sent, issued - accepted, killed - deadline, exited - killed, answered - exited)
    return {leg: span * 1000 for leg, span in zip(LEGS, spans, strict=True)}


async def electric_once(c: Any, ref: str) -> tuple[float, float | None, dict[str, float]]:
    """One run: (call → `reaped` answer, child's TERM → answer, the legs), in ms."""
    await c.spawn(ref)
    async for ev in c.watch(ref, 0):
        if ev.type == "output" and "ready" in ev.value["text"]:
            break
    sent = time.time()
    result = await c.signal(ref, "SIGTERM", wait="reaped", timeout=f"{WAIT_S:g}s")
    answered = time.time()
    assert result.reached("reaped"), result.stages
    events = list((await c.events(ref, 0, 200)).events)
    term = _term_time(events)
    receipts = {ev.raw.exec.action: ev.raw.exec for ev in events if ev.type == "exec"}
    legs = _legs(sent, answered, result.created_at.timestamp(), receipts)
    return (answered - sent) * 1000, None if term is None else (answered - term) * 1000, legs


def timeout_once(timeout_ms: int) -> float:
    """One run of ``timeout -k T T child``: the child's TERM → `timeout` gone, in ms."""
    seconds = f"{timeout_ms / 1000:g}"
    proc = subprocess.Popen(
        ["timeout", "-k", seconds, seconds, common.PY, "-u", "-c", CHILD], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    term = float(proc.stdout.readline().split()[1])
    # Popen.wait(timeout) polls with sleeps of up to 50 ms; a pidfd wakes us when it exits.
    pidfd = os.pidfd_open(proc.pid)
    readable, _, _ = select.select([pidfd], [], [], WAIT_S)
    gone = time.time()
    os.close(pidfd)
    assert readable, "timeout -k did not end"
    proc.wait(WAIT_S)
    proc.stdout.close()
    assert proc.returncode in (128 + signal.SIGKILL, -signal.SIGKILL), proc.returncode  # it re-raises
    return (gone - term) * 1000


async def runs(address: str, n: int, timeout_ms: int) -> dict[str, list[float]]:
    from electric_sdk.client import AsyncClient

    ours: list[float] = []
    ours_from_term: list[float] = []
    theirs: list[float] = []
    legs: dict[str, list[float]] = {leg: [] for leg in LEGS}
    async with AsyncClient(address) as c:
        for i in range(n):
            # In turn, the order swapped each run: neither half always follows the other.
            for half in ("electric", "timeout") if i % 2 == 0 else ("timeout", "electric"):
                if half == "electric":
                    total, from_term, spans = await asyncio.wait_for(electric_once(c, f"trap/r{i}"), WAIT_S)
                    ours.append(total)
                    for leg, span in spans.items():
                        legs[leg].append(span)
                    if from_term is not None:
                        ours_from_term.append(from_term)
                else:
                    theirs.append(await asyncio.to_thread(timeout_once, timeout_ms))
    return {"electric_ms": ours, "electric_from_term_ms": ours_from_term, "timeout_k_ms": theirs} | {
        f"leg {leg}": spans for leg, spans in legs.items()
    }


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--timeout-ms", type=int, default=200, help="T: the policy's timeout (and timeout -k's)")
    args = p.parse_args()
    if args.quick:
        args.runs = common.scale(args.runs, True, 10)
    started = time.perf_counter()
    raw = common.run_beside_exec_worker(
        "bench-exec-reaped-",
        lambda tasks: tasks_file(tasks, args.timeout_ms),
        lambda address: runs(address, args.runs, args.timeout_ms),
    )
    elapsed = time.perf_counter() - started

    ours = common.summarize(raw["electric_ms"])
    from_term = common.summarize(raw["electric_from_term_ms"])
    ceiling = common.summarize(raw["timeout_k_ms"])
    label = f"SIGTERM → reaped answer (T = {args.timeout_ms} ms, {args.runs} runs; ceiling: timeout -k)"
    rows = [
        common.ratio_row(f"{label}, p50", ours["p50"], ceiling["p50"], "ms", "<=", 1.2),
        common.ratio_row(f"{label}, p99", ours["p99"], ceiling["p99"], "ms", "<=", 1.2),
        common.value_row("info: child's TERM → reaped answer, p50", from_term["p50"], ceiling["p50"], "ms"),
        common.value_row("info: child's TERM → reaped answer, p99", from_term["p99"], ceiling["p99"], "ms"),
        common.value_row("info: SIGTERM → reaped answer, max", ours["max"], ceiling["max"], "ms"),
    ]
    legs = {leg: common.summarize(raw[f"leg {leg}"]) for leg in LEGS}
    # The legs have no ceiling of their own: where the time goes, p50 with the p99 in the label.
    rows += [
        common.value_row(f"info: {leg}, p50 (p99 {v['p99']:.1f} ms)", v["p50"], None, "ms")
        for leg, v in legs.items()
    ]
    info = {
        "legs_ms": legs,
        "args": vars(args),
        "electric_ms": ours,
        "electric_from_term_ms": from_term,
        "timeout_k_ms": ceiling,
    }
    common.report("bench_exec_reaped", rows, info, elapsed, args.quick)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
