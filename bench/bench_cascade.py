"""SIGTERM to a root → its 10 children `terminal` (issue 48): within the root's grace + 100 ms.

One ``electric server`` (fresh data dir, SQLite) and one real ``electric worker``
hosting two types whose runs hold a step (so a SIGTERM waits for the grace):
``croot`` (grace 1 s) and ``cchild`` (grace 60 s). Each round spawns a root and
10 children of it, gives each a run in flight, then SIGTERMs the root. A child's
time is from the root's SIGTERM commit to the child's `stopped` record, both
stamped by the server's clock; the cascade cuts each child's 60 s grace to what
remains of the root's, so the children stop with their root.

The figure is the p99 over every child of every round (target: ≤ the root's
grace + 100 ms); the ceiling beside it, measured in the same run, is the root's
own SIGTERM → `stopped` (its grace running out), so the ratio says how far past
their root the children end.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

APP_MODULE = '''
"""bench_cascade's entity types (written by bench/bench_cascade.py)."""

import asyncio

from electric_sdk.runtime import App

app = App("benchcascade", code_version="v1")


async def hold():
    await asyncio.sleep(3600)


@app.entity("croot", grace_period="1s", idle_timeout="1h")
async def croot(ctx, message):
    await ctx.step("hold", hold)


@app.entity("cchild", grace_period="60s", idle_timeout="1h")
async def cchild(ctx, message):
    await ctx.step("hold", hold)
'''

CHILDREN = 10
ROOT_GRACE_MS = 1000.0
TARGET_MS = ROOT_GRACE_MS + 100
WAIT_S = 60.0
ENDED = ("stopped", "killed")


async def ended_at(client: Any, ref: str) -> float:
    """When the entity's terminal record was committed (epoch seconds, the server's clock)."""
    await client.wait_for_state(ref, ENDED, WAIT_S)
    events = (await client.events(ref, 0, limit=200)).events
    [end] = [e for e in events if e.type == "state" and e.state is not None and e.state.value in ENDED]
    return float(end.timestamp.timestamp())


async def one_round(client: Any, r: int) -> tuple[list[float], float]:
    root = f"croot/r{r}"
    kids = [f"cchild/r{r}-{k}" for k in range(CHILDREN)]
    await client.spawn(root)
    for kid in kids:
        await client.spawn(kid, parent=root)
    for ref in [root, *kids]:
        await client.send(ref, "hold")
        await client.wait_for_state(ref, "running", WAIT_S)
    sent = await client.signal(root, "SIGTERM")
    t0 = sent.created_at.timestamp()
    ends = await asyncio.gather(*(ended_at(client, kid) for kid in kids))
    return [(t - t0) * 1000 for t in ends], (await ended_at(client, root) - t0) * 1000


async def client_main(server: common.ServerProc, tmp: Path, args: Any) -> dict[str, Any]:
    from electric_sdk import AsyncClient

    (tmp / "benchcascade_app.py").write_text(APP_MODULE)
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    }
    worker = common.start_worker(server.address, tmp / "worker.log", "benchcascade_app:app", env=env)
    children: list[float] = []
    roots: list[float] = []
    try:
        async with AsyncClient(server.address) as client:
            await one_round(client, -1)  # warm-up
            for r in range(args.rounds):
                kids, root = await one_round(client, r)
                children += kids
                roots.append(root)
    finally:
        common.stop_worker(worker)
    return {"children_ms": children, "roots_ms": roots}


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10, help="trees of a root and 10 children")
    args = p.parse_args()
    if args.quick:
        args.rounds = min(args.rounds, 3)
    started = time.perf_counter()
    out = common.run_beside_server("bench-cascade-", lambda server, tmp: client_main(server, tmp, args))
    elapsed = time.perf_counter() - started
    p99 = common.percentile(out["children_ms"], 99)
    root_p50 = common.percentile(out["roots_ms"], 50)
    rows = [
        common.value_row(
            f"root SIGTERM → {CHILDREN} children stopped, p99 (ceiling: the root's own stop, p50)",
            p99,
            root_p50,
            "ms",
            "<=",
            TARGET_MS,
        ),
        common.value_row(
            "info: the children's p50", common.percentile(out["children_ms"], 50), root_p50, "ms"
        ),
    ]
    common.report("bench_cascade", rows, {"args": vars(args), **out}, elapsed, args.quick)


if __name__ == "__main__":
    main()
