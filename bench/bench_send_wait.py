"""`send(..., wait="run")` vs a send plus a watch written by hand, in the same run (issue 46).

What send-and-wait costs over what a caller did before it: send the message,
then watch the entity's stream from the message's offset until the run record
of its key says it ended. Both sides use one ``AsyncClient`` in this process,
against one ``electric server`` (fresh data dir, SQLite, synchronous=FULL) and
one real ``electric worker`` hosting a type whose run writes its output and
ends; both send to the same entity, one message at a time, so they differ only
in how the wait is done:

- the figure: ``await client.send(ref, text, wait="run")`` (client/_sends.py:
  the send, then ``watch`` folded by ``_wire.run_outcome.RunFollow``);
- the ceiling: ``await client.send(ref, text)``, then ``async for event in
  client.watch(ref, receipt.offset)`` until the run record of ``receipt.key``
  is ``completed``, ``failed`` or ``aborted``: the loop a caller wrote by hand.

Each round (11 by default, after a warm-up) sends N messages a side in blocks
of 10 rotating between the sides, forward in even blocks and backward in odd
ones (ABBA), so a drift lands on both. The figure is the p50 of call → run's
end seen, per side; the row is the round of the median ratio (wait / by hand),
and every round's ratio is printed. Target: ratio ≤ 1.1 (issue 46).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

APP_MODULE = '''
"""bench_send_wait's entity type (written by bench/bench_send_wait.py)."""

from electric_sdk.runtime import App

app = App("benchsw", code_version="v1")


@app.entity("sw", grace_period="1s", idle_timeout="1h")
async def sw(ctx, message):
    ctx.output.write("ok " + message.text)
'''

SIDES = ("wait", "hand")
BLOCK = 10
TARGET = 1.1
WAIT_S = 60.0
_ENDS = ("completed", "failed", "aborted")


async def by_wait(client: Any, ref: str, text: str) -> str | None:
    result = await client.send(ref, text, wait="run", timeout=WAIT_S)
    if result.status != "completed":
        raise RuntimeError(f"{ref}: run {result.status}: {result.error}")
    return cast(str | None, result.output)


async def by_hand(client: Any, ref: str, text: str) -> str | None:
    receipt = await client.send(ref, text)
    watch = cast(AsyncGenerator[Any, None], client.watch(ref, receipt.offset))
    async with contextlib.aclosing(watch) as events:
        async for event in events:
            value = event.value
            if event.type == "run" and value.get("message_key") == receipt.key and value["status"] in _ENDS:
                if value["status"] != "completed":
                    raise RuntimeError(f"{ref}: run {value['status']}: {value.get('error')}")
                return cast(str | None, value.get("output"))
    raise RuntimeError(f"{ref}: the stream ended before the run did")


CALLS = {"wait": by_wait, "hand": by_hand}


async def block(client: Any, ref: str, side: str, tag: str) -> list[float]:
    call, took = CALLS[side], []
    for i in range(BLOCK):
        text = f"{tag}-{i}"
        t0 = time.perf_counter()
        output = await call(client, ref, text)
        took.append((time.perf_counter() - t0) * 1000)
        if output != f"ok {text}":
            raise RuntimeError(f"{side}: output {output!r}, want 'ok {text}'")
    return took


def _our_cpu(*pids: int) -> float:
    usage = os.times()
    return usage.user + usage.system + sum(common.proc_cpu_seconds(pid) for pid in pids)


async def client_main(server: common.ServerProc, tmp: Path, args: Any) -> dict[str, Any]:
    from electric_sdk import AsyncClient

    out: dict[str, Any] = {side: [] for side in SIDES}
    (tmp / "benchsw_app.py").write_text(APP_MODULE)
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    }
    worker = common.start_worker(server.address, tmp / "worker.log", "benchsw_app:app", env=env)
    try:
        async with AsyncClient(server.address) as client:
            ref = "sw/one"
            await client.spawn(ref)
            await client.wait_for_state(ref, "running", WAIT_S)
            for side in SIDES:  # warm-up
                await block(client, ref, side, f"warm-{side}")
            busy0, t0 = common.system_busy_seconds(), time.perf_counter()
            ours0 = _our_cpu(server.pid, worker.pid)
            for r in range(args.rounds):
                samples: dict[str, list[float]] = {side: [] for side in SIDES}
                for k in range(max(1, args.messages // BLOCK)):
                    for side in SIDES if (k + r) % 2 == 0 else SIDES[::-1]:
                        samples[side] += await block(client, ref, side, f"r{r}-{k}-{side}")
                for side in SIDES:
                    out[side].append(common.summarize(samples[side]))
            elapsed = time.perf_counter() - t0
            other = common.system_busy_seconds() - busy0 - (_our_cpu(server.pid, worker.pid) - ours0)
            out["other_cores"] = max(0.0, other) / elapsed
    finally:
        common.stop_worker(worker)
    return out


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=100, help="messages per side and round")
    p.add_argument("--rounds", type=int, default=11, help="rounds, alternating which side goes first")
    args = p.parse_args()
    if args.quick:
        args.messages = common.scale(args.messages, True, BLOCK)
        args.rounds = min(args.rounds, 3)
    started = time.perf_counter()
    out = common.run_beside_server("bench-send-wait-", lambda server, tmp: client_main(server, tmp, args))
    elapsed = time.perf_counter() - started
    wait_p50 = [s["p50"] for s in out["wait"]]
    hand_p50 = [s["p50"] for s in out["hand"]]
    ratios = [w / h for w, h in zip(wait_p50, hand_p50, strict=True)]
    m = ratios.index(sorted(ratios)[len(ratios) // 2])
    rows = [
        common.ratio_row(
            "send → run's end seen, p50: send(wait='run') vs send + watch by hand",
            wait_p50[m],
            hand_p50[m],
            "ms",
            "<=",
            TARGET,
        ),
        common.value_row("info: the same, p90", out["wait"][m]["p90"], out["hand"][m]["p90"], "ms"),
        common.value_row(
            "info: other CPU on the machine during the rounds", out["other_cores"], None, "cores"
        ),
    ]
    common.report("bench_send_wait", rows, {"args": vars(args), "ratios": ratios, **out}, elapsed, args.quick)
    print(f"  rounds' ratios (wait / by hand): {', '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    main()
