"""Run every benchmark in sequence (each its own process), then print one summary.

    python bench/run_all.py            # full size
    python bench/run_all.py --quick    # every load scaled down 10x (smoke run)
    python bench/run_all.py --only bench_store bench_watch
    ELECTRIC_BENCH_QUICK=1 make bench

Each bench writes bench/results/<name>.json; the summary is read back from
those files. Exit status: 1 if a bench failed to run (or, with --strict, if
any figure missed its target), else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

BENCHES = [
    "bench_signal",
    "bench_store",
    "bench_signal_many",
    "bench_watch",
    "bench_fanout",
    "bench_sse",
    "bench_sdk",
    "bench_completion",
    "bench_dashboard",
    "bench_restart",
    "bench_runtime",
    "bench_sigterm_interrupt",
    "bench_version_grant",
    "bench_send_wait",
    "bench_mcp_cancel",
    "bench_cascade",
    "bench_steps",
    "bench_parallel_steps",
    "bench_exec",
    "bench_exec_reaped",
    "bench_worker_metrics",
    "bench_http",
    "bench_fastpaths",
    "bench_pg_store",
    "bench_pg_write",
    "bench_pg_signal",
    "bench_dbos",
    "bench_dbos_step",
    "bench_replica_signal",
    "bench_replicas",
    "bench_feed_cost",
    "bench_failover",
]
TIMEOUT_S = 1800  # per bench, including building the restart dataset the first time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick",
        action="store_true",
        default=os.environ.get("ELECTRIC_BENCH_QUICK", "") not in ("", "0"),
        help="scale every load down 10x (also ELECTRIC_BENCH_QUICK=1, e.g. for `make bench`)",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 if any figure misses its target")
    p.add_argument("--only", nargs="+", choices=BENCHES, help="run only these")
    args = p.parse_args()
    names = args.only or BENCHES
    failed: list[str] = []
    took: dict[str, float] = {}
    started = time.time()
    for name in names:
        print(f"\n##### {name}{' --quick' if args.quick else ''}", flush=True)
        cmd = [common.PY, str(common.BENCH / f"{name}.py")] + (["--quick"] if args.quick else [])
        t0 = time.perf_counter()
        try:
            rc = subprocess.run(cmd, check=False, cwd=common.REPO, timeout=TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            rc = -1
            print(f"{name}: timed out after {TIMEOUT_S} s", file=sys.stderr)
        took[name] = time.perf_counter() - t0
        if rc != 0:
            failed.append(name)

    rows: list[common.Row] = []
    for name in names:
        path = common.RESULTS / f"{name}.json"
        if name in failed or not path.exists() or path.stat().st_mtime < started:
            continue
        record = json.loads(path.read_text())
        for r in record["rows"]:
            if r["passed"] is None:
                continue  # informational rows stay in the per-bench tables
            r.pop("result", None)
            rows.append(common.Row(**(r | {"figure": f"{name}: {r['figure']}"})))
    print()
    print(
        common.format_table(
            rows, f"===== summary{' (quick: targets are for full size)' if args.quick else ''} ====="
        )
    )
    print()
    for name in names:
        print(f"  {name:18s} {took[name]:7.1f} s{'  FAILED TO RUN' if name in failed else ''}")
    misses = sum(1 for r in rows if r.passed is False)
    print(
        f"\n{len(rows) - misses} PASS, {misses} MISS, {len(failed)} failed to run; total {time.time() - started:.0f} s"
    )
    if failed:
        return 1
    return 1 if args.strict and misses else 0


if __name__ == "__main__":
    sys.exit(main())
