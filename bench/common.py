"""Shared helpers for the benchmarks in bench/.

- ``start_electric``: ``electric server`` as its own OS process on a free
  loopback port; returns once it prints "electric server listening on ADDR".
- ``start_echo``: the ceiling server, a bare grpc.aio server in its own OS
  process (this file run as a script). No protos: generic handlers with raw
  bytes. Methods of ``bench.Echo``:
    Unary      returns the request bytes
    Stream     server-stream: request = 4-byte big-endian count + payload;
               sends the payload that many times
    Subscribe  server-stream: sends b"ready", then every published message
    Publish    stamps time.time_ns() (8 bytes, big-endian) in front of the
               request and puts it on every subscriber's queue (the same
               queue-per-watcher fan-out as electric's WatchEntities)
    Durable    the smallest durable group commit, then echo: requests queue
               up, one writer thread appends each batch to SQLite (WAL,
               synchronous=FULL) in one transaction, then all are answered
  plus the standard grpc.health.v1 service, so health checks work the same
  way against both servers.
- ``percentile``, ``Row``/``ratio_row``/``value_row`` and ``report``: every
  script prints figure, ceiling, ratio, target and PASS/MISS as one table and
  writes one JSON line to bench/results/<name>.json.

Everything binds 127.0.0.1 only. Every wait has a timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import math
import multiprocessing as mp
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"
PY = sys.executable
HOST = "127.0.0.1"

# The entity columns the benches' raw-SQLite ceilings write (the store's later columns keep their defaults).
ENTITY_COLUMNS = "(type, id, state, grace_ms, idle_timeout_ms, created_at, updated_at, head_offset, closed, stopping_deadline, txid)"

_LISTEN_RE = re.compile(r"(?:electric|echo) server listening on (\S+)")


# -- processes ---------------------------------------------------------------------


@dataclass
class ServerProc:
    proc: subprocess.Popen[str]
    address: str
    kind: str
    started_at: float  # time.perf_counter() just before Popen
    listening_at: float  # time.perf_counter() when the listening line was read
    lines: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """User + system CPU of the server process (all its threads)."""
        return proc_cpu_seconds(self.pid)

    def rss_bytes(self) -> int:
        return proc_status_bytes(self.pid, "VmRSS")

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (drain), then SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def __enter__(self) -> ServerProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def proc_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14, 15)


def proc_cpu_ns(pid: int) -> int:
    """CPU of process ``pid`` (all its threads), exact to the nanosecond: the scheduler's own
    count, from ``/proc/PID/task/*/schedstat``. ``proc_cpu_seconds`` counts clock ticks (10 ms
    here), fine over a phase of seconds but not for one trip of a millisecond (trip_cpu.py)."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended between glob and open
            continue
    return total


def system_busy_seconds() -> float:
    """CPU seconds used by everything on the machine (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]
    return busy / os.sysconf("SC_CLK_TCK")


def proc_status_bytes(pid: int, key: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def spawn_server(cmd: list[str], kind: str, log_path: Path | None, timeout: float) -> ServerProc:
    stderr = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=REPO, start_new_session=True
    )
    if log_path:
        stderr.close()  # type: ignore[union-attr]
    assert proc.stdout is not None
    found: list[tuple[str, float]] = []
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        # Reads stdout to the end so the server never blocks on a full pipe.
        assert proc.stdout is not None
        for line in proc.stdout:
            if len(lines) < 200:
                lines.append(line)
            if not found:
                m = _LISTEN_RE.search(line)
                if m:
                    found.append((m.group(1), time.perf_counter()))
                    ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True, name=f"{kind}-stdout").start()
    if not ready.wait(timeout) or not found:
        proc.kill()
        proc.wait(10)
        log = log_path.read_text()[-3000:] if log_path and log_path.exists() else ""
        raise RuntimeError(f"{kind} server did not start within {timeout}s:\n{''.join(lines)}\n{log}")
    address, at = found[0]
    return ServerProc(proc, address, kind, started, at, lines)


def start_electric(
    data_dir: Path, *extra: str, listen: str = f"{HOST}:0", timeout: float = 60.0, log: Path | None = None
) -> ServerProc:
    """``electric server`` on loopback in its own process, data in ``data_dir``."""
    # ELECTRIC_BENCH_SERVER_ARGS: extra server flags for experiments, e.g. "--synchronous NORMAL".
    server_extra = os.environ.get("ELECTRIC_BENCH_SERVER_ARGS", "").split()
    args = [
        "server",
        "--listen",
        listen,
        "--data",
        str(data_dir),
        "--drain-grace",
        "1s",
        *extra,
        *server_extra,
    ]
    cmd = [PY, "-m", "electric_sdk.cli.main", *args]
    # ELECTRIC_BENCH_SERVER_SCRIPT: a script that patches the server in its own process and then
    # runs the CLI with its arguments (what-if experiments without touching server code).
    script = os.environ.get("ELECTRIC_BENCH_SERVER_SCRIPT")
    if script:
        cmd = [PY, script, *args]
    profile_dir = os.environ.get("ELECTRIC_BENCH_PROFILE")
    if profile_dir:  # see profile_server.py
        mode = os.environ.get("ELECTRIC_BENCH_PROFILE_MODE", "sample")
        out = Path(profile_dir) / f"{Path(sys.argv[0]).stem}-{time.strftime('%H%M%S')}-{mode}"
        wrapper_args = os.environ.get("ELECTRIC_BENCH_PROFILE_ARGS", "").split()
        cmd = [
            PY,
            str(BENCH / "profile_server.py"),
            "--mode",
            mode,
            "--out",
            str(out),
            *wrapper_args,
            "--",
            *args,
        ]
    return spawn_server(cmd, "electric", log or data_dir.parent / f"{data_dir.name}.server.log", timeout)


def run_beside_server(prefix: str, client: Callable[[ServerProc, Path], Any], *server_args: str) -> Any:
    """``asyncio.run(client(server, tmp))`` against ``electric server`` (``server_args``) in a fresh
    temporary directory ``tmp``, then the server stopped; on a failure the tail of the worker's
    log (``tmp/worker.log``, where the benches' workers write) is printed first."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp_:
        tmp = Path(tmp_)
        server = start_electric(tmp / "data", *server_args)
        try:
            return asyncio.run(client(server, tmp))
        except BaseException:
            log = tmp / "worker.log"
            if log.exists():
                print(f"--- worker log:\n{log.read_text()[-2000:]}", file=sys.stderr)
            raise
        finally:
            server.stop()


def run_beside_exec_worker(
    prefix: str, write_tasks: Callable[[Path], None], client: Callable[[str], Any]
) -> Any:
    """``asyncio.run(client(address))`` against ``electric server`` and an ``electric worker --exec
    TASKS`` (the file ``write_tasks`` writes), as ``run_beside_server`` runs them."""

    async def beside(server: ServerProc, tmp: Path) -> Any:
        tasks = tmp / "tasks.toml"
        write_tasks(tasks)
        worker = start_worker(server.address, tmp / "worker.log", "--exec", str(tasks))
        try:
            return await client(server.address)
        finally:
            stop_worker(worker)

    return run_beside_server(prefix, beside)


def start_worker(
    address: str, log: Path, *worker_args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``electric worker WORKER_ARGS --address ADDR`` in its own process (and session), output to ``log``."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [
                PY,
                "-m",
                "electric_sdk.cli.main",
                "worker",
                *worker_args,
                "--address",
                address,
                "--grace",
                "1s",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
            start_new_session=True,
        )


def stop_worker(worker: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM (it drains), then SIGKILL if it is still there after ``timeout``."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)


def start_echo(
    listen: str = f"{HOST}:0", timeout: float = 60.0, log: Path | None = None, acceptors: int = 0
) -> ServerProc:
    """The bare grpc.aio echo server (this file as a script) in its own process.

    ``acceptors`` > 0: not bare — its methods are registered and get electric's
    extra acceptors (electric_server/fastpaths/acceptors.py), for an informational row."""
    cmd = [PY, str(Path(__file__).resolve()), "echo-server", "--listen", listen]
    if acceptors:
        cmd += ["--acceptors", str(acceptors)]
    return spawn_server(cmd, "echo", log, timeout)


def run_in_process(
    target: Callable[..., None], *args: Any, timeout: float, name: str | None = None
) -> dict[str, Any]:
    """Run ``target(*args, queue)`` in a fresh (spawned) process and return what it puts.

    The client side of a benchmark runs in its own process so it never shares
    a GIL or an event loop with the server under test. ``target`` puts one dict;
    a dict with "error" (what the target put when it failed) is raised here.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue), daemon=True)
    proc.start()
    try:
        result: dict[str, Any] = queue.get(timeout=timeout)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    if "error" in result:
        raise RuntimeError(f"{name or target.__name__} failed:\n{result['error']}")
    return result


def reap_processes(procs: Sequence[Any], timeout: float = 30.0) -> None:
    """Join a benchmark's client processes; kill what is still there after ``timeout``."""
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()


def client_errors(results: Sequence[dict[str, Any]]) -> list[str]:
    """What client processes reported: their own ``errors`` lists and a crash's ``error``."""
    return [e for r in results for e in r.get("errors", [])] + [r["error"] for r in results if "error" in r]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


# -- the echo server ---------------------------------------------------------------

ECHO_UNARY = "/bench.Echo/Unary"
ECHO_STREAM = "/bench.Echo/Stream"
ECHO_SUBSCRIBE = "/bench.Echo/Subscribe"
ECHO_PUBLISH = "/bench.Echo/Publish"
ECHO_DURABLE = "/bench.Echo/Durable"


async def _echo_main(listen: str, acceptors: int = 0) -> None:
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    subscribers: set[asyncio.Queue[bytes]] = set()

    async def unary(request: bytes, context: Any) -> bytes:
        return request

    async def stream(request: bytes, context: Any) -> Any:
        count = min(int.from_bytes(request[:4], "big"), 10_000_000)
        payload = request[4:]
        for _ in range(count):
            yield payload

    async def subscribe(request: bytes, context: Any) -> Any:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        subscribers.add(queue)
        try:
            yield b"ready"
            while True:
                yield await queue.get()
        finally:
            subscribers.discard(queue)

    # Durable: the smallest durable group commit (one writer thread, one SQLite transaction and
    # one fsync per batch of whatever queued meanwhile, WAL, synchronous=FULL), then echo.
    import sqlite3
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    loop = asyncio.get_running_loop()
    db_dir = tempfile.TemporaryDirectory(prefix="echo-durable-")
    conn = sqlite3.connect(f"{db_dir.name}/echo.db", isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE log (seq INTEGER PRIMARY KEY, body BLOB NOT NULL)")
    writer = ThreadPoolExecutor(1, thread_name_prefix="echo-writer")
    queued: list[tuple[bytes, asyncio.Future[None]]] = []
    wakeup = asyncio.Event()

    def commit(rows: list[tuple[bytes]]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO log (body) VALUES (?)", rows)
        conn.execute("COMMIT")

    async def commit_loop() -> None:
        while True:
            await wakeup.wait()
            wakeup.clear()
            batch = queued[:]
            del queued[:]
            if not batch:
                continue
            try:
                await loop.run_in_executor(writer, commit, [(body,) for body, _ in batch])
            except Exception as exc:
                for _, fut in batch:
                    fut.set_exception(exc)
                continue
            for _, fut in batch:
                fut.set_result(None)

    committer = asyncio.create_task(commit_loop())

    async def durable(request: bytes, context: Any) -> bytes:
        fut: asyncio.Future[None] = loop.create_future()
        queued.append((request, fut))
        wakeup.set()
        await fut
        return request

    async def publish(request: bytes, context: Any) -> bytes:
        message = time.time_ns().to_bytes(8, "big") + request
        for queue in tuple(subscribers):
            queue.put_nowait(message)
        return len(subscribers).to_bytes(4, "big")

    methods = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
        "Subscribe": grpc.unary_stream_rpc_method_handler(subscribe),
        "Publish": grpc.unary_unary_rpc_method_handler(publish),
        "Durable": grpc.unary_unary_rpc_method_handler(durable),
    }
    # Same server options as ElectricServer.
    server = grpc.aio.server(
        options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 4 * 1024 * 1024)]
    )
    extra = None
    if acceptors:
        from electric_server.fastpaths.acceptors import Acceptors

        extra = Acceptors(server, (), acceptors)
        server.add_registered_method_handlers("bench.Echo", methods)
    else:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", methods),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(listen)
    await server.start()
    if extra is not None:
        extra.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    host = listen.rpartition(":")[0]
    print(f"echo server listening on {host}:{port}", flush=True)
    await stop.wait()
    await server.stop(0)
    committer.cancel()
    writer.shutdown(wait=True)
    conn.close()
    db_dir.cleanup()


# -- client helpers (import grpc lazily: only processes that talk gRPC load it) ----------


async def health_serving(address: str, limit_s: float = 10.0) -> float:
    """Check grpc.health.v1 once (waiting for the channel); returns perf_counter when SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + limit_s
        while True:
            reply = await stub.Check(
                health_pb2.HealthCheckRequest(service=""), timeout=limit_s, wait_for_ready=True
            )
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return time.perf_counter()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{address} not SERVING after {limit_s}s")
            await asyncio.sleep(0.005)


# -- statistics ----------------------------------------------------------------------


def percentile(values: Sequence[float], p: float, *, presorted: bool = False) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sequence."""
    if not values:
        return math.nan
    data = values if presorted else sorted(values)
    rank = max(1, math.ceil(p / 100 * len(data)))
    return float(data[min(rank, len(data)) - 1])


def summarize(values: Sequence[float]) -> dict[str, float]:
    data = sorted(values)
    return {
        "n": len(data),
        "p50": percentile(data, 50, presorted=True),
        "p90": percentile(data, 90, presorted=True),
        "p99": percentile(data, 99, presorted=True),
        "max": float(data[-1]) if data else math.nan,
        "mean": sum(data) / len(data) if data else math.nan,
    }


# -- results -------------------------------------------------------------------------


@dataclass
class Row:
    figure: str
    value: float
    unit: str
    ceiling: float | None
    ratio: float | None  # value / ceiling
    target: str  # human-readable, e.g. "ratio >= 0.70" or "<= 1.000 s"
    passed: bool | None  # None: informational row, no target

    @property
    def result(self) -> str:
        return "-" if self.passed is None else ("PASS" if self.passed else "MISS")


def _cmp(x: float, op: str, limit: float) -> bool:
    if math.isnan(x):
        return False
    return x >= limit if op == ">=" else x <= limit


def _ratio(value: float, ceiling: float | None) -> float | None:
    if ceiling is None or ceiling == 0 or math.isnan(ceiling) or math.isnan(value):
        return None
    return value / ceiling


def ratio_row(figure: str, value: float, ceiling: float, unit: str, op: str, limit: float) -> Row:
    """A figure whose target is on the ratio figure/ceiling."""
    r = _ratio(value, ceiling)
    return Row(figure, value, unit, ceiling, r, f"ratio {op} {limit:g}", r is not None and _cmp(r, op, limit))


def value_row(
    figure: str,
    value: float,
    ceiling: float | None,
    unit: str,
    op: str | None = None,
    limit: float | None = None,
) -> Row:
    """A figure whose target is on its own value (the ratio is printed beside it)."""
    r = _ratio(value, ceiling)
    if op is None or limit is None:
        return Row(figure, value, unit, ceiling, r, "-", None)
    return Row(figure, value, unit, ceiling, r, f"{op} {_fmt(limit)} {unit}", _cmp(value, op, limit))


def _fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    ax = abs(x)
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.1f}"
    if ax >= 10:
        return f"{x:.2f}"
    return f"{x:.3f}"


def format_table(rows: Sequence[Row], title: str | None = None) -> str:
    header = ("figure", "value", "ceiling", "ratio", "target", "result")
    body = [
        (
            r.figure,
            f"{_fmt(r.value)} {r.unit}",
            f"{_fmt(r.ceiling)} {r.unit}" if r.ceiling is not None else "-",
            f"{r.ratio:.2f}x" if r.ratio is not None else "-",
            r.target,
            r.result,
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = []
    if title:
        out.append(title)
    out.append(line.format(*header))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line.format(*b) for b in body)
    return "\n".join(out)


def git_state() -> dict[str, Any]:
    """The code measured: HEAD and files that differ from it (outside bench/)."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], check=False, cwd=REPO, capture_output=True, text=True, timeout=10
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    dirty = [ln[3:] for ln in git("status", "--porcelain").splitlines() if not ln[3:].startswith("bench/")]
    return {"head": git("rev-parse", "--short", "HEAD").strip(), "dirty": dirty}


def report(name: str, rows: Sequence[Row], info: dict[str, Any], elapsed_s: float, quick: bool) -> None:
    """Print the table and write one JSON line to bench/results/<name>.json."""
    print()
    print(format_table(rows, f"== {name}{' (quick)' if quick else ''} — {elapsed_s:.1f} s =="))
    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {
        "bench": name,
        "quick": quick,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": round(elapsed_s, 2),
        "rows": [asdict(r) | {"result": r.result} for r in rows],
        "info": info,
        "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "git": git_state(),
        # Experiment knobs in effect (profiling, patched server, extra flags): not a plain run.
        "overrides": {
            k: v
            for k, v in os.environ.items()
            if k.startswith("ELECTRIC_BENCH_") and k != "ELECTRIC_BENCH_QUICK"
        },
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(record, default=str) + "\n")
    if record["overrides"]:
        print(f"NOTE: experiment overrides in effect, not a plain run: {record['overrides']}")
    g = record["git"]
    print(
        f"(code: {g['head']}{' + ' + str(len(g['dirty'])) + ' uncommitted file(s)' if g['dirty'] else ''}; "
        f"written to {path.relative_to(REPO)})"
    )


def bench_args(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--quick",
        action="store_true",
        default=os.environ.get("ELECTRIC_BENCH_QUICK", "") not in ("", "0"),
        help="scale every load down 10x (smoke run); also ELECTRIC_BENCH_QUICK=1",
    )
    return p


def scale(n: int, quick: bool, minimum: int = 1) -> int:
    return max(minimum, n // 10) if quick else n


def _main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("echo-server")
    e.add_argument("--listen", default=f"{HOST}:0")
    e.add_argument("--acceptors", type=int, default=0, help="electric's extra acceptors per method (0: bare)")
    args = p.parse_args()
    if args.cmd == "echo-server":
        asyncio.run(_echo_main(args.listen, args.acceptors))


if __name__ == "__main__":
    _main()
