"""A recorded step on PostgreSQL: electric's ``ctx.step`` vs DBOS's ``@DBOS.step``, same database.

Both record a step's result durably in the same PostgreSQL database (a fresh
one on this machine's server; DBOS keeps its tables in its own ``dbos``
schema, electric in its own tables), in the same run, in alternating rounds:

- **DBOS** (PyPI ``dbos``, pinned in pyproject's ``bench`` extra): a library
  in one process (a child of this script); a workflow calls a ``@DBOS.step()``
  that returns a constant, N times; each call is timed inside the workflow
  (``perf_counter`` around it): the step runs, and its output is written to
  ``dbos.operation_outputs`` before the call returns.
- **electric**: ``electric server --database URL`` (its own process) and a
  ``Worker`` in a child process of this script; an entity's run awaits
  ``ctx.step("tool", async_noop)`` N times, each timed inside the run: the
  step runs, and its ``electric.step`` record is written through the lease's
  fenced write (worker → server → PostgreSQL) before the call returns.

Figure: electric's p50 per step, with DBOS's p50 as its ceiling; target
ratio <= 1.0 (issue 22). p99 and the same on SQLite are informational. The
shapes differ: DBOS writes from the process the step runs in, electric's
record crosses a gRPC stream to the server, which fences it by the lease.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import pg_common

WAIT_S = 120.0


def dbos_main(url: str, params: dict[str, Any], out: Any) -> None:
    """In its own process: DBOS launched on ``url``, one workflow of timed steps."""
    try:
        from dbos import DBOS, DBOSConfig

        config: DBOSConfig = {
            "name": "electric_bench_step",
            "system_database_url": url,
            "log_level": "WARNING",
        }
        DBOS(config=config)

        @DBOS.step()
        def tool() -> str:
            return "ok"

        @DBOS.workflow()
        def steps(n: int) -> list[float]:
            spent = []
            for _ in range(n):
                started = time.perf_counter()
                tool()
                spent.append((time.perf_counter() - started) * 1000)
            return spent

        DBOS.launch()
        try:
            spent = DBOS.start_workflow(steps, params["warmup"] + params["steps"]).get_result()
        finally:
            DBOS.destroy()
        out.put({"step_ms": spent[params["warmup"] :]})
    except BaseException as exc:
        out.put({"error": repr(exc)})
        raise


def electric_main(address: str, params: dict[str, Any], out: Any) -> None:
    """In its own process: a Worker whose entity's run times its recorded steps, and its client."""

    async def async_noop() -> str:
        return "ok"

    async def main() -> dict[str, Any]:
        import anyio

        from electric_sdk import AsyncClient
        from electric_sdk.runtime import App, Context, Message, Worker

        spent: list[float] = []
        app = App("bench-dbos-step")

        @app.entity("steps")
        async def steps(ctx: Context, message: Message) -> None:
            for _ in range(int(message.text)):
                started = time.perf_counter()
                await ctx.step("tool", async_noop)
                spent.append((time.perf_counter() - started) * 1000)

        worker = Worker(app, address)
        ref = f"steps/{os.getpid()}"  # each round's own entity: the database outlives the round
        async with anyio.create_task_group() as tg, AsyncClient(address) as client:
            with anyio.fail_after(60):
                await tg.start(worker.run)
            await client.spawn(ref)
            receipt = await client.send(ref, str(params["warmup"] + params["steps"]))
            with anyio.fail_after(WAIT_S):
                async for event in client.watch(ref, receipt.offset):
                    if event.type == "run" and event.value["status"] in ("completed", "failed", "aborted"):
                        assert event.value["status"] == "completed", event.value
                        break
            await worker.shutdown(1.0)
        return {"step_ms": spent[params["warmup"] :]}

    try:
        out.put(asyncio.run(main()))
    except BaseException as exc:
        out.put({"error": repr(exc)})
        raise


def electric_round(url: str | None, tmp: Path, params: dict[str, Any]) -> list[float]:
    """One round against an electric server on PostgreSQL (``url``), or on SQLite (None)."""
    with common.start_electric(tmp / "electric", *(["--database", url] if url else [])) as server:
        got = common.run_in_process(electric_main, server.address, params, timeout=WAIT_S, name="electric")
    return list(got["step_ms"])


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000, help="steps per side and round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    pg_common.need_dbos("bench_dbos_step")
    rounds = 1 if args.quick else args.rounds
    params = {"warmup": 50, "steps": common.scale(args.steps, args.quick, 100) // rounds}
    t_start = time.perf_counter()
    got: dict[str, list[float]] = {"electric": [], "dbos": [], "electric_lite": []}
    with pg_common.fresh_database("electric_bench_dbos_step") as url:
        for _ in range(rounds):  # alternating: background load lands on both sides alike
            got["dbos"] += common.run_in_process(dbos_main, url, params, timeout=WAIT_S, name="DBOS")[
                "step_ms"
            ]
            with tempfile.TemporaryDirectory(prefix="electric-bench-dbos-step-") as tmp:
                got["electric"] += electric_round(url, Path(tmp), params)
            with tempfile.TemporaryDirectory(prefix="electric-bench-dbos-step-") as tmp:
                got["electric_lite"] += electric_round(None, Path(tmp), params)
    s = {k: common.summarize(v) for k, v in got.items()}
    rows = [
        common.ratio_row(
            "electric ctx.step vs DBOS @step on PostgreSQL, p50 per step",
            s["electric"]["p50"],
            s["dbos"]["p50"],
            "ms",
            "<=",
            1.0,
        ),
        common.value_row("info: the same, p99", s["electric"]["p99"], s["dbos"]["p99"], "ms"),
        common.value_row(
            "info: electric on SQLite (its default) vs DBOS on PostgreSQL, p50",
            s["electric_lite"]["p50"],
            s["dbos"]["p50"],
            "ms",
        ),
    ]
    info = {"dbos_version": version("dbos"), "params": params, "rounds": rounds, "summary": s}
    info["postgres"] = asyncio.run(pg_common.settings())
    common.report("bench_dbos_step", rows, info, time.perf_counter() - t_start, args.quick)


if __name__ == "__main__":
    main()
