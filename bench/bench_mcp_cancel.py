"""SIGINT → the MCP server sees the cancel, beside SIGINT → `unwound`, in the same run (issue 48).

One ``electric server`` (fresh data dir, SQLite) and one real ``electric worker`` hosting a type
whose run calls the slow tool of a real MCP server written with the official SDK
(tests/runtime/mcp_server_app.py, stdio: a subprocess of the worker). Each sample: send a
message, wait until the server reports the call started, then stamp ``time.time_ns()`` and send
``interrupt(ref, wait="unwound")``:

- the figure: the server's own ``time.time_ns()`` when its tool saw the cancel (it reports it
  over loopback), minus the stamp;
- the ceiling: the answer's return (the run's aborted end record seen), minus the stamp.

Both come from the same signal, so no drift separates them; samples alternate between two
entities (each its own session and server process), so neither is always the warm one. The
row is the round of the median ratio (p50 cancel seen / p50 unwound); every round's ratio is
printed. Target: ratio ≤ 1.2 (issue 48).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

sys.path.insert(0, str(common.REPO / "tests" / "runtime"))
import mcp_support

APP_MODULE = '''
"""bench_mcp_cancel's entity type (written by bench/bench_mcp_cancel.py)."""

import os

from electric_sdk.runtime import App

app = App("benchmcp", code_version="v1")
tools = app.mcp_server("tools", command=os.environ["BENCH_MCP_COMMAND"].split("\\x1f"))


@app.entity("mc", grace_period="5s", idle_timeout="1h")
async def mc(ctx, message):
    await ctx.call_tool(tools, "slow", {"tag": message.text}, timeout="1h")
'''

TARGET = 1.2
WAIT_S = 60.0
REFS = ("mc/a", "mc/b")


async def sample(client: Any, found: mcp_support.Sightings, ref: str, tag: str) -> tuple[float, float]:
    """(ms to the server's cancel sighting, ms to unwound), both from the signal's send."""
    await client.send(ref, tag)
    await found.wait(tag, "started")
    t0 = time.time_ns()
    result = await client.interrupt(ref, wait="unwound", timeout=WAIT_S)
    unwound = time.time_ns()
    if not result.reached("unwound"):
        raise RuntimeError(f"{ref}: not unwound: {result.stages}")
    seen = await found.wait(tag, "cancelled")
    return (seen - t0) / 1e6, (unwound - t0) / 1e6


async def client_main(server: common.ServerProc, tmp: Path, args: Any) -> dict[str, Any]:
    from electric_sdk import AsyncClient

    out: dict[str, Any] = {"cancel": [], "unwound": []}
    (tmp / "benchmcp_app.py").write_text(APP_MODULE)
    async with mcp_support.sightings() as found:
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "BENCH_MCP_COMMAND": "\x1f".join(mcp_support.stdio_command(found)),
        }
        worker = common.start_worker(server.address, tmp / "worker.log", "benchmcp_app:app", env=env)
        try:
            async with AsyncClient(server.address) as client:
                for ref in REFS:
                    await client.spawn(ref)
                    await client.wait_for_state(ref, "running", WAIT_S)
                    await sample(client, found, ref, f"warm-{ref[-1]}")  # opens its session
                for r in range(args.rounds):
                    cancel: list[float] = []
                    unwound: list[float] = []
                    for i in range(args.samples):
                        ref = REFS[(i + r) % 2]
                        c, u = await sample(client, found, ref, f"r{r}-{i}")
                        cancel.append(c)
                        unwound.append(u)
                    out["cancel"].append(common.summarize(cancel))
                    out["unwound"].append(common.summarize(unwound))
        finally:
            common.stop_worker(worker)
    return out


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=40, help="signals per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds")
    args = p.parse_args()
    if args.quick:
        args.samples = common.scale(args.samples, True, 4)
        args.rounds = min(args.rounds, 3)
    started = time.perf_counter()
    out = common.run_beside_server("bench-mcp-cancel-", lambda server, tmp: client_main(server, tmp, args))
    elapsed = time.perf_counter() - started
    cancel_p50 = [s["p50"] for s in out["cancel"]]
    unwound_p50 = [s["p50"] for s in out["unwound"]]
    ratios = [c / u for c, u in zip(cancel_p50, unwound_p50, strict=True)]
    m = ratios.index(sorted(ratios)[len(ratios) // 2])
    rows = [
        common.ratio_row(
            "SIGINT → MCP server sees the cancel, p50, vs SIGINT → unwound",
            cancel_p50[m],
            unwound_p50[m],
            "ms",
            "<=",
            TARGET,
        ),
        common.value_row("info: the same, p90", out["cancel"][m]["p90"], out["unwound"][m]["p90"], "ms"),
    ]
    common.report(
        "bench_mcp_cancel", rows, {"args": vars(args), "ratios": ratios, **out}, elapsed, args.quick
    )
    print(f"  rounds' ratios (cancel seen / unwound): {', '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    main()
