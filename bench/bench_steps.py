"""Recorded steps and durable state: a step's cost beside a custom event's, and a wake's rebuild.

Two processes: ``electric server`` (fresh data dir, SQLite WAL,
synchronous=FULL) and this script, which runs a Worker on its own loop and
reads the streams as a client.

1. A recorded step (``await ctx.step("tool", async_noop)``: one
   ``electric.step`` event written through the lease's fenced write) beside
   its ceiling, a custom event (``await ctx.emit(...)``: one fenced write of
   a small JSON value) in the same run, alternating rounds; p50 of each
   call's latency. Target: ratio <= 1.2. Info: the same step with a plain
   function, which runs in a worker thread (so a SIGINT need not wait).
2. An entity whose runs made N (100,000) state changes (10 per recorded
   step, over 1,000 keys), snapshots every 1,000 changes (the default). The
   state a wake rebuilds (``state_read.load_state``: search back for the
   newest state event, read its snapshot, fold the tail) beside its ceiling,
   a full replay (read the whole stream, fold every op); both read over
   gRPC from the server process, the same code the worker runs at a lease.
   Both must give the same state. Target: <= 50 ms with snapshots. Info: a
   whole wake of that entity (SIGHUP, then a message: send → its run
   COMPLETED, lease and rebuild included) beside the same for an entity
   without state, alternating rounds.
3. SIGINT → aborted with a thread-blocked step: a run whose recorded step
   is a plain function blocked in its worker thread (it would block until
   the bench releases it) is interrupted; the time from the client's
   ``interrupt`` call to the client's watch seeing the run's ABORTED record.
   Ceiling: the same with an async step (``await`` on an event), alternating
   rounds. Target: p50 <= 3 ms.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from electric_sdk import AsyncClient
from electric_sdk.durable_state import fold
from electric_sdk.models import EventPage
from electric_sdk.runtime import App, Context, Message, Worker
from electric_sdk.state_read import load_state, read_range

CHANGES_PER_STEP = 10
KEYS = 1000
timings: dict[str, list[float]] = {"step": [], "emit": [], "thread_step": []}
# What the run of a `blocker` entity waits on, set afresh by each abort round.
gates: dict[str, Any] = {}


def noop() -> str:
    return "ok"


async def async_noop() -> str:
    return "ok"


def build_app(calls: int, rounds: int) -> App:
    app = App("bench-steps")

    @app.entity("steps")
    async def steps(ctx: Context, message: Message) -> None:
        for _ in range(rounds):  # alternating rounds: background load lands on both sides alike
            for kind, spent in timings.items():
                for _ in range(calls):
                    started = time.perf_counter()
                    if kind == "emit":
                        await ctx.emit("bench.custom", {"name": "tool", "result": "ok"})
                    elif kind == "step":
                        await ctx.step("tool", async_noop)
                    else:  # a plain function runs in a worker thread: the hop's cost is its own row
                        await ctx.step("tool", noop)
                    spent.append((time.perf_counter() - started) * 1000)

    @app.entity("history")
    async def history(ctx: Context, message: Message) -> None:
        prefs = ctx.state["prefs"]
        for i in range(int(message.text) // CHANGES_PER_STEP):
            for j in range(CHANGES_PER_STEP):
                prefs[f"k{(i * CHANGES_PER_STEP + j) % KEYS}"] = i
            await ctx.step("tool", noop)

    @app.entity("blocker")
    async def blocker(ctx: Context, message: Message) -> None:
        entered, release = gates["entered"], gates["release"]
        if message.text == "thread":
            await ctx.step("tool:block", lambda: entered.set() or release.wait())
        else:

            async def hold() -> None:
                entered.set()
                await anyio.sleep_forever()

            await ctx.step("tool:block", hold)

    @app.entity("plain")
    async def plain(ctx: Context, message: Message) -> None:
        pass  # no state: its wake is the ceiling of a wake that rebuilds one

    return app


async def run_message(client: AsyncClient, ref: str, text: str, limit_s: float) -> None:
    await client.spawn(ref)
    await send_and_wait(client, ref, text, limit_s)


async def send_and_wait(client: AsyncClient, ref: str, text: str, limit_s: float = 60) -> None:
    receipt = await client.send(ref, text)
    with anyio.fail_after(limit_s):
        async for event in client.watch(ref, receipt.offset):
            if event.type == "run" and event.value["status"] in ("completed", "failed", "aborted"):
                assert event.value["status"] == "completed", event.value
                return


async def rebuilds(client: AsyncClient, ref: str, rounds: int) -> dict[str, Any]:
    async def page(from_offset: int, limit: int) -> EventPage:
        return await client.events(ref, from_offset, limit)

    head = (await client.events(ref, 0, 1)).head_offset
    snap_ms, full_ms = [], []
    loaded = full = None
    for _ in range(rounds):
        started = time.perf_counter()
        loaded = await load_state(page, head)
        snap_ms.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        events = await read_range(page, 0, head)
        full = fold((e.type, e.value.get("data")) for e in events)
        full_ms.append((time.perf_counter() - started) * 1000)
    assert loaded is not None
    assert loaded.state == full, "snapshot + tail differs from the full replay"
    return {"snapshot_ms": snap_ms, "full_ms": full_ms, "events": head, "snapshot_offset": loaded.snapshot}


async def wakes(client: AsyncClient, refs: list[str], rounds: int) -> dict[str, list[float]]:
    """Per entity: reload it (SIGHUP: idle, lease released), then time a message from send to its
    run's COMPLETED as the client sees it: the lease, the state's rebuild and the run."""
    out: dict[str, list[float]] = {ref: [] for ref in refs}
    for _ in range(rounds):
        for ref in refs:  # alternating: background load lands on both alike
            await client.reload(ref)
            await client.wait_for_state(ref, "idle", timeout=30)
            started = time.perf_counter()
            await send_and_wait(client, ref, "0")
            out[ref].append((time.perf_counter() - started) * 1000)
    return out


async def one_abort(client: AsyncClient, ref: str, kind: str) -> float:
    """One SIGINT, sent once the run's step blocks: ms until the watch sees the run ABORTED."""
    entered, release = threading.Event(), threading.Event()
    gates.update(entered=entered, release=release)
    receipt = await client.send(ref, kind)
    watching, seen = anyio.Event(), anyio.Event()
    seen_at: list[float] = []

    async def watch() -> None:
        async for event in client.watch(ref, receipt.offset):
            if event.type != "run" or event.raw.run.message_key != receipt.key:
                continue
            if event.value["status"] == "started":
                watching.set()
            elif event.value["status"] == "aborted":
                seen_at.append(time.perf_counter())
                seen.set()
                return

    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                await watching.wait()
                await anyio.to_thread.run_sync(entered.wait)  # the step blocks now
                started = time.perf_counter()
                await client.interrupt(ref)
                await seen.wait()
    finally:
        release.set()  # the abandoned thread ends
    return (seen_at[0] - started) * 1000


async def aborts(client: AsyncClient, ref: str, rounds: int) -> dict[str, list[float]]:
    """SIGINT → the run's ABORTED record as the client sees it, with the step blocked in a thread
    or awaiting in the event loop; alternating rounds."""
    await client.spawn(ref)
    out: dict[str, list[float]] = {"thread": [], "async": []}
    for _ in range(rounds):
        for kind, times in out.items():
            times.append(await one_abort(client, ref, kind))
    return out


async def measure(address: str, args: Any) -> dict[str, Any]:
    worker = Worker(build_app(args.calls, args.rounds), address)
    async with anyio.create_task_group() as tg, AsyncClient(address) as client:
        with anyio.fail_after(30):
            await tg.start(worker.run)
        await run_message(client, "steps/s1", "go", 600)
        filled = time.perf_counter()
        await run_message(client, "history/h1", str(args.changes), 3600)
        fill_s = time.perf_counter() - filled
        out = await rebuilds(client, "history/h1", args.rounds)
        await run_message(client, "plain/p1", "0", 60)
        woken = await wakes(client, ["history/h1", "plain/p1"], args.rounds)
        aborted = await aborts(client, "blocker/b1", args.aborts)
        await worker.shutdown(1.0)
    return out | {
        "fill_s": fill_s,
        "wake_ms": woken["history/h1"],
        "plain_wake_ms": woken["plain/p1"],
        "abort_thread_ms": aborted["thread"],
        "abort_async_ms": aborted["async"],
    }


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=500, help="steps and custom events per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--changes", type=int, default=100_000, help="state changes of the woken entity")
    p.add_argument("--aborts", type=int, default=50, help="SIGINT rounds per kind of step")
    args = p.parse_args()
    if args.quick:
        args.calls = common.scale(args.calls, True, 20)
        args.changes = common.scale(args.changes, True, 1000)
        args.aborts = common.scale(args.aborts, True, 5)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-steps-") as tmp:
        server = common.start_electric(Path(tmp) / "data")
        try:
            out = anyio.run(measure, server.address, args)
        finally:
            server.stop()
    step, emit = common.summarize(timings["step"]), common.summarize(timings["emit"])
    thread_step = common.summarize(timings["thread_step"])
    snap, full = common.summarize(out["snapshot_ms"]), common.summarize(out["full_ms"])
    wake, plain = common.summarize(out["wake_ms"]), common.summarize(out["plain_wake_ms"])
    in_thread, in_loop = common.summarize(out["abort_thread_ms"]), common.summarize(out["abort_async_ms"])
    rows = [
        common.ratio_row(
            "recorded step vs custom event write, p50", step["p50"], emit["p50"], "ms", "<=", 1.2
        ),
        common.value_row("info: recorded step, p99", step["p99"], emit["p99"], "ms"),
        common.value_row(
            "info: recorded step of a plain function (in a thread) vs async, p50",
            thread_step["p50"],
            step["p50"],
            "ms",
        ),
        common.value_row(
            f"wake rebuild of {args.changes} state changes, with snapshots, p50",
            snap["p50"],
            full["p50"],
            "ms",
            "<=",
            50.0,
        ),
        common.value_row("info: the same as a full replay, p50", full["p50"], None, "ms"),
        common.value_row(
            "info: wake to run completed, that entity vs one without state, p50",
            wake["p50"],
            plain["p50"],
            "ms",
        ),
        common.value_row("info: writing the history (10 changes a step)", out["fill_s"], None, "s"),
        common.value_row(
            "SIGINT → aborted, thread-blocked step vs async step, p50",
            in_thread["p50"],
            in_loop["p50"],
            "ms",
            "<=",
            3.0,
        ),
        common.value_row("info: the same, p99", in_thread["p99"], in_loop["p99"], "ms"),
    ]
    info = {
        "calls": args.calls,
        "rounds": args.rounds,
        "changes": args.changes,
        "events": out["events"],
        "step_ms": step,
        "emit_ms": emit,
        "thread_step_ms": thread_step,
        "rebuild_snapshot_ms": snap,
        "rebuild_full_ms": full,
        "wake_ms": wake,
        "plain_wake_ms": plain,
        "aborts": args.aborts,
        "abort_thread_ms": in_thread,
        "abort_async_ms": in_loop,
    }
    common.report("bench_steps", rows, info, time.perf_counter() - started, args.quick)


if __name__ == "__main__":
    main()
