"""The runtime: signal → handler latency in a worker process, SIGINT → ABORTED, SIGHUP fan-out, worker RSS.

Three processes besides the echo server (common.py): ``electric server``
(fresh data dir, SQLite WAL, synchronous=FULL), ``electric worker
benchrt_app:app`` (the app module below, written to a temp dir on
PYTHONPATH) and this script as the client. One machine, one wall clock.

1. SIGUSR → ``on_signal`` called in the worker: one ``running`` entity with
   a run holding a step open; sequentially, ``AsyncClient.signal(SIGUSR)``
   stamped with ``time.time_ns()`` just before the call; the handler's first
   line takes ``time.time_ns()`` and emits it in a custom event, which the
   client reads from ``WatchEvents``. Latency = handler call - send. The next
   signal goes once the event has arrived. Ceiling: a bare grpc.aio unary
   echo round trip (same client, same payload size), alternating rounds.
2. SIGINT → run ABORTED committed: a message whose run holds one step; once
   its STEP event is seen, SIGINT; latency = the ABORTED event's header
   timestamp (the store's commit timestamp, taken when the transaction starts,
   millisecond resolution, truncated) - send. A new message each repetition.
   Info: when the client saw it on its watch.
3. SIGHUP through one ``SignalEntities(type=fleet)`` to N running entities
   hosted by the worker (no run): time until every one has gone ``idle``
   (cause ``reload``), as seen on a ``WatchEntities(type=fleet)`` stream.
4. The same N entities each get a message whose run waits inside a step
   (idle → running, wake); once all N steps are open (the app counts them),
   the worker's VmRSS.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

APP_MODULE = '''
"""bench_runtime's entity types (written by bench/bench_runtime.py)."""

import os
import threading
import time

import anyio

from electric_sdk.runtime import App

app = App("benchrt")
OPEN_STEPS = 0
COUNT_FILE = os.environ["BENCHRT_COUNT_FILE"]


def _write_count() -> None:
    last = None
    while True:
        if OPEN_STEPS != last:
            last = OPEN_STEPS
            with open(COUNT_FILE + ".tmp", "w") as f:
                f.write(str(last))
            os.replace(COUNT_FILE + ".tmp", COUNT_FILE)
        time.sleep(0.1)  # a 10 Hz reporter thread in the bench worker, not a wait for anything


threading.Thread(target=_write_count, daemon=True).start()


async def _hold(ctx):
    global OPEN_STEPS
    async with ctx.step("hold"):
        OPEN_STEPS += 1
        try:
            await anyio.sleep(86400)
        finally:
            OPEN_STEPS -= 1


@app.entity("lat", grace_period="1s", idle_timeout="1h")
class Lat:
    async def on_message(self, ctx, message):
        await _hold(ctx)

    async def on_signal(self, ctx, signal):
        called = time.time_ns()
        if signal.signal.value == "SIGUSR":
            await ctx.emit("usr_seen", {"t": str(called), "reason": signal.reason})


@app.entity("fleet", grace_period="1s", idle_timeout="1h")
class Fleet:
    async def on_message(self, ctx, message):
        await _hold(ctx)
'''

CALL_TIMEOUT_S = 30.0
WAIT_S = 10.0
FLEET_WAIT_S = 300.0
HOLD_WAIT_S = 180.0


async def client(
    address: str, echo_address: str, server_pid: int, worker_pid: int, count_file: Path, args: Any
) -> dict:
    import grpc

    from electric_sdk.client import AsyncClient

    out: dict[str, Any] = {}
    c = AsyncClient(address)
    echo_ch = grpc.aio.insecure_channel(echo_address)
    echo = echo_ch.unary_unary(common.ECHO_UNARY)
    durable = echo_ch.unary_unary(common.ECHO_DURABLE)
    echo_payload = b"x" * 120  # about a SignalEntityRequest with a reason and a small payload

    # -- the worker is up once a probe entity is running ---------------------------------------
    t0 = time.perf_counter()
    await c.spawn("lat/probe")
    await c.wait_for_state("lat/probe", "running", timeout=60)
    out["worker_ready_s"] = time.perf_counter() - t0
    out["rss_worker_start_mb"] = common.proc_status_bytes(worker_pid) / 2**20

    # -- 1. SIGUSR → on_signal ----------------------------------------------------------------
    await c.spawn("lat/usr")
    await c.wait_for_state("lat/usr", "running", timeout=30)
    await c.send("lat/usr", "hold")
    seen: dict[str, int] = {}
    arrived: dict[str, asyncio.Event] = {}
    steps: asyncio.Queue[Any] = asyncio.Queue()

    async def watch_usr() -> None:
        async for ev in c.watch("lat/usr", 0):
            if ev.type == "usr_seen":
                reason = ev.value["data"]["reason"] if "data" in ev.value else ev.value["reason"]
                t = ev.value["data"]["t"] if "data" in ev.value else ev.value["t"]
                seen[reason] = int(t)
                if reason in arrived:
                    arrived[reason].set()
            elif ev.type == "run":
                await steps.put(ev)

    watcher = asyncio.create_task(watch_usr())
    await asyncio.wait_for(steps.get(), WAIT_S)  # STARTED
    usr_lat: list[float] = []
    echo_lat: list[float] = []
    durable_lat: list[float] = []

    async def one_usr(i: int, record: bool) -> None:
        reason = f"u{i}"
        arrived[reason] = asyncio.Event()
        sent = time.time_ns()
        await c.signal("lat/usr", "SIGUSR", reason=reason)
        await asyncio.wait_for(arrived[reason].wait(), WAIT_S)
        if record:
            usr_lat.append((seen[reason] - sent) / 1e6)

    async def one_echo(record: bool) -> None:
        t = time.perf_counter()
        await echo(echo_payload, timeout=CALL_TIMEOUT_S)
        if record:
            echo_lat.append((time.perf_counter() - t) * 1e3)

    async def one_durable(record: bool) -> None:
        t = time.perf_counter()
        await durable(echo_payload, timeout=CALL_TIMEOUT_S)
        if record:
            durable_lat.append((time.perf_counter() - t) * 1e3)

    for i in range(50):  # warm-up
        await one_usr(-1 - i, False)
        await one_echo(False)
        await one_durable(False)
    per_round = max(1, args.signals // args.rounds)
    n = 0
    for r in range(args.rounds):
        kinds = ("usr", "echo", "durable")
        for kind in kinds[r % 3 :] + kinds[: r % 3]:
            for _ in range(per_round):
                if kind == "usr":
                    await one_usr(n, True)
                    n += 1
                elif kind == "echo":
                    await one_echo(True)
                else:
                    await one_durable(True)
    watcher.cancel()
    out["usr_ms"] = usr_lat
    out["echo_ms"] = echo_lat
    out["durable_ms"] = durable_lat

    # -- 2. SIGINT → ABORTED committed ----------------------------------------------------------
    await c.spawn("lat/int")
    await c.wait_for_state("lat/int", "running", timeout=30)
    run_events: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def watch_int() -> None:
        async for ev in c.watch("lat/int", 0):
            if ev.type == "run":
                await run_events.put((time.time_ns(), ev))

    watcher = asyncio.create_task(watch_int())

    async def until(status: str) -> tuple[int, Any]:
        while True:
            at, ev = await asyncio.wait_for(run_events.get(), WAIT_S)
            if str(ev.value.get("status", "")).upper().endswith(status):
                return at, ev

    int_commit: list[float] = []
    int_seen: list[float] = []
    sample_event: dict[str, Any] = {}
    for i in range(args.interrupts + 20):
        await c.send("lat/int", f"m{i}")
        await until("STEP")
        sent = time.time_ns()
        await c.interrupt("lat/int", reason=f"i{i}")
        at, ev = await until("ABORTED")
        if i >= 20:  # the first 20 are warm-up
            int_commit.append((ev.timestamp.timestamp() * 1e9 - sent) / 1e6)
            int_seen.append((at - sent) / 1e6)
            sample_event = ev.value
    watcher.cancel()
    out["int_commit_ms"] = int_commit
    out["int_seen_ms"] = int_seen
    out["int_sample_event"] = sample_event

    # -- 3. SIGHUP to N running entities --------------------------------------------------------
    n_fleet = args.entities
    states: dict[str, str] = {}
    idle_at: dict[str, int] = {}
    running_all = asyncio.Event()
    idle_all = asyncio.Event()

    counts: dict[str, int] = {}
    idle_commit: dict[str, float] = {}

    async def watch_fleet() -> None:
        async for ch in c.watch_entities(type="fleet"):
            st = ch.entity.state.value
            prev = states.get(ch.entity.ref.id)
            if prev is not None:
                counts[prev] -= 1
            states[ch.entity.ref.id] = st
            counts[st] = counts.get(st, 0) + 1
            if st == "idle" and not ch.snapshot:
                idle_at.setdefault(ch.entity.ref.id, time.time_ns())
                idle_commit.setdefault(ch.entity.ref.id, ch.entity.updated_at.timestamp())
            if counts.get("running", 0) == n_fleet:
                running_all.set()
            if len(idle_at) == n_fleet and counts.get("idle", 0) == n_fleet:
                idle_all.set()

    fleet_watch = asyncio.create_task(watch_fleet())
    await asyncio.sleep(0.5)  # the (empty) snapshot
    sem = asyncio.Semaphore(64)

    async def spawn(i: int) -> None:
        async with sem:
            await c.spawn(f"fleet/f{i:06d}")

    t0 = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(spawn(i) for i in range(n_fleet))), FLEET_WAIT_S)
    out["fleet_spawn_s"] = time.perf_counter() - t0
    await asyncio.wait_for(running_all.wait(), FLEET_WAIT_S)
    out["fleet_running_s"] = time.perf_counter() - t0
    out["rss_worker_fleet_running_mb"] = common.proc_status_bytes(worker_pid) / 2**20
    await asyncio.sleep(1.0)  # let the spawn storm settle
    cpu_w0 = common.proc_cpu_seconds(worker_pid)
    cpu_s0 = common.proc_cpu_seconds(server_pid)
    cpu_c0 = time.process_time()
    sent = time.time_ns()
    res = await c.signal_many("SIGHUP", type="fleet", reason="bench")
    call_ns = time.time_ns()
    try:
        await asyncio.wait_for(idle_all.wait(), FLEET_WAIT_S)
    finally:
        done_ns = time.time_ns()
        out["hup_signalled"] = res.signalled
        out["hup_call_s"] = (call_ns - sent) / 1e9
        out["hup_idle_count"] = len(idle_at)
        ts = sorted(idle_at.values())
        out["hup_first_idle_s"] = (ts[0] - sent) / 1e9 if ts else None
        out["hup_median_idle_s"] = (ts[len(ts) // 2] - sent) / 1e9 if ts else None
        out["hup_all_idle_s"] = (max(ts) - sent) / 1e9 if len(ts) == n_fleet else (done_ns - sent) / 1e9
        out["hup_worker_cpu_s"] = common.proc_cpu_seconds(worker_pid) - cpu_w0
        out["hup_server_cpu_s"] = common.proc_cpu_seconds(server_pid) - cpu_s0
        out["hup_client_cpu_s"] = time.process_time() - cpu_c0
        # The store's commit timestamp of the last idle change (ms resolution), vs its arrival here.
        out["hup_last_commit_s"] = max(idle_commit.values()) - sent / 1e9 if idle_commit else None
    page = await c.events("fleet/f000000", 0, 100)
    causes = [e.value.get("cause") for e in page.events if e.type == "state"]
    out["hup_sample_causes"] = causes

    # -- 4. N entities, each waiting inside a step: worker RSS ---------------------------------
    t0 = time.perf_counter()

    async def send(i: int) -> None:
        async with sem:
            await c.send(f"fleet/f{i:06d}", "hold")

    await asyncio.wait_for(asyncio.gather(*(send(i) for i in range(n_fleet))), FLEET_WAIT_S)
    out["hold_send_s"] = time.perf_counter() - t0
    deadline = time.monotonic() + HOLD_WAIT_S
    open_steps = 0
    want = n_fleet + 1  # + the SIGUSR entity's run, still holding its step
    milestones: list[tuple[int, float]] = []  # (steps open, s since the first send) at each 10%
    while time.monotonic() < deadline:
        try:
            open_steps = int(count_file.read_text())  # noqa: ASYNC240 - a tiny local file, polled
        except (OSError, ValueError):
            open_steps = 0
        while len(milestones) < 10 and open_steps >= want * (len(milestones) + 1) // 10:
            milestones.append((open_steps, round(time.perf_counter() - t0, 2)))
        if open_steps >= want:
            break
        await asyncio.sleep(0.2)
    out["hold_milestones"] = milestones
    out["hold_expected_steps"] = want
    out["hold_open_steps"] = open_steps
    out["hold_all_open_s"] = time.perf_counter() - t0
    await asyncio.sleep(2.0)  # let allocations settle
    out["rss_worker_hold_mb"] = common.proc_status_bytes(worker_pid) / 2**20
    out["hwm_worker_mb"] = common.proc_status_bytes(worker_pid, "VmHWM") / 2**20
    fleet_watch.cancel()
    await echo_ch.close()
    await c.close()
    return out


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--signals", type=int, default=500, help="SIGUSR latency samples (and echo samples)")
    p.add_argument("--interrupts", type=int, default=200)
    p.add_argument("--entities", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    if args.quick:
        args.signals = common.scale(args.signals, True, 50)
        args.interrupts = common.scale(args.interrupts, True, 20)
        args.entities = common.scale(args.entities, True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "benchrt_app.py").write_text(APP_MODULE)
        count_file = tmpdir / "open_steps"
        data = tmpdir / "data"
        echo = common.start_echo()
        server = common.start_electric(data)
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join([str(tmpdir), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "BENCHRT_COUNT_FILE": str(count_file),
        }
        worker_log = tmpdir / "worker.log"
        worker = common.start_worker(server.address, worker_log, "benchrt_app:app", env=env)
        try:
            out = asyncio.run(client(server.address, echo.address, server.pid, worker.pid, count_file, args))
        except BaseException:
            print(worker_log.read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            common.stop_worker(worker, 5)
            server.stop()
            echo.stop()
    elapsed = time.perf_counter() - started

    usr = common.summarize(out["usr_ms"])
    ech = common.summarize(out["echo_ms"])
    dur = common.summarize(out["durable_ms"])
    intc = common.summarize(out["int_commit_ms"])
    ints = common.summarize(out["int_seen_ms"])
    n = args.entities
    rows = [
        common.value_row("SIGUSR → on_signal in worker, p50", usr["p50"], ech["p50"], "ms", "<=", 2.0),
        common.value_row("SIGUSR → on_signal in worker, p99", usr["p99"], ech["p99"], "ms", "<=", 10.0),
        common.value_row("SIGINT → run ABORTED committed, p50", intc["p50"], ech["p50"], "ms", "<=", 3.0),
        common.value_row(
            f"SIGHUP to {n:,} running → all idle (reload)", out["hup_all_idle_s"], None, "s", "<=", 2.0
        ),
        common.value_row(
            f"worker RSS, {n:,} entities waiting in a step",
            out["rss_worker_hold_mb"],
            None,
            "MB",
            "<=",
            200.0,
        ),
        common.value_row("info: durable echo (one fsync'd commit), p50", dur["p50"], ech["p50"], "ms"),
        common.value_row("info: durable echo (one fsync'd commit), p99", dur["p99"], ech["p99"], "ms"),
        common.value_row("info: SIGINT → ABORTED committed, p99", intc["p99"], ech["p99"], "ms"),
        common.value_row("info: SIGINT → ABORTED seen by client watch, p50", ints["p50"], ech["p50"], "ms"),
        common.value_row("info: SIGHUP: SignalEntities call returned", out["hup_call_s"], None, "s"),
        common.value_row(
            "info: SIGHUP: first entity idle", out["hup_first_idle_s"] or float("nan"), None, "s"
        ),
        common.value_row(
            "info: SIGHUP: half the entities idle", out["hup_median_idle_s"] or float("nan"), None, "s"
        ),
        common.value_row(
            "info: SIGHUP: last idle committed (store)", out["hup_last_commit_s"] or float("nan"), None, "s"
        ),
        common.value_row("info: SIGHUP: worker CPU until all idle", out["hup_worker_cpu_s"], None, "s"),
        common.value_row("info: SIGHUP: server CPU until all idle", out["hup_server_cpu_s"], None, "s"),
        common.value_row("info: SIGHUP: client CPU until all idle", out["hup_client_cpu_s"], None, "s"),
        common.value_row(f"info: spawn {n:,} (64 callers)", out["fleet_spawn_s"], None, "s"),
        common.value_row(f"info: spawn → all {n:,} running", out["fleet_running_s"], None, "s"),
        common.value_row(f"info: {n:,} messages → all steps open", out["hold_all_open_s"], None, "s"),
        common.value_row(
            f"info: steps open when RSS read (of {out['hold_expected_steps']:,})",
            out["hold_open_steps"],
            None,
            "",
        ),
        common.value_row("info: worker RSS at start (1 entity)", out["rss_worker_start_mb"], None, "MB"),
        common.value_row(
            f"info: worker RSS, {n:,} running, no run", out["rss_worker_fleet_running_mb"], None, "MB"
        ),
        common.value_row("info: worker VmHWM (peak RSS)", out["hwm_worker_mb"], None, "MB"),
    ]
    info = {
        "args": vars(args),
        "usr_ms": usr,
        "echo_ms": ech,
        "durable_ms": dur,
        "int_commit_ms": intc,
        "int_seen_ms": ints,
        **{k: v for k, v in out.items() if not k.endswith("_ms")},
    }
    common.report("bench_runtime", rows, info, elapsed, args.quick)
    print(
        f"  SIGUSR n={usr['n']} echo n={ech['n']} SIGINT n={intc['n']}; "
        f"SIGHUP signalled {out['hup_signalled']:,}, idle seen {out['hup_idle_count']:,}, "
        f"sample causes {out['hup_sample_causes']}; open steps {out['hold_open_steps']:,}"
    )
    print(f"  hold: (steps open, s since first send) at each 10%: {out['hold_milestones']}")
    if out["hold_open_steps"] < out["hold_expected_steps"]:
        print(
            f"  WARNING: only {out['hold_open_steps']:,} of {out['hold_expected_steps']:,} steps open in {HOLD_WAIT_S:.0f} s"
        )
    print(f"  sample ABORTED event value: {json.dumps(out['int_sample_event'])[:300]}")


if __name__ == "__main__":
    main()
