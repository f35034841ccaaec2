"""SSE fan-out over HTTP: 1,000 subscribers of one entity's stream, commit → arrival.

Setup: electric server in its own process with its HTTP door; one entity, fan/one. 1,000
subscribers read ``GET /fan/one/stream?offset=now&live=sse`` (the Durable Streams read, JSON
mode), spread over 2 load processes that speak HTTP/1.1 on raw asyncio sockets (500 connections
each, no HTTP library: a line split and a regex per read), so the load side stays well below
a core. Once every subscriber has its first control event (up to date), the bench process
sends one message (``POST /fan/one/messages``, a 24-byte text carrying a sequence number) every
``--interval`` seconds, ``--commits`` times. A commit's latency at a subscriber is from the
commit's own timestamp (the change message's ``headers.timestamp``, taken as the commit's
transaction begins, so its fsync is inside the figure) to the data event arriving, on the
machine's one wall clock (ms resolution, on both sides); each subscriber must get every commit
once.

Ceiling, same run: a bare Starlette SSE fan-out on uvicorn (this file as ``ceiling-server``,
its own process, the same uvicorn options as electric's HTTP door): ``POST /publish`` renders
the same shape of data event and control event once (timestamped as it is received) and puts
the bytes on each subscriber's queue; ``GET /subscribe`` streams its queue. The same load processes and publisher hit it.
Both servers run side by side; the sides alternate in ``--rounds`` rounds (3 by default, the
order flipped each round, fresh subscribers each), their latencies pooled per side, so load
from elsewhere on the machine lands on both alike.

One commit a second: this is the latency of one commit's fan-out, not throughput (bench_fanout
measures a stream under load). Electric's watches share a bandwidth (--watch-bandwidth):
each of 1,000 watchers sends its next message no sooner than ~0.25-0.75 s after its last, so
commits closer together than that would measure the pacing, not the fan-out.

Targets: commit → arrival p99 <= 1.5 x the ceiling's, and <= 250 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing as mp
import re
import socket
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

PROCESSES = 2
# A data event's sequence number and its commit instant (the change message's headers.timestamp).
MARK = re.compile(rb'"text":"seq-(\d+)"[^\n]*?"timestamp":"([^"]+)"')
READY_TIMEOUT_S = 120.0
ARRIVAL_TIMEOUT_S = 30.0


# -- the load side: raw sockets ------------------------------------------------------------------


class _Ready:
    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.all = asyncio.Event()

    def add(self) -> None:
        self.count += 1
        if self.count >= self.expected:
            self.all.set()


async def _subscribe(
    host: str, port: int, path: str, arrivals: dict[int, list[float]], ready: _Ready, errors: list[str]
) -> None:
    try:
        reader, writer = await asyncio.open_connection(host, port)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n".encode())
        await writer.drain()
        status = await reader.readline()
        if b" 200 " not in status:
            errors.append(f"subscribe: {status!r}")
            return
        seen_control = False
        pending = b""
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            now = time.time()  # the wall clock, as the commit's timestamp: one machine, one clock
            pending += chunk
            complete, _, pending = pending.rpartition(b"\n")
            if not seen_control and b"event: control" in complete:
                seen_control = True
                ready.add()
            for match in MARK.finditer(complete):
                committed = datetime.fromisoformat(match.group(2).decode()).timestamp()
                arrivals.setdefault(int(match.group(1)), []).append((now - committed) * 1000)
    except (OSError, asyncio.IncompleteReadError) as exc:
        errors.append(f"subscriber: {exc!r}")


def _load(host: str, port: int, path: str, count: int, ready_q: Any, stop_ev: Any, out: Any) -> None:
    """One load process: ``count`` SSE connections; reports each sequence number's arrival times."""

    async def main() -> dict[str, Any]:
        arrivals: dict[int, list[float]] = {}
        ready = _Ready(count)
        errors: list[str] = []
        tasks = [
            asyncio.create_task(_subscribe(host, port, path, arrivals, ready, errors)) for _ in range(count)
        ]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ready.all.wait(), READY_TIMEOUT_S)
        ready_q.put(ready.count)
        cpu0 = time.process_time()
        await asyncio.to_thread(stop_ev.wait)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {
            "arrivals": arrivals,
            "count": count,
            "errors": errors[:5],
            "cpu_s": time.process_time() - cpu0,
        }

    try:
        out.put(asyncio.run(main()))
    except Exception as exc:  # reported to the bench process
        out.put({"error": repr(exc)})


def _measure(
    host: str, port: int, sub_path: str, publish: Any, subscribers: int, commits: int, interval: float
) -> dict[str, Any]:
    """Subscribers in PROCESSES processes, then ``commits`` publishes; latencies in ms."""
    ctx = mp.get_context("spawn")
    ready_q, out, stop_ev = ctx.Queue(), ctx.Queue(), ctx.Event()
    share = [subscribers // PROCESSES + (1 if i < subscribers % PROCESSES else 0) for i in range(PROCESSES)]
    procs = [
        ctx.Process(target=_load, args=(host, port, sub_path, n, ready_q, stop_ev, out), daemon=True)
        for n in share
    ]
    for p in procs:
        p.start()
    results: list[dict[str, Any]] = []
    try:
        ready = sum(ready_q.get(timeout=READY_TIMEOUT_S + 30) for _ in procs)
        if ready < subscribers:
            raise RuntimeError(f"only {ready} of {subscribers} subscribers got their first control event")
        sent: dict[int, float] = {}
        for seq in range(commits):
            started = time.monotonic()
            sent[seq] = started
            publish(seq)
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
        time.sleep(min(ARRIVAL_TIMEOUT_S, max(1.0, interval)))  # the last commit's stragglers
        stop_ev.set()
        results = [out.get(timeout=60) for _ in procs]
    finally:
        stop_ev.set()
        common.reap_processes(procs)
    errors = common.client_errors(results)
    latencies: list[float] = []
    missing = repeated = 0
    for result in results:
        for times in result.get("arrivals", {}).values():
            latencies += times
        for seq in sent:
            got = len(result.get("arrivals", {}).get(seq, []))
            missing += max(0, result.get("count", 0) - got)
            repeated += max(0, got - result.get("count", 0))
    return {
        "latencies": latencies,
        "missing": missing,
        "repeated": repeated,
        "errors": errors,
        "load_cpu_s": sum(r.get("cpu_s", 0.0) for r in results),
    }


# -- the ceiling: a bare Starlette SSE fan-out -----------------------------------------------------


def _ceiling_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    queues: set[asyncio.Queue[bytes]] = set()
    offset = [0]

    def control() -> bytes:
        fields = {"streamNextOffset": f"{offset[0]:020d}", "streamCursor": "1", "upToDate": True}
        return f"id: {offset[0]:020d}\nevent: control\ndata: {json.dumps(fields)}\n\n".encode()

    async def subscribe(request: Request) -> Response:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        queues.add(queue)

        async def frames() -> Any:
            try:
                yield control()
                while True:
                    yield await queue.get()
            finally:
                queues.discard(queue)

        return StreamingResponse(frames(), media_type="text/event-stream")

    async def publish(request: Request) -> Response:
        text = (await request.body()).decode()
        published = datetime.fromtimestamp(time.time(), UTC).isoformat(timespec="milliseconds")
        offset[0] += 1
        event = {
            "type": "message",
            "key": f"msg_{offset[0]}",
            "value": {"text": text, "sender": "anonymous"},
            "headers": {
                "operation": "insert",
                "timestamp": published.replace("+00:00", "Z"),
                "txid": str(offset[0]),
            },
        }
        frame = f"event: data\ndata: {json.dumps([event], separators=(',', ':'))}\n\n".encode() + control()
        for queue in queues:
            queue.put_nowait(frame)
        return Response(status_code=204)

    return Starlette(routes=[Route("/subscribe", subscribe), Route("/publish", publish, methods=["POST"])])


async def _ceiling_main() -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY, as electric
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((common.HOST, 0))
    sock.listen(2048)
    config = uvicorn.Config(
        _ceiling_app(),
        lifespan="off",
        loop="none",
        http="h11",
        ws="none",
        log_level="warning",
        access_log=False,
    )
    server = uvicorn.Server(config)
    print(f"echo server listening on {common.HOST}:{sock.getsockname()[1]}", flush=True)
    await server.serve(sockets=[sock])


# -- the run -----------------------------------------------------------------------------------------


def _run(
    address: str, sub_path: str, publish_path: str, body: Any, subscribers: int, commits: int, interval: float
) -> dict[str, Any]:
    import httpx

    host, _, port = address.rpartition(":")
    with httpx.Client(base_url=f"http://{address}", timeout=30) as client:

        def publish(seq: int) -> None:
            response = client.post(
                publish_path, content=body(seq), headers={"content-type": "application/json"}
            )
            response.raise_for_status()

        return _measure(host, int(port), sub_path, publish, subscribers, commits, interval)


def _pooled(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds of one side as one: every latency, and the sums of what went wrong."""
    return {
        "latency_ms": common.summarize([ms for r in rounds for ms in r["latencies"]]),
        "per_round_p99_ms": [common.percentile(r["latencies"], 99) for r in rounds],
        "missing": sum(r["missing"] for r in rounds),
        "repeated": sum(r["repeated"] for r in rounds),
        "errors": [e for r in rounds for e in r["errors"]],
        "load_cpu_s": sum(r["load_cpu_s"] for r in rounds),
    }


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--subscribers", type=int, default=1000)
    p.add_argument("--commits", type=int, default=30, help="per side, over all rounds")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default %(default)s)")
    p.add_argument(
        "--interval", type=float, default=1.0, help="seconds between commits (default %(default)s)"
    )
    args = p.parse_args()
    quick = args.quick
    subscribers = common.scale(args.subscribers, quick)
    commits = common.scale(args.commits, quick, minimum=5)
    per_round = max(1, -(-commits // args.rounds))
    t0 = time.perf_counter()
    sides: dict[str, list[dict[str, Any]]] = {"ceiling": [], "electric": []}
    with tempfile.TemporaryDirectory() as tmp:
        http_port = common.free_port()
        with (
            common.spawn_server(
                [common.PY, __file__, "ceiling-server"], "echo", Path(tmp) / "ceiling.log", 60
            ) as ceiling,
            common.start_electric(
                Path(tmp) / "data",
                "--http",
                f"{common.HOST}:{http_port}",
                "--max-streams",
                str(subscribers + 100),
                log=Path(tmp) / "electric.log",
            ),
        ):
            import httpx

            httpx.put(f"http://{common.HOST}:{http_port}/fan/one", timeout=30).raise_for_status()
            runs = {
                "ceiling": lambda: _run(
                    ceiling.address,
                    "/subscribe",
                    "/publish",
                    lambda seq: f"seq-{seq}".encode(),
                    subscribers,
                    per_round,
                    args.interval,
                ),
                "electric": lambda: _run(
                    f"{common.HOST}:{http_port}",
                    "/fan/one/stream?offset=now&live=sse",
                    "/fan/one/messages",
                    lambda seq: json.dumps({"text": f"seq-{seq}"}).encode(),
                    subscribers,
                    per_round,
                    args.interval,
                ),
            }
            # Alternating, the order flipped each round: load from elsewhere on the machine lands
            # on both sides alike.
            for n in range(args.rounds):
                for name in ("ceiling", "electric") if n % 2 == 0 else ("electric", "ceiling"):
                    sides[name].append(runs[name]())
    bare, electric = _pooled(sides["ceiling"]), _pooled(sides["electric"])
    for name, side in (("ceiling", bare), ("electric", electric)):
        if side["errors"] or side["missing"] or side["repeated"]:
            raise SystemExit(
                f"{name}: errors {side['errors'][:3]}, missing {side['missing']}, repeated {side['repeated']}"
            )
    el, ce = electric["latency_ms"], bare["latency_ms"]
    rows = [
        common.ratio_row(
            f"commit → arrival p99, {subscribers} SSE subscribers", el["p99"], ce["p99"], "ms", "<=", 1.5
        ),
        common.value_row("  p99 absolute", el["p99"], ce["p99"], "ms", "<=", 250.0),
        common.value_row("  (info) p50", el["p50"], ce["p50"], "ms"),
        common.value_row("  (info) max", el["max"], ce["max"], "ms"),
        common.value_row("  (info) load processes' CPU", electric["load_cpu_s"], bare["load_cpu_s"], "s"),
    ]
    info = {
        "subscribers": subscribers,
        "commits_per_side": per_round * args.rounds,
        "rounds": args.rounds,
        "interval_s": args.interval,
        "electric": electric,
        "ceiling": bare,
    }
    common.report("bench_sse", rows, info, time.perf_counter() - t0, quick)


if __name__ == "__main__":
    if sys.argv[1:2] == ["ceiling-server"]:
        asyncio.run(_ceiling_main())
    else:
        main()
