"""The A2A face against electric's own client, in the same run (issue 49, item 1).

One ``electric server --http … --a2a`` (fresh data dir, SQLite) and one real ``electric worker``
hosting a type whose message ``hold`` holds a step open and any other ends at once. The A2A
side is the official Python client (``a2a-sdk``, JSON-RPC over HTTP, SSE streams); the native
side is electric's AsyncClient (gRPC). Samples alternate A2A and native, and two entities, so
neither side is always the warm one.

- send: A2A ``SendStreamingMessage`` → its first streamed event (the task, ``submitted``), vs
  the native ``send`` plus a watch from the message's offset → its first event (the message's
  record). Target: ratio ≤ 1.3.
- cancel: with a run in its held step, A2A ``CancelTask`` → the task answered ``canceled``, vs
  electric's SIGINT through the same HTTP door, ``POST /{type}/{id}/signal?wait=unwound`` → its
  answer. Both wait, server-side, for the run's aborted end record. Target: ratio ≤ 1.2. An
  info row compares it with the SDK's ``interrupt(ref, wait="unwound")`` over gRPC too (gRPC's
  own round trip is the cheaper transport, not A2A's to match).
- cancel over gRPC: the same A2A ``CancelTask`` through A2A's gRPC binding (the official client's
  gRPC transport, on the server's gRPC port), vs the SDK's ``interrupt(ref, wait="unwound")``
  over gRPC: each door against electric's own on that door. Target: ratio ≤ 1.2.

Each row is the round of the median ratio (p50 / p50); every round's ratio is printed.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from contextlib import aclosing
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

APP_MODULE = '''
"""bench_a2a's entity type (written by bench/bench_a2a.py)."""

import anyio

from electric_sdk.runtime import App

app = App("bencha2a", code_version="v1")


@app.entity("ab", grace_period="5s", idle_timeout="1h")
async def ab(ctx, message):
    if message.text.startswith("hold"):
        await ctx.emit("in_step", message.text)
        await ctx.step("model", anyio.sleep, 3600)
    ctx.output.write("done")
'''

SEND_TARGET = 1.3
CANCEL_TARGET = 1.2
WAIT_S = 60.0
IDS = ("a", "b")
AGENT = "/_electric/a2a/types/ab"


def _message(text: str, context_id: str, immediately: bool = False) -> Any:
    from a2a.types import a2a_pb2 as a2a

    message = a2a.Message(
        message_id=uuid.uuid4().hex, role=a2a.ROLE_USER, parts=[a2a.Part(text=text)], context_id=context_id
    )
    request = a2a.SendMessageRequest(message=message)
    request.configuration.return_immediately = immediately
    return request


async def a2a_send(streaming: Any, entity: str) -> float:
    t0 = time.perf_counter_ns()
    stream = streaming.send_message(_message("quick", entity))
    try:
        first = await anext(stream)
    finally:
        await stream.aclose()
    elapsed = (time.perf_counter_ns() - t0) / 1e6
    if not first.HasField("task"):
        raise RuntimeError(f"the first event is no task: {first}")
    return elapsed


async def native_send(client: Any, entity: str) -> float:
    ref = f"ab/{entity}"
    t0 = time.perf_counter_ns()
    receipt = await client.send(ref, "quick")
    async with aclosing(client.watch(ref, receipt.offset)) as watch:
        event = await anext(watch)
    elapsed = (time.perf_counter_ns() - t0) / 1e6
    if event.key != receipt.key:
        raise RuntimeError(f"the first event is not the message's: {event}")
    return elapsed


async def _in_step(client: Any, ref: str, offset: int, tag: str) -> None:
    async with aclosing(client.watch(ref, offset)) as watch:
        async for event in watch:
            if event.type == "in_step" and event.value["data"] == tag:
                return


async def a2a_cancel(polling: Any, client: Any, entity: str, tag: str) -> float:
    from a2a.types import a2a_pb2 as a2a

    (sent,) = [r async for r in polling.send_message(_message(tag, entity, immediately=True))]
    offset = int(sent.task.id.rpartition("~")[2])
    await _in_step(client, f"ab/{entity}", offset, tag)
    t0 = time.perf_counter_ns()
    task = await polling.cancel_task(a2a.CancelTaskRequest(id=sent.task.id))
    elapsed = (time.perf_counter_ns() - t0) / 1e6
    if task.status.state != a2a.TASK_STATE_CANCELED:
        raise RuntimeError(f"the canceled task is {task.status}")
    return elapsed


async def native_cancel(client: Any, entity: str, tag: str) -> float:
    ref = f"ab/{entity}"
    receipt = await client.send(ref, tag)
    await _in_step(client, ref, receipt.offset, tag)
    t0 = time.perf_counter_ns()
    result = await client.interrupt(ref, wait="unwound", timeout=WAIT_S)
    elapsed = (time.perf_counter_ns() - t0) / 1e6
    if not result.reached("unwound"):
        raise RuntimeError(f"{ref}: not unwound: {result.stages}")
    return elapsed


async def door_cancel(pool: Any, http: str, client: Any, entity: str, tag: str) -> float:
    """electric's own SIGINT through the same HTTP door, answered once the run is unwound."""
    ref = f"ab/{entity}"
    receipt = await client.send(ref, tag)
    await _in_step(client, ref, receipt.offset, tag)
    t0 = time.perf_counter_ns()
    answer = await pool.post(f"{http}/{ref}/signal?wait=unwound&timeout=60s", json={"signal": "SIGINT"})
    elapsed = (time.perf_counter_ns() - t0) / 1e6
    stages = {s["stage"]: s for s in answer.raise_for_status().json()["stages"]}
    if not stages["unwound"]["reached"]:
        raise RuntimeError(f"{ref}: not unwound: {stages}")
    return elapsed


async def client_main(server: common.ServerProc, http: str, tmp: Path, args: Any) -> dict[str, Any]:
    import grpc
    import httpx
    from a2a.client import ClientConfig, create_client

    from electric_sdk import AsyncClient

    kinds = ("a2a_send", "native_send", "a2a_cancel", "door_cancel", "native_cancel", "grpc_cancel")
    out: dict[str, Any] = {k: [] for k in kinds}
    (tmp / "bencha2a_app.py").write_text(APP_MODULE)
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    }
    worker = common.start_worker(server.address, tmp / "worker.log", "bencha2a_app:app", env=env)
    try:
        async with (
            AsyncClient(server.address) as client,
            httpx.AsyncClient(timeout=WAIT_S) as pool,
        ):
            url = http + AGENT
            streaming = await create_client(
                url, client_config=ClientConfig(streaming=True, httpx_client=pool)
            )
            polling = await create_client(url, client_config=ClientConfig(streaming=False, httpx_client=pool))
            over_grpc = await create_client(
                url,
                client_config=ClientConfig(
                    streaming=False,
                    httpx_client=pool,
                    supported_protocol_bindings=["GRPC"],
                    grpc_channel_factory=grpc.aio.insecure_channel,
                ),
            )
            for entity in IDS:
                await client.spawn(f"ab/{entity}")
                await client.wait_for_state(f"ab/{entity}", "running", WAIT_S)
                await a2a_send(streaming, entity)  # warm both paths
                await native_send(client, entity)
                await a2a_cancel(polling, client, entity, f"hold-warm-a-{entity}")
                await native_cancel(client, entity, f"hold-warm-n-{entity}")
                await door_cancel(pool, http, client, entity, f"hold-warm-d-{entity}")
                await a2a_cancel(over_grpc, client, entity, f"hold-warm-g-{entity}")
            for r in range(args.rounds):
                sends: dict[str, list[float]] = {"a2a": [], "native": []}
                cancels: dict[str, list[float]] = {"a2a": [], "door": [], "native": [], "grpc": []}
                for i in range(args.samples):
                    entity = IDS[(i + r) % 2]
                    first = (i + r) % 2 == 0  # which side goes first this time
                    for side in ("a2a", "native") if first else ("native", "a2a"):
                        if side == "a2a":
                            sends["a2a"].append(await a2a_send(streaming, entity))
                        else:
                            sends["native"].append(await native_send(client, entity))
                    for side in (
                        ("a2a", "door", "native", "grpc") if first else ("grpc", "native", "door", "a2a")
                    ):
                        tag = f"hold-{r}-{i}-{side}"
                        if side == "a2a":
                            cancels["a2a"].append(await a2a_cancel(polling, client, entity, tag))
                        elif side == "grpc":
                            cancels["grpc"].append(await a2a_cancel(over_grpc, client, entity, tag))
                        elif side == "door":
                            cancels["door"].append(await door_cancel(pool, http, client, entity, tag))
                        else:
                            cancels["native"].append(await native_cancel(client, entity, tag))
                out["a2a_send"].append(common.summarize(sends["a2a"]))
                out["native_send"].append(common.summarize(sends["native"]))
                out["a2a_cancel"].append(common.summarize(cancels["a2a"]))
                out["door_cancel"].append(common.summarize(cancels["door"]))
                out["native_cancel"].append(common.summarize(cancels["native"]))
                out["grpc_cancel"].append(common.summarize(cancels["grpc"]))
    finally:
        common.stop_worker(worker)
    return out


def _median_round(out: dict[str, Any], figure: str, ceiling: str) -> tuple[int, list[float]]:
    ratios = [f["p50"] / c["p50"] for f, c in zip(out[figure], out[ceiling], strict=True)]
    return ratios.index(sorted(ratios)[len(ratios) // 2]), ratios


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=30, help="samples of each side per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds")
    args = p.parse_args()
    if args.quick:
        args.samples = common.scale(args.samples, True, 3)
        args.rounds = min(args.rounds, 3)
    started = time.perf_counter()
    http = f"{common.HOST}:{common.free_port()}"
    out = common.run_beside_server(
        "bench-a2a-",
        lambda server, tmp: client_main(server, f"http://{http}", tmp, args),
        "--http",
        http,
        "--a2a",
    )
    elapsed = time.perf_counter() - started
    s, send_ratios = _median_round(out, "a2a_send", "native_send")
    c, cancel_ratios = _median_round(out, "a2a_cancel", "door_cancel")
    g, grpc_ratios = _median_round(out, "grpc_cancel", "native_cancel")
    rows = [
        common.ratio_row(
            "A2A SendStreamingMessage → first event, p50, vs native send + watch",
            out["a2a_send"][s]["p50"],
            out["native_send"][s]["p50"],
            "ms",
            "<=",
            SEND_TARGET,
        ),
        common.value_row(
            "info: the same, p90", out["a2a_send"][s]["p90"], out["native_send"][s]["p90"], "ms"
        ),
        common.ratio_row(
            "A2A CancelTask → canceled task, p50, vs HTTP SIGINT → unwound",
            out["a2a_cancel"][c]["p50"],
            out["door_cancel"][c]["p50"],
            "ms",
            "<=",
            CANCEL_TARGET,
        ),
        common.value_row(
            "info: the same, p90", out["a2a_cancel"][c]["p90"], out["door_cancel"][c]["p90"], "ms"
        ),
        common.value_row(
            "info: A2A CancelTask, p50, vs the SDK's interrupt(wait=unwound) over gRPC",
            out["a2a_cancel"][c]["p50"],
            out["native_cancel"][c]["p50"],
            "ms",
        ),
        common.ratio_row(
            "A2A CancelTask over gRPC → canceled task, p50, vs the SDK's interrupt(wait=unwound)",
            out["grpc_cancel"][g]["p50"],
            out["native_cancel"][g]["p50"],
            "ms",
            "<=",
            CANCEL_TARGET,
        ),
        common.value_row(
            "info: the same, p90", out["grpc_cancel"][g]["p90"], out["native_cancel"][g]["p90"], "ms"
        ),
    ]
    info = {
        "args": vars(args),
        "send_ratios": send_ratios,
        "cancel_ratios": cancel_ratios,
        "grpc_cancel_ratios": grpc_ratios,
        **out,
    }
    common.report("bench_a2a", rows, info, elapsed, args.quick)
    print(f"  rounds' send ratios: {', '.join(f'{r:.2f}' for r in send_ratios)}")
    print(f"  rounds' cancel ratios: {', '.join(f'{r:.2f}' for r in cancel_ratios)}")
    print(f"  rounds' gRPC cancel ratios: {', '.join(f'{r:.2f}' for r in grpc_ratios)}")


if __name__ == "__main__":
    main()
