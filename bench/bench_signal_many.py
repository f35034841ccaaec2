"""SignalEntities (SIGHUP, selector type=X) to 10,000 entities: wall time of one call.

Setup: ``electric server`` in its own process (fresh data dir, WAL,
synchronous=FULL); 10,000 entities of type X spawned through SpawnEntity
(they stay `spawning`, where SIGHUP is recorded with outcome `ignored`, so
each entity gets one durable signal record and an updated row). A few
hundred entities of another type are spawned too, so the selector has to
select. The client runs in a separate process (multiprocessing, spawn).

Figure: client-side wall time of one SignalEntities call (median of 3 calls;
each call signals all 10,000 again). Target <= 1 s.

Ceiling: raw sqlite3 (same SCHEMA, WAL, synchronous=FULL) on a file holding
the same 10,000 entities: one transaction inserting one `events` row and
upserting one `entities` row per entity (2 rows each) plus one `meta`
update, with executemany. The ratio is printed beside the figure.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

TYPE = "fleet"
OTHER = "other"
REPEATS = 3
TIMEOUT_S = 300.0


def client_main(address: str, server_pid: int, entities: int, out: Any) -> None:
    async def main() -> dict[str, Any]:
        import grpc

        from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
        from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
        from electric_sdk._proto.electric.v1 import types_pb2 as pb

        async with grpc.aio.insecure_channel(address) as channel:
            stub = api_grpc.EntityServiceStub(channel)
            sem = asyncio.Semaphore(64)

            async def spawn(t: str, i: int) -> None:
                async with sem:
                    await stub.SpawnEntity(
                        api.SpawnEntityRequest(ref=pb.EntityRef(type=t, id=f"e{i:06d}")), timeout=60
                    )

            t0 = time.perf_counter()
            spawns = [spawn(TYPE, i) for i in range(entities)] + [
                spawn(OTHER, i) for i in range(entities // 20)
            ]
            await asyncio.wait_for(asyncio.gather(*spawns), TIMEOUT_S)
            spawn_s = time.perf_counter() - t0
            calls = []
            for _ in range(REPEATS):
                cpu0 = common.proc_cpu_seconds(server_pid)
                t0 = time.perf_counter()
                reply = await stub.SignalEntities(
                    api.SignalEntitiesRequest(
                        selector=api.EntitySelector(type=TYPE), signal=pb.SIGNAL_SIGHUP, reason="deploy"
                    ),
                    timeout=TIMEOUT_S,
                )
                wall = time.perf_counter() - t0
                cpu = common.proc_cpu_seconds(server_pid) - cpu0
                calls.append(
                    {
                        "wall_s": wall,
                        "server_cpu_s": cpu,
                        "signalled": reply.signalled,
                        "ignored": reply.ignored,
                        "skipped": reply.skipped,
                        "not_found": reply.not_found,
                    }
                )
            head = await stub.GetEntity(api.GetEntityRequest(ref=pb.EntityRef(type=TYPE, id="e000000")))
        return {"spawn_s": spawn_s, "calls": calls, "sample_head_offset": head.entity.head_offset}

    try:
        out.put(asyncio.run(main()))
    except BaseException as exc:
        out.put({"error": repr(exc)})
        raise


def raw_ceiling(path: Path, entities: int) -> dict[str, Any]:
    from electric_server.store.sqlite import SCHEMA, now_ms

    from electric_sdk._proto.electric.v1 import types_pb2 as pb

    body = pb.Event(
        signal=pb.SignalValue(
            signal=pb.SIGNAL_SIGHUP,
            sender="anonymous",
            reason="deploy",
            outcome=pb.SIGNAL_OUTCOME_IGNORED,
            previous_state=pb.STATE_SPAWNING,
            new_state=pb.STATE_SPAWNING,
        )
    ).SerializeToString(deterministic=True)
    spawn_body = pb.Event(state=pb.StateValue(state=pb.STATE_SPAWNING, cause="spawn")).SerializeToString()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.executescript(SCHEMA)
    now = now_ms()
    ids = [f"e{i:06d}" for i in range(entities)]
    conn.execute("BEGIN")
    conn.executemany(
        f"INSERT INTO entities {common.ENTITY_COLUMNS} VALUES (?, ?, 'spawning', 30000, 60000, ?, ?, 1, 0, NULL, ?)",
        [(TYPE, i, now, now, n + 1) for n, i in enumerate(ids)],
    )
    conn.executemany(
        "INSERT INTO events VALUES (?, ?, 0, 'state', ?, 1, ?, ?, ?)",
        [(TYPE, i, f"state_{n + 1}", now, n + 1, spawn_body) for n, i in enumerate(ids)],
    )
    conn.execute("INSERT INTO meta VALUES ('next_txid', ?)", (entities + 1,))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    times = []
    txid = entities + 1
    head = 1
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        now = now_ms()
        events, rows = [], []
        for i in ids:
            events.append((TYPE, i, head, "signal", f"sig_{txid}", 1, now, txid, body))
            rows.append((TYPE, i, "spawning", 30000, 60000, now, now, head + 1, 0, None, txid))
            txid += 1
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO events (type, id, offset, kind, key, operation, ts, txid, body) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            events,
        )
        conn.executemany(
            f"INSERT OR REPLACE INTO entities {common.ENTITY_COLUMNS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.execute("UPDATE meta SET value = ? WHERE name = 'next_txid'", (txid,))
        conn.execute("COMMIT")
        times.append(time.perf_counter() - t0)
        head += 1
    conn.close()
    return {"times_s": times}


def main() -> None:
    args = common.bench_args(__doc__.splitlines()[0]).parse_args()
    quick = args.quick
    t_start = time.perf_counter()
    entities = common.scale(10_000, quick)
    with tempfile.TemporaryDirectory(prefix="electric-bench-many-") as tmp:
        with common.start_electric(Path(tmp) / "data") as srv:
            ctx = mp.get_context("spawn")
            queue = ctx.Queue()
            proc = ctx.Process(target=client_main, args=(srv.address, srv.pid, entities, queue), daemon=True)
            proc.start()
            try:
                client = queue.get(timeout=TIMEOUT_S * 2)
            finally:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
            if "error" in client:
                raise RuntimeError(client["error"])
        raw = raw_ceiling(Path(tmp) / "raw.db", entities)
    walls = sorted(c["wall_s"] for c in client["calls"])
    figure = common.percentile(walls, 50, presorted=True)
    ceiling = common.percentile(sorted(raw["times_s"]), 50)
    for c in client["calls"]:
        if c["ignored"] + c["signalled"] != entities:
            print(
                f"WARNING: call reached {c['ignored'] + c['signalled']} of {entities} entities",
                file=sys.stderr,
            )
    rows = [
        common.value_row(
            f"SignalEntities SIGHUP to {entities:,} entities (median of {REPEATS})",
            figure,
            ceiling,
            "s",
            "<=",
            1.0,
        ),
        common.value_row(
            "  (info) server CPU during the call",
            sorted(c["server_cpu_s"] for c in client["calls"])[1],
            None,
            "s",
        ),
    ]
    elapsed = time.perf_counter() - t_start
    common.report(
        "bench_signal_many", rows, {"entities": entities, "client": client, "raw": raw}, elapsed, quick
    )
    print(
        "  calls: "
        + ", ".join(
            f"{c['wall_s']:.3f} s (ignored {c['ignored']}, server CPU {c['server_cpu_s']:.2f} s)"
            for c in client["calls"]
        )
    )
    print("  raw sqlite3 one transaction: " + ", ".join(f"{t:.3f} s" for t in raw["times_s"]))
    print(
        f"  spawning {entities:,} + {entities // 20:,} entities took {client['spawn_s']:.1f} s; "
        f"sample head_offset {client['sample_head_offset']} (expected {1 + REPEATS})"
    )


if __name__ == "__main__":
    main()
