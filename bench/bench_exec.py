"""Exec entities: how late the force action comes after the shutdown deadline, beside coreutils `timeout -k`.

Processes: ``electric server`` (fresh data dir), ``electric worker --exec
tasks.toml`` (a real worker hosting one exec type) and this script as the
client. The child is the same small Python program in both halves: it
prints ``ready``, catches SIGTERM (and ignores it), and sleeps, so every run
ends in the force action.

- electric: per run, spawn ``trap/N`` (policy SIGTERM, timeout T), wait for
  its ``ready`` output, send SIGTERM and wait for the ``exit`` receipt. From
  the receipts, on the worker's clock: force lateness = FORCE ``issued_at`` -
  GRACEFUL ``deadline`` (the deadline is the graceful action's issue time +
  T); death lateness = EXIT ``issued_at`` (exit seen and the child reaped) -
  deadline.
- ceiling: ``timeout -k T T child`` (SIGTERM after T, SIGKILL T later). The
  child prints ``time.time()`` when SIGTERM reaches it; this script takes
  ``time.time()`` when ``timeout`` exits (its child killed and reaped).
  Death lateness = exit time - (SIGTERM time + T). `timeout` issues its
  SIGKILL from a timer in C; the ratio says what electric's re-observation,
  receipts and Python event loop cost on top.

Target (issue 5): p99 force lateness ≤ 20 ms over 50 runs.
"""

from __future__ import annotations

import asyncio
import json
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

CHILD = """
import signal, sys, time
def term(*_):
    print("term", repr(time.time()), flush=True)
signal.signal(signal.SIGTERM, term)
print("ready", flush=True)
while True:
    time.sleep(3600)
"""
WAIT_S = 30.0


def tasks_file(path: Path, timeout_ms: int) -> None:
    command = json.dumps([common.PY, "-u", "-c", CHILD])
    path.write_text(
        f'[[exec]]\nid = "trap"\ncommand = {command}\nkeep = true\ngrace_period = "10s"\n'
        f'[exec.shutdown]\ngraceful = "SIGTERM"\ntimeout = "{timeout_ms}ms"\n'
    )


async def electric_runs(address: str, runs: int) -> dict[str, list[float]]:
    from electric_sdk._proto.electric.v1 import types_pb2 as pb
    from electric_sdk.client import AsyncClient

    force_ms: list[float] = []
    death_ms: list[float] = []
    async with AsyncClient(address) as c:
        for i in range(runs):
            ref = f"trap/r{i}"
            await c.spawn(ref)
            receipts: list[Any] = []

            async def follow(ref: str = ref, receipts: list[Any] = receipts) -> None:
                async for ev in c.watch(ref, 0):
                    if ev.type == "output" and "ready" in ev.value["text"]:
                        await c.signal(ref, "SIGTERM")
                    elif ev.type == "exec":
                        receipts.append(ev.raw.exec)
                        if ev.raw.exec.action == pb.EXEC_ACTION_EXIT:
                            return

            await asyncio.wait_for(follow(), WAIT_S)
            by = {r.action: r for r in receipts}  # the raw receipts: their times have µs resolution
            deadline = by[pb.EXEC_ACTION_GRACEFUL].deadline.ToNanoseconds()
            force_ms.append((by[pb.EXEC_ACTION_FORCE].issued_at.ToNanoseconds() - deadline) / 1e6)
            death_ms.append((by[pb.EXEC_ACTION_EXIT].issued_at.ToNanoseconds() - deadline) / 1e6)
    return {"force_ms": force_ms, "death_ms": death_ms}


def timeout_runs(runs: int, timeout_ms: int) -> list[float]:
    seconds = f"{timeout_ms / 1000:g}"
    late: list[float] = []
    for _ in range(runs):
        proc = subprocess.Popen(
            ["timeout", "-k", seconds, seconds, common.PY, "-u", "-c", CHILD],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        term = float(proc.stdout.readline().split()[1])
        # Popen.wait(timeout) polls with sleeps of up to 50 ms; a pidfd wakes us when it exits.
        pidfd = os.pidfd_open(proc.pid)
        readable, _, _ = select.select([pidfd], [], [], WAIT_S)
        died = time.time()
        os.close(pidfd)
        assert readable, "timeout -k did not end"
        proc.wait(WAIT_S)
        proc.stdout.close()
        assert proc.returncode in (128 + signal.SIGKILL, -signal.SIGKILL), proc.returncode  # it re-raises
        late.append((died - (term + timeout_ms / 1000)) * 1000)
    return late


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--timeout-ms", type=int, default=400, help="the policy's timeout (and timeout -k's)")
    args = p.parse_args()
    if args.quick:
        args.runs = common.scale(args.runs, True, 10)
    started = time.perf_counter()
    ours = common.run_beside_exec_worker(
        "bench-exec-",
        lambda tasks: tasks_file(tasks, args.timeout_ms),
        lambda address: electric_runs(address, args.runs),
    )
    theirs = timeout_runs(args.runs, args.timeout_ms)
    elapsed = time.perf_counter() - started

    force = common.summarize(ours["force_ms"])
    death = common.summarize(ours["death_ms"])
    ceiling = common.summarize(theirs)
    rows = [
        common.value_row(
            f"force lateness after the deadline, p99 ({args.runs} runs)",
            force["p99"],
            ceiling["p99"],
            "ms",
            "<=",
            20.0,
        ),
        common.value_row("info: force lateness, p50", force["p50"], ceiling["p50"], "ms"),
        common.value_row("info: force lateness, max", force["max"], ceiling["max"], "ms"),
        common.value_row(
            "info: death seen + reaped after the deadline, p50 (ceiling: timeout -k)",
            death["p50"],
            ceiling["p50"],
            "ms",
        ),
        common.value_row(
            "info: death seen + reaped after the deadline, p99 (ceiling: timeout -k)",
            death["p99"],
            ceiling["p99"],
            "ms",
        ),
        common.value_row("info: force lateness, min (never early)", min(ours["force_ms"]), None, "ms"),
    ]
    info = {"args": vars(args), "force_ms": force, "death_ms": death, "timeout_k_ms": ceiling}
    common.report("bench_exec", rows, info, elapsed, args.quick)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
