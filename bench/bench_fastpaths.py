"""Each fast path beside its fallback, in one run: the server with it, and with it forced off.

For each fast path of the registry (``electric_server.fastpaths.FAST_PATHS``)
two ``electric server`` processes run side by side, the same in all but one
thing: the second has ``ELECTRIC_FORCE_FALLBACKS=<name>`` in its environment,
so it runs that fast path's fallback and every other fast path as usual. The
load the fast path is for runs against each in turn, ``--rounds`` times,
alternating which goes first, so background load lands on both alike. A
round's two figures were measured together, so they stay together: each row
is the round of the median ratio, the fast path's figure beside its
fallback's (as the ceiling column) and their ratio, and every round's ratio
is printed. No targets: a fast path that stops paying shows as a ratio near
or past 1.

The loads (entities spawned first stay ``spawning``, where SIGUSR is recorded
as ``ignored``: every call appends one signal record durably and updates the
entity row; SQLite WAL, ``synchronous=FULL``, or a fresh PostgreSQL database):

- *calls/s, 64 callers* (``acceptors``): ``SignalEntity`` over gRPC from 64
  concurrent callers in one client process (bench_signal.py's client), 1,000
  entities; (``wal_index``) the same on one entity, where a group commit
  appends the fewest frames per write and an estimate of them is furthest off.
- *p50, 1 caller* (``ready_queue``, ``sqlite_inline_sync``, ``pg_one_trip``,
  ``pg_guess``): one caller rotating between the two servers in blocks of 100
  calls, ABBA (bench_signal.py's paired client), so both p50s come from the
  same seconds.
- *req/s, 64 connections* (``http_cork``, ``route_table``): ``POST
  /{type}/{id}/signal`` over HTTP from wrk (bench_http.py's script and runner).

A fast path whose switch nothing reads yet (its home module does not name it)
is skipped, saying so: its two servers would be the same server. The CPU the
rest of the machine used meanwhile (neither the servers nor the bench and its
clients) is printed per fast path, and its largest as the last row: well above
0, someone else was using the machine, and small ratios mean little.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_http
import bench_signal
import common
import pg_common
from electric_server.fastpaths import ENV, FAST_PATHS, FastPath

ENTITIES = 1000
CALLERS = 64
# The load each fast path is for: the figure it moves.
LOADS = {
    "acceptors": "calls64",
    "wal_index": "calls64_one",
    "ready_queue": "p50_1",
    "sqlite_inline_sync": "p50_1",
    "pg_one_trip": "p50_1",
    "pg_guess": "p50_1",
    "http_cork": "http64",
    "route_table": "http64",
}
POSTGRES = frozenset({"pg_one_trip", "pg_guess"})
SIDES = ("fast", "fallback")


@contextlib.contextmanager
def _environment(name: str, value: str | None) -> Iterator[None]:
    """``name`` set to ``value`` (unset for None) for what starts meanwhile: a server's process."""
    before = os.environ.pop(name, None)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)
        if before is not None:
            os.environ[name] = before


def switch_is_read(path: FastPath) -> bool:
    """Whether the fast path's home names its switch: else forcing it would change nothing."""
    return f'"{path.name}"' in (common.REPO / path.home).read_text(encoding="utf-8")


@contextlib.contextmanager
def _servers(path: FastPath, work: Path) -> Iterator[dict[str, common.ServerProc]]:
    """The two servers of one fast path: as it is, and with its fallback forced."""
    extra: list[str] = ["--http", f"{common.HOST}:0"] if LOADS[path.name] == "http64" else []
    with contextlib.ExitStack() as stack:
        servers = {}
        for side in SIDES:
            where: list[str] = []
            if path.name in POSTGRES:
                url = stack.enter_context(pg_common.fresh_database(f"bench_fast_{path.name}_{side}"))
                where = ["--database", url]
            with _environment(ENV, path.name if side == "fallback" else None):
                servers[side] = stack.enter_context(
                    common.start_electric(work / f"{path.name}-{side}", *where, *extra)
                )
        yield servers


def _calls64(
    servers: dict[str, common.ServerProc], rounds: int, quick: bool, entities: int = ENTITIES
) -> dict[str, list[float]]:
    phase = {"callers": CALLERS, "warmup": common.scale(2000, quick), "count": common.scale(20_000, quick)}
    params = {"entities": common.scale(entities, quick), "phases": [phase]}
    figures: dict[str, list[float]] = {side: [] for side in SIDES}
    for r in range(rounds):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            server = servers[side]
            got = bench_signal.run_client(
                "electric", server.address, server.pid, params | {"prespawn": r == 0}
            )
            figures[side].append(got["phases"][0]["throughput"])
    return figures


def _calls64_one(servers: dict[str, common.ServerProc], rounds: int, quick: bool) -> dict[str, list[float]]:
    return _calls64(servers, rounds, quick, entities=1)


def _p50_1(servers: dict[str, common.ServerProc], rounds: int, quick: bool) -> dict[str, list[float]]:
    entities = common.scale(ENTITIES, quick)
    # Spawned by a 64-caller phase of no measured calls, as the calls/s load spawns them.
    spawn = {
        "entities": entities,
        "phases": [{"callers": CALLERS, "warmup": 0, "count": 0}],
        "prespawn": True,
    }
    for server in servers.values():
        bench_signal.run_client("electric", server.address, server.pid, spawn)
    params = {
        "entities": entities,
        "warmup": common.scale(200, quick),
        "blocks": common.scale(20, quick, minimum=2),
        "block": 100,
    }
    paired = [
        bench_signal.run_paired({side: servers[side].address for side in SIDES}, params)
        for _ in range(rounds)
    ]
    return {side: [got[side]["p50"] for got in paired] for side in SIDES}


def _http64(servers: dict[str, common.ServerProc], rounds: int, quick: bool) -> dict[str, list[float]]:
    wrk = bench_http.ensure_wrk()
    entities = common.scale(ENTITIES, quick)
    seconds = 2.0 if quick else 10.0
    figures: dict[str, list[float]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="bench_fastpaths-wrk-") as tmp:
        script = Path(tmp) / "signal.lua"
        body = {"entities": entities, "body": bench_http.BODY, "type": bench_http.ENTITY_TYPE}
        script.write_text(bench_http.LUA % body)
        urls = {side: bench_http.http_address(server) for side, server in servers.items()}
        for side, server in servers.items():
            bench_http.prespawn(urls[side], entities)
            bench_http.run_wrk(wrk, script, urls[side], 1, server.pid)  # warm-up
        for r in range(rounds):
            for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                got = bench_http.run_wrk(wrk, script, urls[side], seconds, servers[side].pid)
                if got["errors"]:
                    raise SystemExit(f"wrk counted errors against the {side} server: {got}")
                figures[side].append(got["rps"])
    return figures


Load = Callable[[dict[str, common.ServerProc], int, bool], dict[str, list[float]]]
RUN: dict[str, tuple[Load, str]] = {
    "calls64": (_calls64, "calls/s"),
    "calls64_one": (_calls64_one, "calls/s"),
    "p50_1": (_p50_1, "ms"),
    "http64": (_http64, "req/s"),
}


@contextlib.contextmanager
def _others(servers: dict[str, common.ServerProc], spent: list[float]) -> Iterator[None]:
    """Appends to ``spent`` the cores the rest of the machine used meanwhile: all of it but the
    servers, this process and its children (the clients, wrk), which are reaped by the end."""

    def ours() -> float:
        usage = os.times()
        own = usage.user + usage.system + usage.children_user + usage.children_system
        return own + sum(common.proc_cpu_seconds(server.pid) for server in servers.values())

    busy, mine, started = common.system_busy_seconds(), ours(), time.perf_counter()
    yield
    other = common.system_busy_seconds() - busy - (ours() - mine)
    spent.append(max(0.0, other) / (time.perf_counter() - started))


def main() -> None:
    names = [path.name for path in FAST_PATHS]
    missing = set(names) ^ set(LOADS)
    if missing:
        raise SystemExit(f"fast paths without a load here, or loads without a fast path: {sorted(missing)}")
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="alternations per fast path (default 3)")
    p.add_argument("--only", nargs="+", choices=names, metavar="NAME", help=f"some of: {', '.join(names)}")
    args = p.parse_args()
    rounds = 1 if args.quick else args.rounds
    started = time.perf_counter()
    rows: list[common.Row] = []
    info: dict[str, Any] = {"rounds": rounds, "figures": {}, "skipped": []}
    others: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench_fastpaths-") as tmp:
        for path in FAST_PATHS:
            if args.only and path.name not in args.only:
                continue
            if not switch_is_read(path):
                print(f"{path.name}: skipped, {path.home} does not read its switch yet", flush=True)
                info["skipped"].append(path.name)
                continue
            load, unit = RUN[LOADS[path.name]]
            with _servers(path, Path(tmp)) as servers, _others(servers, others):
                figures = load(servers, rounds, args.quick)
            # A round's two figures were measured together: the row keeps them together, from
            # the round of the median ratio; the spread of the rounds' ratios is printed.
            ratios = [
                fast / fallback for fast, fallback in zip(figures["fast"], figures["fallback"], strict=True)
            ]
            middle = ratios.index(sorted(ratios)[len(ratios) // 2])
            fast, fallback = figures["fast"][middle], figures["fallback"][middle]
            print(
                f"{path.name}: {fast:,.3f} {unit}, its fallback {fallback:,.3f} {unit}; the rounds' ratios "
                f"{', '.join(f'{r:.2f}' for r in ratios)}; the rest of the machine used "
                f"{others[-1]:.2f} cores meanwhile",
                flush=True,
            )
            info["figures"][path.name] = figures | {"ratios": ratios, "other_cores": others[-1]}
            rows.append(common.value_row(path.row, fast, fallback, unit))
    if others:
        most = "other CPU on the machine, cores (the most of any fast path's)"
        rows.append(common.value_row(most, max(others), None, "cores"))
    common.report("bench_fastpaths", rows, info, time.perf_counter() - started, args.quick)


if __name__ == "__main__":
    main()
