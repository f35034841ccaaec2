"""Store appends on PostgreSQL (PostgresStore group commit) vs raw asyncpg replaying its batches.

In-process, no gRPC, on a fresh database. A PostgresStore with its default
pool of 4 connections; 256 asyncio tasks, each on its own entity, append
1-event mutations with ``store.write`` (the decide function returns a
pre-serialized SIGUSR `signal` event body, so this measures the store, not
protobuf). The size of every batch the store commits is recorded by a batch
listener on its ``Hub``, a lone write committed without a batch's transaction
(one or two round trips) as a batch of one.

Ceiling: plain asyncpg on the same database, with the same number of
connections (4) each running batches of exactly the sizes the store
achieved, in the same order: per batch one transaction drawing its txids
from the sequence, inserting the events (``executemany``) and updating the
entities' head offset, time and txid (``executemany``), ``synchronous_commit=on``,
into the store's own tables (the same rows, the same indexes: a txid change
updates ``entities_by_txid``, so no update is HOT on either side).
It skips what only the store does: locking the rows before deciding
(``SELECT … FOR UPDATE``), reading the idempotency keys, running the decide
functions and building the records. Both report events/s; store and raw
alternate for ``--rounds`` rounds and the medians are reported.
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
from bench_store import APPENDERS, SIGNAL_BODY, _refs, append_load, collector
from electric_server.store.postgres import PostgresStore
from electric_server.store.postgres.statements import INSERT_EVENTS, NEXT_TXIDS

POOL = 4  # the store's default --database-pool, and the ceiling's connections
RUN_TIMEOUT_S = 180.0  # the raw ceiling's; the store's load has bench_store's


async def store_run(url: str, total: int) -> dict[str, Any]:
    store = PostgresStore(url, pool_size=POOL)
    await store.open()
    sizes: list[int] = []
    # Every batch the store acknowledges, a lone write committed without a batch's transaction
    # (one or two round trips) as a batch of one, which the ceiling replays as such.
    store.hub.subscribe_batches(lambda commits, writes, seconds: sizes.append(writes))
    return await append_load(store, sizes, total, shared=False, warmup=10)


async def raw_run(url: str, sizes: list[int]) -> dict[str, Any]:
    """The same rows, batch by batch, on ``POOL`` connections (see the module docstring)."""
    import asyncpg

    conns = [await asyncpg.connect(url, server_settings={"synchronous_commit": "on"}) for _ in range(POOL)]
    refs = _refs(shared=False)
    heads = {r: 0 for r in refs}
    await conns[0].execute("TRUNCATE events")  # the entities stay: the rows the store's run wrote
    queue = list(reversed(sizes))
    k = 0
    deadline = time.monotonic() + RUN_TIMEOUT_S

    async def worker(conn: Any) -> int:
        nonlocal k
        done = 0
        while queue and time.monotonic() < deadline:
            size = queue.pop()
            now = int(time.time() * 1000)
            chosen = [refs[(k + j) % len(refs)] for j in range(size)]
            k += size
            async with conn.transaction():
                txids = [row[0] for row in await conn.fetch(NEXT_TXIDS, size)]
                events, entities = [], []
                for ref, txid in zip(chosen, txids, strict=True):
                    offset = heads[ref] = heads[ref] + 1
                    events.append(
                        (ref[0], ref[1], offset, "signal", f"sig_{txid}", 1, now, txid, SIGNAL_BODY)
                    )
                    entities.append((ref[0], ref[1], offset + 1, now, txid))
                entities.sort()  # rows updated in (type, id) order, as the store locks them: no deadlock
                await conn.executemany(INSERT_EVENTS, events)
                await conn.executemany(
                    "UPDATE entities SET head_offset = $3, updated_at = $4, txid = $5 WHERE type = $1 AND id = $2",
                    entities,
                )
            done += size
        return done

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    done = sum(await asyncio.gather(*(worker(c) for c in conns)))
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    for conn in conns:
        await conn.close()
    return {"events": done, "wall_s": wall, "events_per_s": done / wall, "batches": len(sizes), "cpu_s": cpu}


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="alternating store/raw rounds (median is reported)")
    args = p.parse_args()
    rounds = 1 if args.quick else args.rounds
    t_start = time.perf_counter()
    total = common.scale(40_000, args.quick)
    info: dict[str, Any] = {"appenders": APPENDERS, "total": total, "rounds": rounds, "pool": POOL}
    info["postgres"] = asyncio.run(pg_common.settings())
    stores, raws = [], []
    for r in range(rounds):
        with pg_common.fresh_database(f"electric_bench_pg_store_{r}") as url:
            with collector(server=True):
                st = asyncio.run(store_run(url, total))
            raws.append(asyncio.run(raw_run(url, st["batch_sizes"])))
        sizes = sorted(st.pop("batch_sizes"))
        st["batch_size_p50"] = common.percentile(sizes, 50, presorted=True)
        st["batch_size_max"] = sizes[-1] if sizes else 0
        stores.append(st)
        if st["timed_out"]:
            print("WARNING: a store run hit its time limit", file=sys.stderr)
    info["store"], info["raw"] = stores, raws
    s_rate = common.percentile([x["events_per_s"] for x in stores], 50)
    r_rate = common.percentile([x["events_per_s"] for x in raws], 50)
    n = f" (median of {rounds})" if rounds > 1 else ""
    rows = [
        common.ratio_row(
            f"PostgreSQL store appends, {APPENDERS} appenders, own entity each{n}",
            s_rate,
            r_rate,
            "events/s",
            ">=",
            0.5,
        ),
        common.value_row(
            "  (info) mean batch", common.percentile([x["mean_batch"] for x in stores], 50), None, "writes"
        ),
        common.value_row(
            "  (info) client CPU per event (store vs raw)",
            common.percentile([x["cpu_util"] * x["wall_s"] / x["events"] * 1e6 for x in stores], 50),
            common.percentile([x["cpu_s"] / x["events"] * 1e6 for x in raws], 50),
            "us",
        ),
    ]
    common.report("bench_pg_store", rows, info, time.perf_counter() - t_start, args.quick)
    for s, r in zip(stores, raws, strict=True):
        print(
            f"  store {s['events']} events in {s['wall_s']:.2f} s ({s['events_per_s']:,.0f}/s), {s['batches']} "
            f"batches (mean {s['mean_batch']:.1f}, p50 {s['batch_size_p50']:.0f}, max {s['batch_size_max']}), "
            f"process CPU {s['cpu_util']:.2f} cores; raw {r['events']} events in {r['wall_s']:.2f} s "
            f"({r['events_per_s']:,.0f}/s)"
        )


if __name__ == "__main__":
    main()
