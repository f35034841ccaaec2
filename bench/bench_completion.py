"""Shell completion of entity refs: how long one Tab press waits for the server, or for none.

Server: ``electric server`` (fresh data dir) in its own OS process, with 100 entities of one
type. The client side runs here, as `electric`'s completer does (one process per Tab press,
so every call opens a fresh channel).

Figure 1 — ``completion.complete_refs("bench/")`` against the server: p50 and max over the
rounds. Ceiling: the raw stub's ``ListEntities`` (the same type filter and limit) on a fresh
grpc.aio channel, opened and closed per call like the completer's. Target: max within the
completer's deadline (300 ms); the ratio shows what the SDK adds.

Figure 2 — the same completer where no server listens (a loopback port with no listener):
p50 and max. Ceiling: the raw stub's call to that port on a fresh channel (it fails at
once). Target: max within the deadline; nothing is offered.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from electric_sdk import Client
from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk.cli import completion

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_args, free_port, report, scale, start_electric, value_row

ENTITIES = 100


async def _raw_list(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        try:
            response = await stub.ListEntities(
                api.ListEntitiesRequest(type="bench", page_size=completion.REF_LIMIT),
                timeout=completion.REF_DEADLINE_S,
            )
        except grpc.aio.AioRpcError:
            return 0
        return len(response.entities)


def _time_ms(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    args = bench_args((__doc__ or "").splitlines()[0]).parse_args()
    rounds = scale(200, args.quick, minimum=20)
    begun = time.perf_counter()
    dead = f"127.0.0.1:{free_port()}"  # nothing listens: the port was free a moment ago
    with tempfile.TemporaryDirectory() as tmp, start_electric(Path(tmp) / "data") as server:
        with Client(server.address) as client:
            for n in range(ENTITIES):
                client.spawn(f"bench/e{n:03d}")
        live_ns = argparse.Namespace(address=server.address)
        dead_ns = argparse.Namespace(address=dead)
        offered = completion.complete_refs("bench/", live_ns)
        assert len(offered) == ENTITIES, len(offered)
        assert completion.complete_refs("bench/", dead_ns) == []
        times: dict[str, list[float]] = {"live": [], "live_raw": [], "dead": [], "dead_raw": []}
        for _ in range(rounds):  # alternated, so drift lands on all four
            times["live"].append(_time_ms(lambda: completion.complete_refs("bench/", live_ns)))
            times["live_raw"].append(_time_ms(lambda: asyncio.run(_raw_list(server.address))))
            times["dead"].append(_time_ms(lambda: completion.complete_refs("bench/", dead_ns)))
            times["dead_raw"].append(_time_ms(lambda: asyncio.run(_raw_list(dead))))
    deadline_ms = completion.REF_DEADLINE_S * 1000
    p50 = {k: statistics.median(v) for k, v in times.items()}
    worst = {k: max(v) for k, v in times.items()}
    rows = [
        value_row("refs from a server, p50", p50["live"], p50["live_raw"], "ms"),
        value_row("refs from a server, max", worst["live"], worst["live_raw"], "ms", "<=", deadline_ms),
        value_row("no server, p50", p50["dead"], p50["dead_raw"], "ms"),
        value_row("no server, max", worst["dead"], worst["dead_raw"], "ms", "<=", deadline_ms),
    ]
    info = {"rounds": rounds, "entities": ENTITIES, "p50_ms": p50, "max_ms": worst}
    report("bench_completion", rows, info, time.perf_counter() - begun, args.quick)


if __name__ == "__main__":
    main()
