"""A lone write's latency on the PostgreSQL store vs a raw asyncpg commit of the same rows.

In-process, no gRPC, on a fresh database, one write at a time (nothing to
group-commit with): ``PostgresStore.write`` appending one ``signal`` event to
an existing entity (the decide function returns a pre-serialized body), with
the commit feed on (as with several replicas), once without and once with an
idempotency key (the key adds the lookup after the lock and the key's row).

Ceiling: plain asyncpg on the same database and tables, one connection,
``synchronous_commit=on``: per write one transaction inserting the event and
updating the entity's head offset, time and txid (BEGIN, INSERT, UPDATE,
COMMIT): what any store must at least do. Store and raw alternate write by
write, so both see the same machine; p50 and p99 are reported, and the target
is on the store's p50 over the raw one's (a lower ratio is better).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import pg_common
from bench_store import SIGNAL_BODY, _append, _spawn
from electric_server.store.base import Idempotency, Write
from electric_server.store.postgres import PostgresStore
from electric_server.store.postgres.statements import INSERT_EVENTS

WARMUP = 50
RAW_UPDATE = "UPDATE entities SET head_offset = $3, updated_at = $4, txid = $5 WHERE type = $1 AND id = $2"


async def run(url: str, n: int) -> dict[str, list[float]]:
    import asyncpg

    store = PostgresStore(url, pool_size=4)
    await store.open()
    store_ref, raw_ref = ("bench", "store"), ("bench", "raw")
    for ref in (store_ref, raw_ref):
        outcome = await store.write(Write(ref, _spawn(ref)))
        assert outcome.commit is not None
    await store.close()
    store = PostgresStore(url, pool_size=4)  # reopened: its feed reader starts past the spawns
    await store.open()
    raw = await asyncpg.connect(url, server_settings={"synchronous_commit": "on"})
    head = 1_000_000  # the raw entity's offsets: apart from any the store wrote
    times: dict[str, list[float]] = {"store": [], "store_key": [], "raw": []}

    def encode(commit: Any) -> bytes:
        return b"ok"

    try:
        for k in range(WARMUP + n):
            t0 = time.perf_counter()
            await store.write(Write(store_ref, _append))
            t1 = time.perf_counter()
            await store.write(Write(store_ref, _append, Idempotency(f"k{k}", b"h"), encode))
            t2 = time.perf_counter()
            head += 1
            now = int(time.time() * 1000)
            async with raw.transaction():
                await raw.execute(INSERT_EVENTS, *raw_ref, head, "signal", f"s{k}", 1, now, k, SIGNAL_BODY)
                await raw.execute(RAW_UPDATE, *raw_ref, head + 1, now, k)
            t3 = time.perf_counter()
            if k >= WARMUP:
                times["store"].append((t1 - t0) * 1e3)
                times["store_key"].append((t2 - t1) * 1e3)
                times["raw"].append((t3 - t2) * 1e3)
    finally:
        await raw.close()
        await store.close()
    return times


def main() -> None:
    args = common.bench_args(__doc__.splitlines()[0]).parse_args()
    t_start = time.perf_counter()
    n = common.scale(2_000, args.quick, minimum=100)
    info: dict[str, Any] = {"writes": n, "warmup": WARMUP, "postgres": asyncio.run(pg_common.settings())}
    with pg_common.fresh_database("electric_bench_pg_write") as url:
        times = asyncio.run(run(url, n))
    summary = {name: common.summarize(values) for name, values in times.items()}
    info.update(summary)
    raw50, raw99 = summary["raw"]["p50"], summary["raw"]["p99"]
    rows = [
        common.ratio_row(
            "PostgreSQL store lone write p50 (commit feed on)",
            summary["store"]["p50"],
            raw50,
            "ms",
            "<=",
            1.5,
        ),
        common.ratio_row("  lone write p99", summary["store"]["p99"], raw99, "ms", "<=", 2.0),
        common.ratio_row(
            "lone write with an idempotency key p50", summary["store_key"]["p50"], raw50, "ms", "<=", 2.0
        ),
        common.ratio_row("  with a key p99", summary["store_key"]["p99"], raw99, "ms", "<=", 2.5),
    ]
    common.report("bench_pg_write", rows, info, time.perf_counter() - t_start, args.quick)


if __name__ == "__main__":
    main()
