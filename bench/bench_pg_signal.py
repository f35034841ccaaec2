"""SignalEntity with 64 callers: one replica on PostgreSQL vs one on SQLite, and three replicas vs one.

The client is bench_signal's (one client process, requests pre-serialized,
1,000 entities spawned first and left `spawning`, where SIGUSR is recorded
with outcome `ignored`: every call appends one signal record durably and
updates the entity row). The same client, requests and phase run against:

- ``electric server --data DIR`` (SQLite, WAL, synchronous=FULL): the
  ceiling of the first figure;
- ``electric server --database URL`` (PostgreSQL on this machine, pool of 4,
  ``synchronous_commit=on``), on a fresh database;
- three such replicas on one fresh database, the 64 callers split over three
  client processes, one per replica, all at once (their throughputs added),
  alternating round by round with all 64 callers on the first replica alone,
  its ceiling. A replica that fails to start leaves the row saying why (the
  error line of its log).

SQLite and PostgreSQL alternate for ``--rounds`` rounds; medians are
reported. No target is set by the issue for these ratios: they are reported.
On two cores, the database, the replicas and the client share the machine:
what bounds each run is printed from the CPU each process used (server,
client, and "other", which includes PostgreSQL's backends).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import pg_common
from bench_signal import run_client

CALLERS = 64
REPLICAS = 3


def replicas(url: str, tmp: Path, n: int) -> list[common.ServerProc]:
    """``n`` servers on the database; fewer if one is refused (its log says why)."""
    started: list[common.ServerProc] = []
    for k in range(n):
        try:
            started.append(common.start_electric(tmp / f"replica-{k}", "--database", url))
        except (RuntimeError, TimeoutError) as exc:
            print(f"replica {k + 1} did not start: {exc}", file=sys.stderr)
            break
    return started


def three_replicas(url: str, tmp: Path, params: dict[str, Any], rounds: int) -> dict[str, Any] | str:
    """Calls/s of 64 callers over three replicas and over the first alone, alternating for
    ``rounds`` rounds on the same database and processes (medians); or why it could not run."""
    servers = replicas(url, tmp, REPLICAS)
    try:
        if len(servers) < REPLICAS:
            log = (tmp / f"replica-{len(servers)}.server.log").read_text(errors="replace")
            why = next((line for line in log.splitlines() if "electric server:" in line), log[-300:])
            return f"replica {len(servers) + 1} did not start ({why.strip()})"
        run_client("electric", servers[0].address, servers[0].pid, params | {"prespawn": True, "phases": []})
        split = [CALLERS // REPLICAS + (1 if k < CALLERS % REPLICAS else 0) for k in range(REPLICAS)]
        phase = params["phases"][0]
        one: list[float] = []
        three: list[float] = []
        for _ in range(rounds):
            alone = run_client("electric", servers[0].address, servers[0].pid, params)
            one.append(alone["phases"][0]["throughput"])
            with concurrent.futures.ThreadPoolExecutor(REPLICAS) as pool:
                futures = [
                    pool.submit(
                        run_client,
                        "electric",
                        srv.address,
                        srv.pid,
                        params | {"phases": [phase | {"callers": c, "count": phase["count"] // REPLICAS}]},
                    )
                    for srv, c in zip(servers, split, strict=True)
                ]
                # The three clients run at once, so their rates add up (each over its own phase).
                three.append(sum(f.result()["phases"][0]["throughput"] for f in futures))
        return {
            "three": common.percentile(three, 50),
            "one": common.percentile(one, 50),
            "rounds_three": three,
            "rounds_one": one,
        }
    finally:
        for server in servers:
            server.stop()


def median(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Each figure's median over the rounds of the one phase."""
    phases = [r["phases"][0] for r in rounds]
    figures = {
        "throughput": lambda p: p["throughput"],
        "p50": lambda p: p["latency_ms"]["p50"],
        "p99": lambda p: p["latency_ms"]["p99"],
        "server_cpu_util": lambda p: p["server_cpu_util"],
        "client_cpu_util": lambda p: p["client_cpu_util"],
        "other_cpu_util": lambda p: p["other_cpu_util"],
    }
    return {name: common.percentile([get(p) for p in phases], 50) for name, get in figures.items()}


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument(
        "--rounds", type=int, default=3, help="alternating SQLite/PostgreSQL rounds (median reported)"
    )
    args = p.parse_args()
    rounds = 1 if args.quick else args.rounds
    t_start = time.perf_counter()
    entities = common.scale(1000, args.quick)
    phase = {
        "callers": CALLERS,
        "warmup": common.scale(2000, args.quick),
        "count": common.scale(20_000, args.quick),
    }
    params: dict[str, Any] = {"entities": entities, "phases": [phase]}
    results: dict[str, list[dict[str, Any]]] = {"sqlite": [], "postgres": []}
    info: dict[str, Any] = {
        "callers": CALLERS,
        "rounds": rounds,
        "postgres": asyncio.run(pg_common.settings()),
    }
    with tempfile.TemporaryDirectory(prefix="electric-bench-pg-signal-") as tmp_dir:
        tmp = Path(tmp_dir)
        with (
            pg_common.fresh_database("electric_bench_pg_signal") as url,
            common.start_electric(tmp / "sqlite") as lite,
            common.start_electric(tmp / "pg", "--database", url) as pg,
        ):
            for r in range(rounds):
                results["sqlite"].append(
                    run_client("electric", lite.address, lite.pid, params | {"prespawn": r == 0})
                )
                results["postgres"].append(
                    run_client("electric", pg.address, pg.pid, params | {"prespawn": r == 0})
                )
        with pg_common.fresh_database("electric_bench_pg_replicas") as url:
            three = three_replicas(url, tmp, params, rounds)
    info["results"], info["three_replicas"] = results, three
    s64, p64 = median(results["sqlite"]), median(results["postgres"])
    n = f" (median of {rounds})" if rounds > 1 else ""
    rows = [
        common.value_row(
            f"SignalEntity, {CALLERS} callers, PostgreSQL vs SQLite, one replica{n}",
            p64["throughput"],
            s64["throughput"],
            "calls/s",
        ),
        common.value_row("  p50 latency, PostgreSQL vs SQLite", p64["p50"], s64["p50"], "ms"),
        common.value_row("  p99 latency, PostgreSQL vs SQLite", p64["p99"], s64["p99"], "ms"),
        common.value_row(
            "  (info) server CPU, PostgreSQL vs SQLite",
            p64["server_cpu_util"],
            s64["server_cpu_util"],
            "cores",
        ),
        common.value_row(
            "  (info) other CPU (PostgreSQL's backends), PostgreSQL run", p64["other_cpu_util"], None, "cores"
        ),
    ]
    if isinstance(three, dict):
        rows.append(
            common.value_row(
                f"SignalEntity, {CALLERS} callers, three replicas vs one (PostgreSQL){n}",
                three["three"],
                three["one"],
                "calls/s",
            )
        )
    else:
        print(f"three replicas vs one: not measured: {three}")
    common.report("bench_pg_signal", rows, info, time.perf_counter() - t_start, args.quick)
    for kind, ph in (("sqlite", s64), ("postgres", p64)):
        print(
            f"  {kind}: {ph['throughput']:,.0f} calls/s, p50 {ph['p50']:.2f} ms, server "
            f"{ph['server_cpu_util']:.2f} cores, client {ph['client_cpu_util']:.2f}, other {ph['other_cpu_util']:.2f}"
        )


if __name__ == "__main__":
    main()
