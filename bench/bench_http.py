"""POST /{type}/{id}/signal over HTTP, driven by wrk, vs a bare Starlette/uvicorn JSON echo.

Setup: ``electric server --http`` in its own process (fresh data dir, SQLite
WAL, synchronous=FULL); ``ENTITIES`` entities spawned over HTTP beforehand.
They stay ``spawning``, where SIGUSR is recorded with outcome ``ignored``:
every call appends one signal record durably and updates the entity row, and
is accepted every time.

Load: wrk (the Debian package; a Python load generator would be the
bottleneck on 2 cores), one thread, 64 connections, a Lua script that POSTs
``{"signal": "SIGUSR", "reason": "bench", "payload": {"n": 1}}`` to
``/bench/e<i>/signal``, cycling through the entities, and prints wrk's own
latency percentiles and counts as one JSON line. The bench installs wrk with
apt-get when it is missing (and says so).

Ceiling: the same wrk, script, connections and requests against a bare
Starlette app on uvicorn in its own process (this file run as ``echo-server``):
one route ``POST /{type}/{id}/signal`` that parses the JSON body and answers
it as JSON, served as electric's door serves (h11, asyncio loop, no access
log, a TCP_NODELAY listening socket). Figure and ceiling alternate for a few
rounds and each is the median, so background load lands on both alike.

electric's door writes each answer's head and body as one ``send`` (its corked
protocol, server/electric_server/fastpaths/http_cork.py); stock uvicorn, and so the
ceiling, writes them as two. So that the figure does not hide what the door
itself costs, the same echo served through the door's corked protocol runs too
(``echo-corked``), informational: electric beside it is the door's own work
beside the same HTTP stack. CPU
seconds of the server, of wrk and of everything else on the machine are
printed per phase: on 2 cores, a figure whose server sits at one core is
bounded by the server's own Python (one event loop), not by wrk.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

ENTITIES = 1000
CONNECTIONS = 64
ENTITY_TYPE = "bench"
BODY = '{"signal": "SIGUSR", "reason": "bench", "payload": {"n": 1}}'
WRK_TIMEOUT_S = 10
NOSYNC = "NORMAL"  # the informational electric: `--synchronous NORMAL`, no fsync per commit
_HTTP_LINE = re.compile(r"electric http listening on (\S+)")

# One Lua state per wrk thread: the counter cycles that thread's requests through the entities.
LUA = """
local n = 0
local entities = %(entities)d
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '%(body)s'

request = function()
  n = n + 1
  return wrk.format(nil, string.format("/%(type)s/e%%d/signal", n %% entities))
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK {"requests": %%d, "duration_us": %%d, "p50_us": %%d, "p90_us": %%d, "p99_us": %%d, '
    .. '"connect": %%d, "read": %%d, "write": %%d, "status": %%d, "timeout": %%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def ensure_wrk() -> str:
    """wrk's path; installed from Debian's packages with apt-get when missing."""
    found = shutil.which("wrk")
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise SystemExit("wrk is not installed: install the Debian package wrk (apt-get install wrk)")
    print("wrk is missing: installing the Debian package wrk with apt-get", flush=True)
    subprocess.run([apt, "install", "-y", "-q", "wrk"], check=True, timeout=600)
    found = shutil.which("wrk")
    if found is None:
        raise SystemExit("apt-get installed wrk, but it is not on PATH")
    return found


# -- the ceiling: a bare Starlette JSON echo on uvicorn ----------------------------------------------


def echo_server_main(corked: bool) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse(await request.json())

    app = Starlette(routes=[Route("/{type}/{id}/signal", echo, methods=["POST"])])
    # As electric's door binds: IPPROTO_TCP named, so asyncio sets TCP_NODELAY on each connection.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((common.HOST, 0))
    sock.listen(2048)
    http: Any = "h11"
    if corked:
        from electric_server.fastpaths.http_cork import CorkedH11Protocol

        http = CorkedH11Protocol
    config = uvicorn.Config(
        app, lifespan="off", loop="asyncio", http=http, ws="none", log_level="warning", access_log=False
    )
    print(f"echo server listening on http://{common.HOST}:{sock.getsockname()[1]}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


def start_echo_http(log: Path, *, corked: bool = False) -> common.ServerProc:
    cmd = [common.PY, __file__, "echo-server", *(["--corked"] if corked else [])]
    return common.spawn_server(cmd, "echo", log, 60.0)


# -- electric ----------------------------------------------------------------------------------------


def http_address(server: common.ServerProc, timeout: float = 30.0) -> str:
    """The HTTP door's address, from the line the server prints right after its gRPC one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(server.lines):
            m = _HTTP_LINE.search(line)
            if m:
                return m.group(1)
        time.sleep(0.05)  # the stdout pump thread appends lines; no event to wait on
    raise RuntimeError(f"no HTTP address printed within {timeout}s: {server.lines}")


def prespawn(base: str, entities: int) -> None:
    import httpx

    with httpx.Client(base_url=base, timeout=30) as client:
        for i in range(entities):
            answer = client.put(f"/{ENTITY_TYPE}/e{i}")
            if answer.status_code != 201:
                raise RuntimeError(f"spawn e{i}: {answer.status_code} {answer.text}")


# -- a phase -----------------------------------------------------------------------------------------


def run_wrk(wrk: str, script: Path, base: str, seconds: float, server_pid: int) -> dict[str, Any]:
    """One wrk run against ``base``; its numbers and the CPU of server, wrk and the rest."""
    cmd = [
        wrk, "-t1", f"-c{CONNECTIONS}", f"-d{max(1, round(seconds))}s", f"--timeout={WRK_TIMEOUT_S}s",
        "-s", str(script), base,
    ]  # fmt: skip
    server_cpu, busy, t0 = (
        common.proc_cpu_seconds(server_pid),
        common.system_busy_seconds(),
        time.perf_counter(),
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    wall = time.perf_counter() - t0
    server_cpu = common.proc_cpu_seconds(server_pid) - server_cpu
    busy = common.system_busy_seconds() - busy
    if proc.returncode != 0:
        raise RuntimeError(f"wrk exited {proc.returncode}: {err}")
    line = next((ln for ln in out.splitlines() if ln.startswith("WRK ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary: {out}\n{err}")
    result: dict[str, Any] = json.loads(line[4:])
    wrk_cpu = _child_cpu()
    result |= {
        "rps": result["requests"] / (result["duration_us"] / 1e6),
        "errors": sum(result[k] for k in ("connect", "read", "write", "status", "timeout")),
        "server_cores": server_cpu / wall,
        "server_us_per_request": server_cpu / max(1, result["requests"]) * 1e6,
        "wrk_cores": wrk_cpu / wall,
        "other_cores": max(0.0, busy - server_cpu - wrk_cpu) / wall,
    }
    return result


_last_child_cpu = 0.0


def _child_cpu() -> float:
    """CPU seconds of the child processes reaped since the last call (the wrk run just ended)."""
    global _last_child_cpu
    usage = os.times()
    total = usage.children_user + usage.children_system
    spent, _last_child_cpu = total - _last_child_cpu, total
    return spent


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="figure/ceiling alternations (default 3)")
    p.add_argument("--seconds", type=float, default=10.0, help="per wrk run (default 10)")
    args = p.parse_args()
    seconds = 2.0 if args.quick else args.seconds
    rounds = 1 if args.quick else args.rounds
    entities = ENTITIES // 10 if args.quick else ENTITIES
    wrk = ensure_wrk()
    _child_cpu()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_http-") as tmp:
        work = Path(tmp)
        script = work / "signal.lua"
        script.write_text(LUA % {"entities": entities, "body": BODY, "type": ENTITY_TYPE})
        http = ("--http", f"{common.HOST}:0")
        with (
            common.start_electric(work / "data", *http) as electric,
            common.start_electric(work / "nosync", *http, "--synchronous", NOSYNC) as nosync,
            start_echo_http(work / "echo.log") as echo,
            start_echo_http(work / "echo-corked.log", corked=True) as echo_corked,
        ):
            targets = {
                "electric": (http_address(electric), electric.pid),
                "echo": (echo.address, echo.pid),
                "echo-corked": (echo_corked.address, echo_corked.pid),
                "nosync": (http_address(nosync), nosync.pid),
            }
            for kind in ("electric", "nosync"):
                prespawn(targets[kind][0], entities)
            # Warm both up (imports, caches, the SQLite file's first pages), then alternate.
            for url, pid in targets.values():
                run_wrk(wrk, script, url, 1, pid)
            runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in targets}
            for r in range(rounds):
                order = list(targets) if r % 2 == 0 else list(reversed(targets))
                for kind in order:
                    url, pid = targets[kind]
                    result = run_wrk(wrk, script, url, seconds, pid)
                    runs[kind].append(result)
                    print(
                        f"round {r + 1} {kind:11s} {result['rps']:8.0f} req/s  p50 {result['p50_us'] / 1000:6.2f} ms"
                        f"  p99 {result['p99_us'] / 1000:6.2f} ms  errors {result['errors']}"
                        f"  cores: server {result['server_cores']:.2f} wrk {result['wrk_cores']:.2f}"
                        f" other {result['other_cores']:.2f}",
                        flush=True,
                    )
    errors = {kind: sum(r["errors"] for r in rs) for kind, rs in runs.items()}
    if any(errors.values()):
        raise SystemExit(f"wrk counted errors (non-2xx, timeouts, socket errors): {errors}")

    def median(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[kind])

    n = f", {CONNECTIONS} connections (wrk)"
    rows = [
        common.ratio_row(f"POST signal throughput{n}", median("electric", "rps"), median("echo", "rps"), "req/s", ">=", 0.7),
        common.ratio_row(f"POST signal p50 latency{n}", median("electric", "p50_us") / 1000, median("echo", "p50_us") / 1000, "ms", "<=", 1.5),
        common.value_row(f"POST signal p99 latency{n}", median("electric", "p99_us") / 1000, median("echo", "p99_us") / 1000, "ms"),
        common.value_row(f"informational: --synchronous {NOSYNC} throughput{n}", median("nosync", "rps"), median("echo", "rps"), "req/s"),
        common.value_row(f"informational: --synchronous {NOSYNC} p50 latency{n}", median("nosync", "p50_us") / 1000, median("echo", "p50_us") / 1000, "ms"),
        common.value_row(f"informational: throughput vs the echo through the door's corked protocol{n}", median("electric", "rps"), median("echo-corked", "rps"), "req/s"),
        common.value_row(f"informational: p50 latency vs the echo through the door's corked protocol{n}", median("electric", "p50_us") / 1000, median("echo-corked", "p50_us") / 1000, "ms"),
        common.value_row("server CPU per request (electric vs echo)", median("electric", "server_us_per_request"), median("echo", "server_us_per_request"), "us"),
        common.value_row(f"server CPU per request (--synchronous {NOSYNC} vs echo)", median("nosync", "server_us_per_request"), median("echo", "server_us_per_request"), "us"),
        common.value_row("server CPU, cores (electric vs echo)", median("electric", "server_cores"), median("echo", "server_cores"), "cores"),
        common.value_row("wrk CPU, cores (electric run vs echo run)", median("electric", "wrk_cores"), median("echo", "wrk_cores"), "cores"),
        common.value_row("other CPU on the machine, cores", median("electric", "other_cores"), median("echo", "other_cores"), "cores"),
    ]  # fmt: skip
    info = {
        "entities": entities,
        "connections": CONNECTIONS,
        "seconds": seconds,
        "rounds": rounds,
        "runs": runs,
    }
    common.report("bench_http", rows, info, time.perf_counter() - started, args.quick)


if __name__ == "__main__":
    if sys.argv[1:2] == ["echo-server"]:
        echo_server_main(corked=sys.argv[2:3] == ["--corked"])
    else:
        main()
