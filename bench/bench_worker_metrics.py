"""What a worker's own metrics (`electric worker --metrics`) cost: worker CPU per run, on vs off.

One ``electric server`` process (fresh data dir) and, in alternating rounds, an
``electric worker benchwm_app:app`` process with ``--metrics 127.0.0.1:0`` and
one without (the ceiling: the same worker doing the same work uncounted). Each
round spawns fresh entities and sends each of them messages, one at a time,
whose runs take one step and return; every third message is followed by a
SIGUSR its ``on_sigusr`` handles. The worker's CPU seconds (/proc) from the
first send to the last run's COMPLETED seen on the client's watches, divided
by the runs, is the figure. With metrics on, the scrape at the end of the
round must count every run (a check, not a figure), and its time is printed.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from prometheus_client.parser import text_string_to_metric_families

from electric_sdk import AsyncClient
from electric_sdk._proto.electric.v1 import types_pb2 as pb

APP_MODULE = '''
"""bench_worker_metrics's entity type (written by bench/bench_worker_metrics.py)."""

from electric_sdk.runtime import App

app = App("benchwm")


@app.entity("wm", idle_timeout="10m")
class Counted:
    async def on_message(self, ctx, message):
        async with ctx.step("work"):
            ctx.output.write(message.text)
        return message.text

    async def on_sigusr(self, ctx, signal):
        return None
'''

# The figure's target: counting may cost at most this much more worker CPU per run.
MAX_RATIO = 1.05


async def drive(address: str, prefix: str, entities: int, messages: int) -> None:
    """Each entity gets ``messages`` messages one at a time (the next once the run COMPLETED)."""
    async with AsyncClient(address) as client:

        async def one(i: int) -> None:
            ref = f"wm/{prefix}-{i}"
            await client.spawn(ref)
            offset = 0
            for n in range(messages):
                sent = await client.send(ref, f"m{n}")
                async for event in client.watch(ref, max(offset, sent.offset)):
                    offset = event.offset + 1
                    run = event.raw.run if event.type == "run" else None
                    if (
                        run is not None
                        and run.message_key == sent.key
                        and run.status == pb.RUN_STATUS_COMPLETED
                    ):
                        break
                if n % 3 == 2:
                    await client.signal(ref, "SIGUSR", payload={"n": n})

        await asyncio.gather(*(one(i) for i in range(entities)))


def scrape(url: str) -> tuple[float, float]:
    """(runs ended as the scrape counts them, seconds the scrape took)."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    took = time.perf_counter() - started
    ended = sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "electric_worker_runs_ended_total"
    )
    return ended, took


def one_round(
    address: str, tmpdir: Path, env: dict[str, str], metrics: bool, prefix: str, args: Any
) -> dict[str, float]:
    log = tmpdir / f"{prefix}.log"
    extra = ["--metrics", "127.0.0.1:0"] if metrics else []
    worker = common.start_worker(address, log, "benchwm_app:app", *extra, env=env)
    try:
        url = None
        deadline = time.monotonic() + 60
        while "connecting to" not in log.read_text():  # the banner: the worker has started
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.05)
        for line in log.read_text().splitlines():
            if line.startswith("electric worker metrics on "):
                url = line.rsplit(" ", 1)[1]
        cpu_before = common.proc_cpu_seconds(worker.pid)
        busy_before = common.system_busy_seconds()
        started = time.perf_counter()
        asyncio.run(drive(address, prefix, args.entities, args.messages))
        wall = time.perf_counter() - started
        cpu = common.proc_cpu_seconds(worker.pid) - cpu_before
        busy = common.system_busy_seconds() - busy_before
        out = {"cpu_ms_per_run": 1000 * cpu / (args.entities * args.messages), "wall_s": wall, "busy_s": busy}
        if metrics:
            assert url is not None, "no metrics address in the worker's banner"
            ended, took = scrape(url)
            if ended != args.entities * args.messages:
                raise RuntimeError(
                    f"the scrape counted {ended} runs ended, not {args.entities * args.messages}"
                )
            out["scrape_ms"] = 1000 * took
        return out
    finally:
        common.stop_worker(worker, 5)


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--entities", type=int, default=50)
    p.add_argument("--messages", type=int, default=80, help="messages per entity and round")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    if args.quick:
        args.entities = common.scale(args.entities, True, 5)
        args.messages = common.scale(args.messages, True, 6)
    started = time.perf_counter()
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="bench-worker-metrics-") as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "benchwm_app.py").write_text(APP_MODULE)
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join([str(tmpdir), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        }
        server = common.start_electric(tmpdir / "data")
        try:
            for r in range(args.rounds):
                # Alternate which goes first, so background load lands on both alike.
                for metrics in (r % 2 == 0, r % 2 == 1):
                    prefix = f"{'on' if metrics else 'off'}{r}"
                    results[metrics].append(one_round(server.address, tmpdir, env, metrics, prefix, args))
        finally:
            server.stop()
    elapsed = time.perf_counter() - started

    def median(metrics: bool, key: str) -> float:
        return statistics.median(r[key] for r in results[metrics])

    def least(metrics: bool, key: str) -> float:
        return min(r[key] for r in results[metrics])

    runs = args.entities * args.messages
    cpu_on, cpu_off = least(True, "cpu_ms_per_run"), least(False, "cpu_ms_per_run")
    rows = [
        # The least of the rounds: a busy machine (other processes' cache and CPU) only ever adds
        # to a process's CPU time, so the least disturbed round of each is the fairest pair.
        common.ratio_row("worker CPU per run, metrics on (vs off)", cpu_on, cpu_off, "ms", "<=", MAX_RATIO),
        common.value_row(
            "info: worker CPU per run, median of rounds",
            median(True, "cpu_ms_per_run"),
            median(False, "cpu_ms_per_run"),
            "ms",
        ),
        common.value_row(
            "info: wall time per round, metrics on", median(True, "wall_s"), median(False, "wall_s"), "s"
        ),
        common.value_row(f"info: scrape after {runs:,} runs", median(True, "scrape_ms"), None, "ms"),
        common.value_row(
            "info: machine busy per round, metrics on", median(True, "busy_s"), median(False, "busy_s"), "s"
        ),
    ]
    common.report("bench_worker_metrics", rows, {"args": vars(args), "rounds": results}, elapsed, args.quick)


if __name__ == "__main__":
    main()
