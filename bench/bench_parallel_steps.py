"""Parallel recorded steps: a step's cost when started side by side beside the same step in sequence.

Two processes: ``electric server`` (fresh data dir, SQLite WAL,
synchronous=FULL) and this script, which runs a Worker on its own loop.

One run alternates rounds of two shapes, each a batch of K (3, the tool calls
a model emits at once) recorded steps of ``async_noop``, each step one
``electric.step`` record through the lease's fenced write:

- **parallel** (the figure): ``ctx.gather`` of the K steps, all named
  ``tool``, each known by its place in the call (a group of its own);
- **sequential** (the ceiling): the same K steps awaited one after another.

Per batch, its time divided by K: the cost per step. Figure: the parallel
p50 per step; ceiling: the sequential p50 per step, in the same run; target
ratio <= 1.1 (the group's bookkeeping, the tasks, and the records' writes
must cost no more per step than running them in turn). Info: p99 of both,
and the same with K = 8.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from electric_sdk import AsyncClient
from electric_sdk.runtime import App, Context, Message, Worker

timings: dict[str, list[float]] = {}


async def async_noop() -> str:
    return "ok"


def build_app(batches: int, rounds: int, widths: tuple[int, ...]) -> App:
    app = App("bench-parallel-steps")

    @app.entity("steps")
    async def steps(ctx: Context, message: Message) -> None:
        for _ in range(rounds):  # alternating rounds: background load lands on both sides alike
            for width in widths:
                for shape in ("parallel", "sequential"):
                    spent = timings.setdefault(f"{shape}_{width}", [])
                    for _ in range(batches):
                        started = time.perf_counter()
                        if shape == "parallel":
                            await ctx.gather(*(ctx.step("tool", async_noop) for _ in range(width)))
                        else:
                            for _ in range(width):
                                await ctx.step("tool", async_noop)
                        spent.append((time.perf_counter() - started) * 1000 / width)

    return app


async def measure(address: str, args: Any) -> None:
    worker = Worker(build_app(args.batches, args.rounds, (3, 8)), address)
    async with anyio.create_task_group() as tg, AsyncClient(address) as client:
        with anyio.fail_after(30):
            await tg.start(worker.run)
        await client.spawn("steps/s1")
        receipt = await client.send("steps/s1", "go")
        with anyio.fail_after(1800):
            async for event in client.watch("steps/s1", receipt.offset):
                if event.type == "run" and event.value["status"] in ("completed", "failed", "aborted"):
                    assert event.value["status"] == "completed", event.value
                    break
        await worker.shutdown(1.0)


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=200, help="batches of each shape per round")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    if args.quick:
        args.batches = common.scale(args.batches, True, 10)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-parallel-steps-") as tmp:
        server = common.start_electric(Path(tmp) / "data")
        try:
            anyio.run(measure, server.address, args)
        finally:
            server.stop()
    s = {name: common.summarize(values) for name, values in timings.items()}
    rows = [
        common.ratio_row(
            "parallel step (3 side by side) vs sequential, p50 per step",
            s["parallel_3"]["p50"],
            s["sequential_3"]["p50"],
            "ms",
            "<=",
            1.1,
        ),
        common.value_row(
            "info: the same, p99 per step", s["parallel_3"]["p99"], s["sequential_3"]["p99"], "ms"
        ),
        common.value_row(
            "info: 8 side by side vs sequential, p50 per step",
            s["parallel_8"]["p50"],
            s["sequential_8"]["p50"],
            "ms",
        ),
    ]
    info = {"batches": args.batches, "rounds": args.rounds} | {f"{k}_ms": v for k, v in s.items()}
    common.report("bench_parallel_steps", rows, info, time.perf_counter() - started, args.quick)


if __name__ == "__main__":
    main()
