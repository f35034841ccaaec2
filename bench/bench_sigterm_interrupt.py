"""SIGTERM that interrupts (``sigterm_interrupts=True``) → cleanup started, vs SIGUSR → on_signal.

Three processes: ``electric server`` (fresh data dir), ``electric worker
benchterm_app:app`` (the app module below, written to a temp dir on
PYTHONPATH) and this script as the client. One machine, one wall clock.

Both sides start the same way: a fresh entity gets a message whose run enters
a recorded step that never returns (a long model call); the step's first line
emits ``in_step``, and once the client has seen it the client takes
``time.time_ns()`` and signals. The handler's first line takes
``time.time_ns()`` and emits it. Latency = handler called − send.

- Figure: ``cut`` (``app.entity(..., sigterm_interrupts=True)``) gets SIGTERM;
  the step is cut at once, the run recorded ABORTED, the SIGTERM's outcome
  written, then ``on_signal(SIGTERM)`` (the cleanup) starts.
- Ceiling: ``usr`` gets SIGUSR; ``on_signal(SIGUSR)`` runs beside the step.

Rounds alternate the sides sample by sample (ABBA within a round, BAAB in the
next), so background load lands on both alike; the row is the ratio of the
p50s over all rounds, and every round's own ratio is printed.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

APP_MODULE = '''
"""bench_sigterm_interrupt's entity types (written by bench/bench_sigterm_interrupt.py)."""

import time

import anyio

from electric_sdk.runtime import App

app = App("benchterm")


async def model_call(ctx):
    await ctx.emit("in_step", None)
    await anyio.sleep(86400)  # the long call: the signal comes while it runs
    return "answer"


async def turn(ctx, message):
    ctx.output.write("thinking")
    await ctx.step("model:answer", model_call, ctx)


@app.entity("cut", grace_period="30s", idle_timeout="1h", sigterm_interrupts=True)
class Cut:
    async def on_message(self, ctx, message):
        await turn(ctx, message)

    async def on_signal(self, ctx, signal):
        called = time.time_ns()
        if signal.signal.value == "SIGTERM":
            await ctx.emit("handler", {"t": str(called), "partial": signal.partial_output})


@app.entity("usr", grace_period="30s", idle_timeout="1h")
class Usr:
    async def on_message(self, ctx, message):
        await turn(ctx, message)

    async def on_signal(self, ctx, signal):
        called = time.time_ns()
        if signal.signal.value == "SIGUSR":
            await ctx.emit("handler", {"t": str(called), "partial": None})
'''

WAIT_S = 20.0


async def client(address: str, args: Any) -> dict[str, Any]:
    from electric_sdk.client import AsyncClient

    c = AsyncClient(address)
    serial = 0

    async def one(side: str) -> float:
        """One sample: a fresh entity in its long step, signalled; ms until its handler ran."""
        nonlocal serial
        serial += 1
        ref = f"{side}/e{serial}"
        await c.spawn(ref)
        await c.send(ref, "go")
        events = c.watch(ref, 0).__aiter__()

        async def next_of(kind: str) -> Any:
            while True:
                event = await events.__anext__()
                if event.type == kind:
                    return event

        async def ended() -> None:
            while True:
                event = await next_of("state")
                if event.value["state"] in ("stopped", "killed"):
                    return

        await asyncio.wait_for(next_of("in_step"), WAIT_S)
        sent = time.time_ns()
        if side == "cut":
            await c.terminate(ref, reason="bench")
        else:
            await c.signal(ref, "SIGUSR", reason="bench")
        handler = await asyncio.wait_for(next_of("handler"), WAIT_S)
        if side == "cut" and handler.value["data"]["partial"] != "thinking":
            raise AssertionError(f"{ref}: the cleanup got {handler.value['data']['partial']!r}")
        # Each sample leaves the worker as it found it: the SIGUSR side's entity (still in its
        # step) is killed, the SIGTERM side's has stopped; so neither side's hosts pile up.
        if side == "usr":
            await c.kill(ref, reason="bench")
        await asyncio.wait_for(ended(), WAIT_S)
        await events.aclose()
        return (int(handler.value["data"]["t"]) - sent) / 1e6

    for side in ("cut", "usr", "usr", "cut"):  # warm-up, both sides
        await one(side)
    samples: dict[str, list[float]] = {"cut": [], "usr": []}
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        order = ("cut", "usr", "usr", "cut") if r % 2 == 0 else ("usr", "cut", "cut", "usr")
        got: dict[str, list[float]] = {"cut": [], "usr": []}
        for i in range(args.samples):
            side = order[i % 4]
            got[side].append(await one(side))
            # The same number a side: the ABBA block is finished with the other side's turn.
        while len(got["cut"]) != len(got["usr"]):
            side = "cut" if len(got["cut"]) < len(got["usr"]) else "usr"
            got[side].append(await one(side))
        for side in samples:
            samples[side] += got[side]
        rounds.append({side: statistics.median(v) for side, v in got.items()})
    await c.close()
    return {"cut_ms": samples["cut"], "usr_ms": samples["usr"], "rounds": rounds}


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=60, help="samples a round (half a side)")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    if args.quick:
        args.samples = common.scale(args.samples, True, 4)
        args.rounds = 2
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-sigterm-") as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "benchterm_app.py").write_text(APP_MODULE)
        server = common.start_electric(tmpdir / "data")
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join([str(tmpdir), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        }
        worker_log = tmpdir / "worker.log"
        worker = common.start_worker(server.address, worker_log, "benchterm_app:app", env=env)
        try:
            out = asyncio.run(client(server.address, args))
        except BaseException:
            print(worker_log.read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            common.stop_worker(worker, 5)
            server.stop()
    elapsed = time.perf_counter() - started

    cut = common.summarize(out["cut_ms"])
    usr = common.summarize(out["usr_ms"])
    rows = [
        common.ratio_row(
            "SIGTERM (sigterm_interrupts) → cleanup started, p50", cut["p50"], usr["p50"], "ms", "<=", 1.2
        ),
        common.value_row(
            "info: SIGTERM (sigterm_interrupts) → cleanup started, p99", cut["p99"], usr["p99"], "ms"
        ),
        common.value_row("info: SIGUSR → on_signal (the ceiling), p50", usr["p50"], None, "ms"),
    ]
    info = {"args": vars(args), "cut_ms": cut, "usr_ms": usr, "rounds": out["rounds"]}
    common.report("bench_sigterm_interrupt", rows, info, elapsed, args.quick)
    ratios = ", ".join(f"{r['cut'] / r['usr']:.2f}" for r in out["rounds"])
    print(f"  SIGTERM n={cut['n']} SIGUSR n={usr['n']}; each round's p50 ratio: {ratios}")


if __name__ == "__main__":
    main()
