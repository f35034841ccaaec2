"""Store appends (SQLiteStore group commit) vs raw sqlite3 executemany.

In-process, no gRPC. A fresh SQLiteStore (WAL, synchronous=FULL) in a temp
dir; 256 asyncio tasks each append 1-event mutations with ``store.write``
(the decide function returns a pre-serialized SIGUSR `signal` event body, so
this measures the store, not protobuf). Two layouts: every appender on its
own entity (distinct), and all 256 on one entity (shared). The batch size of
every group commit is recorded by a batch listener on the store's ``Hub``
(told the writes of each batch the store acknowledges, lone writes included).

Ceiling: plain sqlite3 on a fresh file with the store's SCHEMA and the same
PRAGMAs (journal_mode=WAL, synchronous=FULL) writing the same rows — per
write one `events` row and one `entities` upsert, per batch one `meta`
update — with ``executemany``, one transaction per batch, replaying exactly
the batch sizes the store achieved. Both report events/s.

The store runs under the garbage-collector settings of the ``electric
server`` process (``electric_server.app.tune_gc``: a young-generation pass
every 5,000 allocations instead of 700, start-up objects frozen), since that
is how the server runs it; the settings are put back after each run. An
informational row repeats the store runs under Python's default settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from electric_server.app import tune_gc
from electric_server.store.base import EntityRecord, Mutation, NewEvent, Write, WriteContext
from electric_server.store.sqlite import SCHEMA, SQLiteStore, now_ms

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import State

APPENDERS = 256
RUN_TIMEOUT_S = 180.0
ENTITY_TYPE = "store"

SIGNAL_BODY = pb.Event(
    signal=pb.SignalValue(
        signal=pb.SIGNAL_SIGUSR,
        sender="anonymous",
        reason="bench",
        outcome=pb.SIGNAL_OUTCOME_IGNORED,
        previous_state=pb.STATE_SPAWNING,
        new_state=pb.STATE_SPAWNING,
    )
).SerializeToString(deterministic=True)
SPAWN_BODY = pb.Event(state=pb.StateValue(state=pb.STATE_SPAWNING, cause="spawn")).SerializeToString(
    deterministic=True
)


def _refs(shared: bool) -> list[tuple[str, str]]:
    return [(ENTITY_TYPE, "shared")] if shared else [(ENTITY_TYPE, f"a{i:04d}") for i in range(APPENDERS)]


def _spawn(ref: tuple[str, str]) -> Any:
    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        record = EntityRecord(
            ref[0], ref[1], State.SPAWNING, 30_000, 60_000, ctx.now_ms, ctx.now_ms, 0, False, None, ctx.txid
        )
        return Mutation([NewEvent("state", f"state_{ctx.txid}", pb.OPERATION_INSERT, SPAWN_BODY)], record)

    return decide


def _append(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
    assert current is not None
    return Mutation([NewEvent("signal", f"sig_{ctx.txid}", pb.OPERATION_INSERT, SIGNAL_BODY)], current)


async def store_run(path: Path, total: int, shared: bool) -> dict[str, Any]:
    store = SQLiteStore(path, synchronous="FULL")
    await store.open()
    sizes: list[int] = []
    store.hub.subscribe_batches(lambda commits, writes, seconds: sizes.append(writes))
    return await append_load(store, sizes, total, shared)


async def append_load(
    store: Any, sizes: list[int], total: int, shared: bool, warmup: int = 20
) -> dict[str, Any]:
    """The appenders' load on an open ``store`` (closed after), whose batches' sizes the caller's
    instrumentation appends to ``sizes``; 1/``warmup`` of it first, not measured."""
    refs = _refs(shared)
    for outcome in await store.write_many([Write(r, _spawn(r)) for r in refs]):
        assert not isinstance(outcome, BaseException), outcome
    per = total // APPENDERS
    deadline = time.monotonic() + RUN_TIMEOUT_S

    async def appender(k: int, n: int) -> int:
        ref = refs[0] if shared else refs[k]
        done = 0
        for _ in range(n):
            if time.monotonic() > deadline:
                break
            await store.write(Write(ref, _append))
            done += 1
        return done

    await asyncio.gather(*(appender(k, max(1, per // warmup)) for k in range(APPENDERS)))
    sizes.clear()
    batches0 = store.batches_committed
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    done = sum(await asyncio.gather(*(appender(k, per) for k in range(APPENDERS))))
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    batches = store.batches_committed - batches0
    await store.close()
    return {
        "events": done,
        "wall_s": wall,
        "events_per_s": done / wall,
        "batches": batches,
        "batch_sizes": sizes,
        "mean_batch": done / max(batches, 1),
        "cpu_util": cpu / wall,
        "timed_out": done < per * APPENDERS,
    }


@contextlib.contextmanager
def collector(server: bool) -> Any:
    """The server process's collector settings (server=True) or Python's defaults, for one run."""
    saved = gc.get_threshold()
    if server:
        tune_gc()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)


def raw_run(path: Path, sizes: list[int], shared: bool) -> dict[str, Any]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.executescript(SCHEMA)
    refs = _refs(shared)
    now = now_ms()
    txid = 1
    conn.execute("BEGIN IMMEDIATE")
    for t, i in refs:
        conn.execute(
            "INSERT INTO events VALUES (?, ?, 0, 'state', ?, 1, ?, ?, ?)",
            (t, i, f"state_{txid}", now, txid, SPAWN_BODY),
        )
        conn.execute(
            f"INSERT INTO entities {common.ENTITY_COLUMNS} VALUES (?, ?, 'spawning', 30000, 60000, ?, ?, 1, 0, NULL, ?)",
            (t, i, now, now, txid),
        )
        txid += 1
    conn.execute("INSERT INTO meta VALUES ('next_txid', ?)", (txid,))
    conn.execute("COMMIT")
    heads = {r: 1 for r in refs}
    k = 0
    deadline = time.monotonic() + RUN_TIMEOUT_S
    done = 0
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    for size in sizes:
        if time.monotonic() > deadline:
            break
        now = now_ms()
        events, entities = [], []
        for _ in range(size):
            ref = refs[k % len(refs)]
            k += 1
            offset = heads[ref]
            heads[ref] = offset + 1
            events.append((ref[0], ref[1], offset, "signal", f"sig_{txid}", 1, now, txid, SIGNAL_BODY))
            entities.append((ref[0], ref[1], "spawning", 30000, 60000, now, now, offset + 1, 0, None, txid))
            txid += 1
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO events (type, id, offset, kind, key, operation, ts, txid, body) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            events,
        )
        conn.executemany(
            f"INSERT OR REPLACE INTO entities {common.ENTITY_COLUMNS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            entities,
        )
        conn.execute(
            "INSERT INTO meta (name, value) VALUES ('next_txid', ?) "
            "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            (txid,),
        )
        conn.execute("COMMIT")
        done += size
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    conn.close()
    return {"events": done, "wall_s": wall, "events_per_s": done / wall, "batches": len(sizes), "cpu_s": cpu}


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="alternating store/raw rounds (median is reported)")
    args = p.parse_args()
    quick = args.quick
    rounds = 1 if quick else args.rounds
    t_start = time.perf_counter()
    total = common.scale(100_000, quick)
    info: dict[str, Any] = {"appenders": APPENDERS, "total": total, "rounds": rounds}
    rows = []
    with tempfile.TemporaryDirectory(prefix="electric-bench-store-") as tmp:
        for layout in ("distinct", "shared"):
            shared = layout == "shared"
            stores, raws, defaults = [], [], []
            for r in range(rounds):  # alternate, so background load hits both alike
                with collector(server=True):
                    st = asyncio.run(store_run(Path(tmp) / f"store-{layout}-{r}.db", total, shared))
                with collector(server=False):
                    dflt = asyncio.run(store_run(Path(tmp) / f"default-{layout}-{r}.db", total, shared))
                defaults.append(dflt["events_per_s"])
                raws.append(raw_run(Path(tmp) / f"raw-{layout}-{r}.db", st["batch_sizes"], shared))
                sizes = sorted(st.pop("batch_sizes"))
                st["batch_size_p50"] = common.percentile(sizes, 50, presorted=True)
                st["batch_size_max"] = sizes[-1] if sizes else 0
                stores.append(st)
                if st["timed_out"]:
                    print(f"WARNING: {layout} store run hit its time limit", file=sys.stderr)
            info[layout] = {"store": stores, "raw": raws, "store_default_gc_events_per_s": defaults}
            s_rate = common.percentile([x["events_per_s"] for x in stores], 50)
            r_rate = common.percentile([x["events_per_s"] for x in raws], 50)
            where = "own entity each" if not shared else "one shared entity"
            n = f" (median of {rounds})" if rounds > 1 else ""
            rows.append(
                common.ratio_row(
                    f"store appends, {APPENDERS} appenders, {where}{n}", s_rate, r_rate, "events/s", ">=", 0.5
                )
            )
            rows.append(
                common.value_row(
                    f"  (info) {layout}, Python's default GC settings",
                    common.percentile(defaults, 50),
                    r_rate,
                    "events/s",
                )
            )
            rows.append(
                common.value_row(
                    f"  (info) mean batch ({layout})",
                    common.percentile([x["mean_batch"] for x in stores], 50),
                    None,
                    "writes",
                )
            )
            rows.append(
                common.value_row(
                    f"  (info) CPU per event ({layout})",
                    common.percentile([x["cpu_util"] * x["wall_s"] / x["events"] * 1e6 for x in stores], 50),
                    common.percentile([x["cpu_s"] / x["events"] * 1e6 for x in raws], 50),
                    "us",
                )
            )
    elapsed = time.perf_counter() - t_start
    common.report("bench_store", rows, info, elapsed, quick)
    for layout in ("distinct", "shared"):
        for s, r in zip(info[layout]["store"], info[layout]["raw"], strict=True):
            print(
                f"  {layout}: store {s['events']} events in {s['wall_s']:.2f} s ({s['events_per_s']:,.0f}/s), "
                f"{s['batches']} batches (mean {s['mean_batch']:.1f}, p50 {s['batch_size_p50']:.0f}, max "
                f"{s['batch_size_max']}), process CPU {s['cpu_util']:.2f} cores; raw {r['events']} events in "
                f"{r['wall_s']:.2f} s ({r['events_per_s']:,.0f}/s)"
            )


if __name__ == "__main__":
    main()
