"""WatchEntities fan-out: commit-to-arrival delay at 1,000 concurrent watchers.

Setup: the server in its own process; 1,000 WatchEntities streams (type
filter "wb") spread over 4 watcher processes (multiprocessing, spawn), each
one grpc.aio channel carrying 250 streams. Every stream must have received
its `snapshot_complete` before any change is made.

Load: the driver (the main process, also separate from the server) makes 50
state changes one at a time, 300 ms apart: SpawnEntity wb/cN (-> spawning),
then SignalEntity wb/cN SIGKILL (-> killed), and so on. Each watcher stamps
every change on arrival with time.time_ns(); the delay is arrival minus the
change's ``changed_at`` (the store's commit timestamp, taken when the
transaction starts, so it includes the fsync; it has millisecond resolution,
so delays are over-stated by up to 1 ms). One machine, so one clock.
Figure: p50 and p99 over all (change, watcher) pairs; a delivery that never
arrives counts as infinitely late. Target: p99 <= 250 ms.

Ceiling: the echo server (common.py) with the same 4 x 250 Subscribe
streams and the same 50 one-at-a-time Publish calls, 300 ms apart. Publish
stamps time.time_ns() into a message padded to the size of a real
EntityChange response and puts it on every subscriber's queue; the same
arrival-minus-stamp delay is measured.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

TYPE = "wb"
PROCESSES = 4
INTERVAL_S = 0.3
READY_TIMEOUT_S = 120.0
TAIL_S = 30.0  # how long watchers wait after the last change is due


def _change_size() -> int:
    from electric_server.store.base import EntityRecord

    from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
    from electric_sdk._wire.entities import entity_to_pb
    from electric_sdk._wire.times import timestamp_from_ms
    from electric_sdk.lifecycle import State

    now = int(time.time() * 1000)
    rec = EntityRecord(TYPE, "c000000", State.KILLED, 30000, 60000, now, now, 3, True, None, 123456)
    msg = api.WatchEntitiesResponse(
        change=api.EntityChange(entity=entity_to_pb(rec), previous_state=1, changed_at=timestamp_from_ms(now))
    )
    return msg.ByteSize()


def watcher_main(
    kind: str, address: str, idx: int, streams: int, changes: int, ready_q: Any, out_q: Any
) -> None:
    async def main() -> dict[str, Any]:
        import grpc

        from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
        from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc

        delays: list[float] = []
        received = [0] * streams
        ready = 0
        all_ready = asyncio.Event()
        errors: list[str] = []
        budget = READY_TIMEOUT_S + changes * INTERVAL_S + TAIL_S + 30

        async with grpc.aio.insecure_channel(address) as channel:
            if kind == "electric":
                stub = api_grpc.EntityServiceStub(channel)
            else:
                subscribe = channel.unary_stream(common.ECHO_SUBSCRIBE)

            async def one(k: int) -> None:
                nonlocal ready
                if kind == "electric":
                    call = stub.WatchEntities(api.WatchEntitiesRequest(type=TYPE), timeout=budget)
                else:
                    call = subscribe(b"", timeout=budget)
                is_ready = False
                try:
                    async for msg in call:
                        now = time.time_ns()
                        if not is_ready:
                            if kind == "electric":
                                if msg.WhichOneof("item") != "snapshot_complete":
                                    continue
                            elif msg != b"ready":
                                continue
                            is_ready = True
                            ready += 1
                            if ready == streams:
                                all_ready.set()
                            continue
                        if kind == "electric":
                            if msg.WhichOneof("item") != "change":
                                continue
                            ts = msg.change.changed_at
                            stamp = ts.seconds * 1_000_000_000 + ts.nanos
                        else:
                            stamp = int.from_bytes(msg[:8], "big")
                        delays.append((now - stamp) / 1e6)
                        received[k] += 1
                        if received[k] >= changes:
                            break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if len(errors) < 5:
                        errors.append(repr(exc)[:300])
                finally:
                    call.cancel()

            tasks = [asyncio.create_task(one(k)) for k in range(streams)]
            try:
                await asyncio.wait_for(all_ready.wait(), READY_TIMEOUT_S)
            except TimeoutError:
                errors.append(f"only {ready}/{streams} streams ready")
            ready_q.put((idx, ready, time.process_time()))
            _, pending = await asyncio.wait(tasks, timeout=changes * INTERVAL_S + TAIL_S + READY_TIMEOUT_S)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return {
            "idx": idx,
            "delays": delays,
            "received": sum(received),
            "errors": errors,
            "cpu_s": time.process_time(),
        }

    try:
        out_q.put(asyncio.run(main()))
    except BaseException as exc:
        out_q.put({"idx": idx, "error": repr(exc)})
        raise


async def drive(kind: str, address: str, changes: int, pad: bytes) -> dict[str, Any]:
    """Make `changes` changes one at a time, INTERVAL_S apart."""
    import grpc

    from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
    from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
    from electric_sdk._proto.electric.v1 import types_pb2 as pb

    call_ms = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        publish = channel.unary_unary(common.ECHO_PUBLISH)
        next_at = time.monotonic()
        for c in range(changes):
            next_at += INTERVAL_S
            t0 = time.perf_counter()
            if kind == "electric":
                ref = pb.EntityRef(type=TYPE, id=f"c{c // 2:06d}")
                if c % 2 == 0:
                    await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref), timeout=30)
                else:
                    await stub.SignalEntity(
                        api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGKILL), timeout=30
                    )
            else:
                await publish(c.to_bytes(4, "big") + pad, timeout=30)
            call_ms.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    return {"call_ms": common.summarize(call_ms)}


def run_kind(
    kind: str, address: str, server_pid: int, watchers: int, changes: int, pad: bytes
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    ready_q, out_q = ctx.Queue(), ctx.Queue()
    per = [watchers // PROCESSES + (1 if i < watchers % PROCESSES else 0) for i in range(PROCESSES)]
    procs = [
        ctx.Process(target=watcher_main, args=(kind, address, i, n, changes, ready_q, out_q), daemon=True)
        for i, n in enumerate(per)
    ]
    for p in procs:
        p.start()
    results: list[dict[str, Any]] = []
    try:
        t0 = time.perf_counter()
        ready = [ready_q.get(timeout=READY_TIMEOUT_S + 60) for _ in procs]
        ready_s = time.perf_counter() - t0
        n_ready = sum(r[1] for r in ready)
        cpu0 = common.proc_cpu_seconds(server_pid)
        sys0, me0 = common.system_busy_seconds(), time.process_time()
        t0 = time.perf_counter()
        driver = asyncio.run(drive(kind, address, changes, pad))
        drive_s = time.perf_counter() - t0
        srv_cpu = common.proc_cpu_seconds(server_pid) - cpu0
        results = [out_q.get(timeout=changes * INTERVAL_S + TAIL_S + READY_TIMEOUT_S + 60) for _ in procs]
        # Watchers finish shortly after the last change, so their CPU since "ready" is about the drive window.
        watcher_cpu = sum(r.get("cpu_s", 0.0) for r in results) - sum(r[2] for r in ready)
        other = common.system_busy_seconds() - sys0 - srv_cpu - watcher_cpu - (time.process_time() - me0)
        other_util = max(0.0, other / (time.perf_counter() - t0))
    finally:
        common.reap_processes(procs)
    errors = common.client_errors(results)
    delays = [d for r in results for d in r.get("delays", [])]
    expected = watchers * changes
    missing = expected - len(delays)
    all_delays = sorted(delays) + [math.inf] * max(0, missing)
    return {
        "watchers_ready": n_ready,
        "ready_s": ready_s,
        "drive_s": drive_s,
        "driver": driver,
        "server_cpu_s_during_changes": srv_cpu,
        "watcher_cpu_s": watcher_cpu,
        "other_cpu_util": other_util,
        "deliveries": len(delays),
        "expected": expected,
        "missing": missing,
        "errors": errors,
        "delay_ms": {
            "p50": common.percentile(all_delays, 50, presorted=True),
            "p90": common.percentile(all_delays, 90, presorted=True),
            "p99": common.percentile(all_delays, 99, presorted=True),
            "max": all_delays[-1] if all_delays else math.nan,
            "min": all_delays[0] if all_delays else math.nan,
        },
    }


def main() -> None:
    args = common.bench_args(__doc__.splitlines()[0]).parse_args()
    quick = args.quick
    t_start = time.perf_counter()
    watchers = common.scale(1000, quick)
    changes = common.scale(50, quick)
    size = _change_size()
    pad = b"x" * max(0, size - 8 - 4)
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="electric-bench-watch-") as tmp:
        with common.start_echo(log=Path(tmp) / "echo.log") as echo:
            res["echo"] = run_kind("echo", echo.address, echo.pid, watchers, changes, pad)
        with common.start_electric(Path(tmp) / "data") as srv:
            res["electric"] = run_kind("electric", srv.address, srv.pid, watchers, changes, pad)
    el, ec = res["electric"], res["echo"]
    for kind, r in res.items():
        if r["missing"] or r["errors"]:
            print(
                f"WARNING: {kind}: {r['missing']} of {r['expected']} deliveries missing; errors {r['errors']}",
                file=sys.stderr,
            )
    rows = [
        common.value_row(
            f"WatchEntities commit->arrival p99, {watchers} watchers",
            el["delay_ms"]["p99"],
            ec["delay_ms"]["p99"],
            "ms",
            "<=",
            250.0,
        ),
        common.value_row("  (info) p50", el["delay_ms"]["p50"], ec["delay_ms"]["p50"], "ms"),
        common.value_row("  (info) max", el["delay_ms"]["max"], ec["delay_ms"]["max"], "ms"),
        common.value_row(
            "  (info) server CPU per change",
            el["server_cpu_s_during_changes"] / changes * 1000,
            ec["server_cpu_s_during_changes"] / changes * 1000,
            "ms",
        ),
    ]
    elapsed = time.perf_counter() - t_start
    info = {
        "watchers": watchers,
        "changes": changes,
        "processes": PROCESSES,
        "interval_s": INTERVAL_S,
        "message_bytes": size,
        "electric": el,
        "echo": ec,
    }
    common.report("bench_watch", rows, info, elapsed, quick)
    for kind, r in (("echo", ec), ("electric", el)):
        print(
            f"  {kind}: {r['deliveries']}/{r['expected']} deliveries; {r['watchers_ready']} streams ready in "
            f"{r['ready_s']:.1f} s; driver call p50 {r['driver']['call_ms']['p50']:.2f} ms; "
            f"delay p90 {r['delay_ms']['p90']:.1f} ms, min {r['delay_ms']['min']:.1f} ms; CPU during changes "
            f"(cores): server {r['server_cpu_s_during_changes'] / r['drive_s']:.2f}, watchers "
            f"{r['watcher_cpu_s'] / r['drive_s']:.2f}, other {r['other_cpu_util']:.2f}"
        )


if __name__ == "__main__":
    main()
