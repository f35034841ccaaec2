"""WatchEvents fan-out: 2,000 watchers of one entity while 8 writers append to it.

Setup: the server in its own process; entities fan/one (written and watched)
and fan/other (only read). Watchers: 2,000 WatchEvents streams on fan/one,
spread over 4 processes (spawn), each one grpc.aio channel with 500 streams,
as the SDK opens them (accepts_batches). Each stream starts one event before
the head, so its first event says it is open. Writers: one process with 8
closed-loop SendMessage callers on fan/one (64-byte texts) for 20 s, and a
prober in the same process calling GetEntity on fan/other every 20 ms.

Phases, one server: (idle) the prober alone for 3 s; (alone) writers and
prober without watchers; (watched) writers and prober with the 2,000
watchers. After the writers stop, every watcher must reach the head; each
stream checks that offsets arrive gap-free and once.

Figures and targets:
- writes/s watched ÷ writes/s alone >= 0.5;
- deliveries/s (events received by watchers, summed, over the time from the
  writers' start to the last delivery) ÷ ceiling >= 0.7. Ceiling, same run:
  the bare echo server (common.py) sending messages of one event's encoded
  size on 2,000 streams (4 processes x 500, the same client code shape) as
  fast as it can — the rate at which a bare grpc.aio server delivers the
  same messages one by one;
- GetEntity p50 while watched <= 3 x its idle p50;
- no event missing or repeated at any watcher.
Informational: the messages per second electric sent (events go batched)
beside the echo server sending messages of that mean size.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

PROCESSES = 4
# Streams per channel: one channel with 500 server streams gets them CANCELLED on grpc's side,
# against either server; 100 per channel (5 channels a process) is what a client would open.
CHANNEL_STREAMS = 100
WRITERS = 8
TEXT = "x" * 64
PROBE_INTERVAL_S = 0.02
READY_TIMEOUT_S = 120.0
TAIL_S = 600.0  # how long watchers may take to reach the head once the writers stop (they catch up)


def _ref(id_: str) -> Any:
    from electric_sdk._proto.electric.v1 import types_pb2 as pb

    return pb.EntityRef(type="fan", id=id_)


# -- the watchers ---------------------------------------------------------------------


def watcher_main(address: str, streams: int, from_offset: int, target: Any, ready_q: Any, out_q: Any) -> None:
    """``streams`` WatchEvents calls, CHANNEL_STREAMS per channel; each runs until it reaches ``target`` (set once
    the writers stop) and counts events, messages, bytes, gaps and repeats."""

    async def main() -> dict[str, Any]:
        import grpc

        from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
        from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
        from electric_sdk._wire.limits import CHANNEL_OPTIONS

        totals = {"events": 0, "messages": 0, "bytes": 0, "missing": 0, "repeated": 0}
        last = [0.0]
        errors: list[str] = []
        wave = asyncio.Event()
        opened = [0]

        channels = [
            grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            for _ in range(-(-streams // CHANNEL_STREAMS))
        ]
        try:
            stubs = [api_grpc.EntityServiceStub(c) for c in channels]

            reached = [from_offset] * streams  # each stream's next expected offset

            async def one(k: int) -> None:
                request = api.WatchEventsRequest(
                    ref=_ref("one"), from_offset=from_offset, accepts_batches=True
                )
                call = stubs[k // CHANNEL_STREAMS].WatchEvents(request)
                expected = from_offset
                is_open = False
                try:
                    async for item in call:
                        kind = item.WhichOneof("item")
                        events = item.events.events if kind == "events" else (item.event,)
                        totals["messages"] += 1
                        totals["bytes"] += item.ByteSize()
                        if not events:
                            continue
                        # The server sends offsets in increasing order; a message whose first
                        # offset is the one expected and whose count spans to its last holds each
                        # offset once. A per-event Python loop would make this client, not the
                        # server, the bottleneck at a million events a second.
                        first, last_offset, count = events[0].offset, events[-1].offset, len(events)
                        if first != expected or last_offset - first + 1 != count:
                            offsets = [e.offset for e in events]
                            fresh = [o for o in offsets if o >= expected]
                            totals["repeated"] += len(offsets) - len(set(fresh))
                            if fresh:
                                totals["missing"] += max(fresh) - expected + 1 - len(set(fresh))
                                expected = max(fresh) + 1
                            totals["events"] += len(set(fresh))
                        else:
                            expected = last_offset + 1
                            totals["events"] += count
                        reached[k] = expected
                        last[0] = time.time()
                        if not is_open:
                            is_open = True
                            opened[0] += 1
                            if opened[0] % CHANNEL_STREAMS == 0 or opened[0] == streams:
                                wave.set()
                except Exception as exc:
                    if len(errors) < 5:
                        errors.append(repr(exc)[:300])
                finally:
                    call.cancel()

            # Opened a channel's worth at a time, each wave once the last one is open: 2,000
            # streams opened at once get some of them CANCELLED by grpc, against either server.
            tasks: list[asyncio.Task[None]] = []
            try:
                for start in range(0, streams, CHANNEL_STREAMS):
                    wave.clear()
                    tasks += [
                        asyncio.create_task(one(k))
                        for k in range(start, min(streams, start + CHANNEL_STREAMS))
                    ]
                    await asyncio.wait_for(wave.wait(), READY_TIMEOUT_S)
            except TimeoutError:
                errors.append(f"only {opened[0]}/{streams} streams opened")
            ready_q.put(opened[0])
            # Until the head is known (target set), then until every stream reached it.
            while not target.value:  # noqa: ASYNC110 - another process sets it; nothing to await
                await asyncio.sleep(0.05)
            give_up = time.perf_counter() + TAIL_S
            while min(reached) < target.value and time.perf_counter() < give_up:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            behind = sum(1 for r in reached if r < target.value)
            if behind:
                errors.append(f"{behind} streams did not reach the head within {TAIL_S:g} s")
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for c in channels:
                await c.close()
        # Events behind the head that a stream never received count as missing (in run_watched).
        return totals | {"last": last[0], "errors": errors, "unfinished": behind}

    try:
        out_q.put(asyncio.run(main()))
    except BaseException as exc:
        out_q.put({"error": repr(exc)})
        raise


# -- the writers and the prober ---------------------------------------------------------


def writer_main(address: str, writers: int, duration_s: float, out_q: Any) -> None:
    async def main() -> dict[str, Any]:
        import grpc

        from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
        from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc

        async with grpc.aio.insecure_channel(address) as channel:
            stub = api_grpc.EntityServiceStub(channel)
            send = api.SendMessageRequest(ref=_ref("one"), text=TEXT)
            get = api.GetEntityRequest(ref=_ref("other"))
            await stub.GetEntity(get)
            writes = [0]
            probes: list[float] = []
            started = time.time()
            stop_at = time.perf_counter() + duration_s

            async def writer() -> None:
                while time.perf_counter() < stop_at:
                    await stub.SendMessage(send, timeout=60)
                    writes[0] += 1

            async def prober() -> None:
                while time.perf_counter() < stop_at:
                    t0 = time.perf_counter()
                    await stub.GetEntity(get, timeout=60)
                    probes.append((time.perf_counter() - t0) * 1000)
                    await asyncio.sleep(PROBE_INTERVAL_S)

            t0 = time.perf_counter()
            await asyncio.gather(prober(), *(writer() for _ in range(writers)))
            elapsed = time.perf_counter() - t0
            head = (await stub.GetEntity(api.GetEntityRequest(ref=_ref("one")))).entity.head_offset
        return {
            "writes": writes[0],
            "elapsed_s": elapsed,
            "started": started,
            "head": head,
            "get_ms": common.summarize(probes),
        }

    try:
        out_q.put(asyncio.run(main()))
    except BaseException as exc:
        out_q.put({"error": repr(exc)})
        raise


def run_writers(address: str, writers: int, duration_s: float) -> dict[str, Any]:
    return common.run_in_process(writer_main, address, writers, duration_s, timeout=duration_s + 120)


async def _setup(address: str) -> None:
    import grpc

    from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
    from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        for id_ in ("one", "other"):
            await stub.SpawnEntity(api.SpawnEntityRequest(ref=_ref(id_)))


async def _event_size(address: str, offset: int) -> int:
    """One message event as the feed encodes it (field tag and length included)."""
    import grpc

    from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
    from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        page = await stub.ReadEvents(api.ReadEventsRequest(ref=_ref("one"), from_offset=offset, limit=1))
        return api.WatchEventsResponse(event=page.events[0]).ByteSize()


def run_watched(address: str, server_pid: int, watchers: int, duration_s: float) -> dict[str, Any]:
    from_offset = asyncio.run(_head(address)) - 1
    ctx = mp.get_context("spawn")
    target = ctx.RawValue("q", 0)
    ready_q, out_q = ctx.Queue(), ctx.Queue()
    per = [watchers // PROCESSES + (1 if i < watchers % PROCESSES else 0) for i in range(PROCESSES)]
    procs = [
        ctx.Process(target=watcher_main, args=(address, n, from_offset, target, ready_q, out_q), daemon=True)
        for n in per
    ]
    for p in procs:
        p.start()
    try:
        opened = sum(ready_q.get(timeout=READY_TIMEOUT_S + 60) for _ in procs)
        cpu0, busy0, t0 = (
            common.proc_cpu_seconds(server_pid),
            common.system_busy_seconds(),
            time.perf_counter(),
        )
        writes = run_writers(address, WRITERS, duration_s)
        target.value = writes["head"]
        writing_s = time.perf_counter() - t0
        server_cpu_writing = (common.proc_cpu_seconds(server_pid) - cpu0) / writing_s
        machine_cpu_writing = (common.system_busy_seconds() - busy0) / writing_s
        results = [out_q.get(timeout=TAIL_S + 120) for _ in procs]
        server_cpu = common.proc_cpu_seconds(server_pid) - cpu0
    finally:
        common.reap_processes(procs)
    errors = common.client_errors(results)
    events = sum(r.get("events", 0) for r in results)
    expected = watchers * (writes["head"] - from_offset)
    last = max(r.get("last", 0.0) for r in results)
    span = last - writes["started"]
    return {
        "opened": opened,
        "writes": writes,
        "events": events,
        "expected_events": expected,
        "missing": sum(r.get("missing", 0) for r in results) + max(0, expected - events),
        "repeated": sum(r.get("repeated", 0) for r in results),
        "messages": sum(r.get("messages", 0) for r in results),
        "bytes": sum(r.get("bytes", 0) for r in results),
        "delivery_span_s": span,
        "server_cpu_s": server_cpu,
        "server_cores_while_writing": server_cpu_writing,
        "machine_cores_while_writing": machine_cpu_writing,
        "errors": errors,
    }


async def _head(address: str) -> int:
    import grpc

    from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
    from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        return int((await stub.GetEntity(api.GetEntityRequest(ref=_ref("one")))).entity.head_offset)


# -- the ceiling --------------------------------------------------------------------------


def echo_main(address: str, streams: int, count: int, size: int, ready_q: Any, go: Any, out_q: Any) -> None:
    """``streams`` Stream calls, CHANNEL_STREAMS per channel, each asking for ``count`` messages of ``size`` bytes."""

    async def main() -> dict[str, Any]:
        import grpc

        received = [0]
        channels = [grpc.aio.insecure_channel(address) for _ in range(-(-streams // CHANNEL_STREAMS))]
        methods = [c.unary_stream(common.ECHO_STREAM) for c in channels]
        request = count.to_bytes(4, "big") + b"x" * size
        ready_q.put(1)
        while not go.value:  # noqa: ASYNC110 - another process sets it; nothing to await
            await asyncio.sleep(0.005)

        cancelled = [0]

        async def one(k: int) -> None:
            try:
                async for _ in methods[k // CHANNEL_STREAMS](request, timeout=600):
                    received[0] += 1
            except grpc.aio.AioRpcError as exc:
                # Seen with 2,000 streams at once: grpc cancels some of the bare server's calls
                # under load. What they received still counts; how many is reported.
                if exc.code() != grpc.StatusCode.CANCELLED:
                    raise
                cancelled[0] += 1

        await asyncio.gather(*(one(k) for k in range(streams)))
        for c in channels:
            await c.close()
        return {"received": received[0], "cancelled": cancelled[0], "last": time.time()}

    try:
        out_q.put(asyncio.run(main()))
    except BaseException as exc:
        out_q.put({"error": repr(exc)})
        raise


def run_echo(address: str, watchers: int, count: int, size: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    go = ctx.RawValue("b", 0)
    ready_q, out_q = ctx.Queue(), ctx.Queue()
    per = [watchers // PROCESSES + (1 if i < watchers % PROCESSES else 0) for i in range(PROCESSES)]
    procs = [
        ctx.Process(target=echo_main, args=(address, n, count, size, ready_q, go, out_q), daemon=True)
        for n in per
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready_q.get(timeout=READY_TIMEOUT_S)
        started = time.time()
        go.value = 1
        results = [out_q.get(timeout=600) for _ in procs]
    finally:
        common.reap_processes(procs)
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(f"the echo ceiling failed: {errors}")
    received = sum(r["received"] for r in results)
    span = max(r["last"] for r in results) - started
    cancelled = sum(r["cancelled"] for r in results)
    return {
        "received": received,
        "cancelled_streams": cancelled,
        "span_s": span,
        "per_s": received / span,
        "count": count,
        "size": size,
    }


def main() -> None:
    parser = common.bench_args(__doc__.splitlines()[0])
    parser.add_argument("--watchers", type=int, help="default 2,000 (200 with --quick)")
    parser.add_argument("--duration", type=float, help="seconds of writing, default 20 (2 with --quick)")
    args = parser.parse_args()
    quick = args.quick
    t_start = time.perf_counter()
    watchers = args.watchers or common.scale(2000, quick)
    duration_s = args.duration or (2.0 if quick else 20.0)
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="electric-bench-fanout-") as tmp:
        with common.start_electric(Path(tmp) / "data") as srv:
            asyncio.run(_setup(srv.address))
            res["idle"] = run_writers(srv.address, 0, 3.0)
            res["alone"] = run_writers(srv.address, WRITERS, duration_s)
            res["watched"] = run_watched(srv.address, srv.pid, watchers, duration_s)
            event_size = asyncio.run(_event_size(srv.address, res["watched"]["writes"]["head"] - 1))
        w = res["watched"]
        mean_message = w["bytes"] / max(1, w["messages"])
        per_stream_messages = max(1, round(w["messages"] / watchers))
        with common.start_echo(log=Path(tmp) / "echo.log") as echo:
            res["ceiling"] = run_echo(echo.address, watchers, 50 if quick else 100, event_size)
            res["ceiling_batched"] = run_echo(
                echo.address, watchers, min(per_stream_messages, 200), round(mean_message)
            )
    alone, idle, c, cb = res["alone"], res["idle"], res["ceiling"], res["ceiling_batched"]
    writes_alone = alone["writes"] / alone["elapsed_s"]
    writes_watched = w["writes"]["writes"] / w["writes"]["elapsed_s"]
    deliveries = w["events"] / w["delivery_span_s"]
    messages = w["messages"] / w["delivery_span_s"]
    if w["errors"] or w["missing"] or w["repeated"]:
        print(
            f"WARNING: {w['missing']} events missing, {w['repeated']} repeated; errors {w['errors']}",
            file=sys.stderr,
        )
    rows = [
        common.ratio_row(f"writes/s with {watchers} watchers", writes_watched, writes_alone, "/s", ">=", 0.5),
        common.ratio_row("deliveries/s (events to watchers)", deliveries, c["per_s"], "/s", ">=", 0.7),
        common.ratio_row(
            "unrelated GetEntity p50", w["writes"]["get_ms"]["p50"], idle["get_ms"]["p50"], "ms", "<=", 3.0
        ),
        common.value_row("events missing or repeated", w["missing"] + w["repeated"], None, "", "<=", 0),
        common.value_row("  (info) messages/s (batched)", messages, cb["per_s"], "/s"),
        common.value_row(
            "  (info) GetEntity p50, writers alone", alone["get_ms"]["p50"], idle["get_ms"]["p50"], "ms"
        ),
        common.value_row("  (info) GetEntity p99, watched", w["writes"]["get_ms"]["p99"], None, "ms"),
    ]
    info = {
        "watchers": watchers,
        "writers": WRITERS,
        "duration_s": duration_s,
        "event_bytes": event_size,
        "mean_message_bytes": mean_message,
        **res,
    }
    common.report("bench_fanout", rows, info, time.perf_counter() - t_start, quick)
    print(
        f"  watched: {w['opened']} streams open; {w['events']:,} events in {w['messages']:,} messages over "
        f"{w['delivery_span_s']:.1f} s; server CPU {w['server_cpu_s'] / w['delivery_span_s']:.2f} cores "
        f"(while writing {w['server_cores_while_writing']:.2f}, machine {w['machine_cores_while_writing']:.2f}); "
        f"ceiling: {c['received']:,} messages of {event_size} B in {c['span_s']:.1f} s "
        f"({c['cancelled_streams']} of its streams cancelled by grpc)"
    )


if __name__ == "__main__":
    main()
