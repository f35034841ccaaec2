"""Restart on a big data dir: process start to health SERVING, and RSS.

Dataset: 100,000 entities and 1,000,000 events written directly with
sqlite3 into the store's own SCHEMA (``electric_server.store.sqlite``), with
real event bodies (serialized electric.v1 Event values, as the server stores
them), gap-free offsets, one txid per logical write, and lifecycle-valid
histories (each signal judged by ``electric_sdk.lifecycle.decide``). Every
entity has 10 events; final states: idle, running, killed (closed) and 300
`stopping` with grace deadlines 30 days ahead (so the reaper re-arms them and
nothing expires during the run). The dataset is built once, checked with
``electric verify``, and cached under bench/results/; each run serves a fresh
copy, so the cache is never written by a server.

Figure: ``electric server --data COPY`` started as a subprocess; time from
just before Popen to the first grpc.health.v1 Check answering SERVING (the
channel is opened when the "listening" line appears on stdout). Median of 3
starts. Target <= 3 s. Then one GetEntity and one ListEntities (1,000
entities), and the server's VmRSS from /proc/PID/status. Target <= 200 MB.

Ceiling: the echo server (common.py: python + grpc + a health service),
started and checked the same way, its VmRSS after one echo call.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

STARTS = 3
EVENTS_PER_ENTITY = 10
STOPPING = 300
TYPES = 10
DATASET_VERSION = 1


# -- dataset -----------------------------------------------------------------------------


def _histories() -> dict[str, list[tuple[str, Any]]]:
    """Per final state, the 10 writes of an entity: (kind, arg) tuples."""
    return {
        "idle": [
            ("spawn", None),
            ("state", ("running", "started")),
            ("message", None),
            ("run", "started"),
            ("run", "completed"),
            ("signal", "SIGUSR"),
            ("message", None),
            ("state", ("idle", "idle_timeout")),
            ("signal", "SIGHUP"),
            ("signal", "SIGCONT"),
        ],
        "running": [
            ("spawn", None),
            ("state", ("running", "started")),
            ("message", None),
            ("run", "started"),
            ("run", "step"),
            ("run", "completed"),
            ("signal", "SIGUSR"),
            ("message", None),
            ("run", "started"),
            ("signal", "SIGINT"),
        ],
        "killed": [
            ("spawn", None),
            ("state", ("running", "started")),
            ("message", None),
            ("run", "started"),
            ("run", "completed"),
            ("message", None),
            ("state", ("idle", "idle_timeout")),
            ("signal", "SIGUSR"),
            ("signal", "SIGKILL"),
        ],  # SIGKILL writes 2 events
        "stopping": [
            ("spawn", None),
            ("state", ("running", "started")),
            ("message", None),
            ("run", "started"),
            ("run", "completed"),
            ("message", None),
            ("run", "started"),
            ("signal", "SIGUSR"),
            ("signal", "SIGTERM"),
        ],  # SIGTERM writes 2 events
    }


def _rows(entities: int, base_ms: int) -> Iterator[tuple[str, Any]]:
    """Yields ("event", row) and ("entity", row) in primary-key order."""
    from electric_sdk import lifecycle
    from electric_sdk._proto.electric.v1 import types_pb2 as pb
    from electric_sdk._wire.enums import OUTCOME_TO_PB, SIGNAL_TO_PB, STATE_TO_PB
    from electric_sdk._wire.events import event_body
    from electric_sdk._wire.times import timestamp_from_ms
    from electric_sdk.lifecycle import Signal, State

    histories = _histories()
    run_status = {
        "started": pb.RUN_STATUS_STARTED,
        "step": pb.RUN_STATUS_STEP,
        "completed": pb.RUN_STATUS_COMPLETED,
    }
    per_type = entities // TYPES
    txid = 1
    n = 0
    for t in range(TYPES):
        type_ = f"agent{t}"
        for k in range(per_type):
            id_ = f"i{k:07d}"
            if n % (entities // STOPPING) == 0 and n // (entities // STOPPING) < STOPPING:
                final = "stopping"
            elif n % 10 == 1:
                final = "killed"
            elif n % 10 in (2, 3, 4):
                final = "running"
            else:
                final = "idle"
            n += 1
            now = base_ms + n
            created = now
            state: State | None = None
            offset = 0
            deadline: int | None = None
            msg_key = ""
            run_key = ""
            for kind, arg in histories[final]:
                now += 1000
                events: list[tuple[str, str, int, bytes]] = []
                if kind == "spawn":
                    value = pb.StateValue(state=pb.STATE_SPAWNING, cause="spawn")
                    events.append(
                        ("state", f"state_{txid}", pb.OPERATION_INSERT, event_body(pb.Event(state=value)))
                    )
                    state = State.SPAWNING
                elif kind == "state":
                    new = State(arg[0])
                    assert state is not None
                    lifecycle.check_runtime_transition(state, new, arg[1])
                    value = pb.StateValue(
                        state=STATE_TO_PB[new],
                        previous_state=STATE_TO_PB[state],
                        cause=arg[1],
                    )
                    events.append(
                        ("state", f"state_{txid}", pb.OPERATION_INSERT, event_body(pb.Event(state=value)))
                    )
                    state = new
                elif kind == "message":
                    msg_key = f"msg_{txid}"
                    events.append(
                        (
                            "message",
                            msg_key,
                            pb.OPERATION_INSERT,
                            event_body(
                                pb.Event(
                                    message=pb.MessageValue(
                                        text=f"please look at ticket {n}-{offset}", sender="user:alice"
                                    )
                                )
                            ),
                        )
                    )
                elif kind == "run":
                    if arg == "started":
                        run_key = f"run_{txid}"
                    run_value = pb.RunValue(
                        message_key=msg_key,
                        status=run_status[arg],
                        attempt=1,
                        step="tool:search" if arg == "step" else "",
                        output="done: 3 results" if arg == "completed" else "",
                    )
                    op = pb.OPERATION_INSERT if arg == "started" else pb.OPERATION_UPDATE
                    events.append(("run", run_key, op, event_body(pb.Event(run=run_value))))
                elif kind == "signal":
                    assert state is not None
                    sig = Signal(arg)
                    d = lifecycle.decide(state, sig)
                    key = f"sig_{txid}"
                    sig_value = pb.SignalValue(
                        signal=SIGNAL_TO_PB[sig],
                        sender="anonymous",
                        reason="bench",
                        outcome=OUTCOME_TO_PB[d.outcome],
                        previous_state=STATE_TO_PB[d.previous_state],
                        new_state=STATE_TO_PB[d.new_state],
                    )
                    if sig is Signal.SIGUSR:
                        sig_value.payload.struct_value.update({"op": "refresh", "n": n})
                    events.append(
                        ("signal", key, pb.OPERATION_INSERT, event_body(pb.Event(signal=sig_value)))
                    )
                    if d.transitions:
                        dl = now + 30 * 86_400_000 if d.new_state is State.STOPPING else None
                        sv = pb.StateValue(
                            state=STATE_TO_PB[d.new_state],
                            previous_state=STATE_TO_PB[state],
                            cause="signal",
                            signal_key=key,
                        )
                        if dl is not None:
                            sv.deadline.CopyFrom(timestamp_from_ms(dl))
                        events.append(
                            ("state", f"state_{txid}", pb.OPERATION_INSERT, event_body(pb.Event(state=sv)))
                        )
                        deadline = dl
                        state = d.new_state
                for ev_kind, key, op, body in events:
                    yield "event", (type_, id_, offset, ev_kind, key, op, now, txid, body)
                    offset += 1
                last_txid = txid
                txid += 1
            assert state is not None, final
            assert offset == EVENTS_PER_ENTITY, (final, offset)
            yield (
                "entity",
                (
                    type_,
                    id_,
                    state.value,
                    30_000,
                    60_000,
                    created,
                    now,
                    offset,
                    int(state.terminal),
                    deadline,
                    last_txid,
                ),
            )
    yield "meta", txid


def build_dataset(path: Path, entities: int) -> dict[str, Any]:
    from electric_server.store.sqlite import SCHEMA

    tmp = path.with_suffix(".building")
    for p in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        p.unlink(missing_ok=True)
    t0 = time.perf_counter()
    conn = sqlite3.connect(tmp, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("PRAGMA cache_size=-262144")
    conn.executescript(SCHEMA)
    conn.execute("BEGIN")
    events: list[tuple[Any, ...]] = []
    ents: list[tuple[Any, ...]] = []
    n_events = n_entities = 0
    next_txid = 1
    for what, row in _rows(entities, int(time.time() * 1000) - 86_400_000):
        if what == "event":
            events.append(row)
        elif what == "entity":
            ents.append(row)
        else:
            next_txid = row
        if len(events) >= 100_000 or what == "meta":
            conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", events)
            conn.executemany(
                f"INSERT INTO entities {common.ENTITY_COLUMNS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                ents,
            )
            n_events += len(events)
            n_entities += len(ents)
            events, ents = [], []
    conn.execute("INSERT INTO meta VALUES ('next_txid', ?)", (next_txid,))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    tmp.rename(path)
    return {
        "entities": n_entities,
        "events": n_events,
        "build_s": time.perf_counter() - t0,
        "bytes": path.stat().st_size,
    }


def dataset(quick: bool) -> tuple[Path, dict[str, Any]]:
    entities = common.scale(100_000, quick)
    cache = common.RESULTS / f"restart-dataset-{entities}"
    db = cache / "electric.db"
    marker = cache / "dataset.json"
    if marker.exists() and db.exists():
        meta = json.loads(marker.read_text())
        if meta.get("version") == DATASET_VERSION:
            print(
                f"using cached dataset {cache.relative_to(common.REPO)} ({meta['entities']:,} entities, "
                f"{meta['events']:,} events)"
            )
            return cache, meta | {"cached": True}
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    print(f"building dataset: {entities:,} entities x {EVENTS_PER_ENTITY} events ...", flush=True)
    meta = build_dataset(db, entities)
    t0 = time.perf_counter()
    verify = subprocess.run(
        [common.PY, "-m", "electric_sdk.cli.main", "verify", "--data", str(cache), "--json"],
        check=False,
        capture_output=True,
        text=True,
        cwd=common.REPO,
        timeout=900,
    )
    report = (
        json.loads(verify.stdout) if verify.stdout.strip().startswith("{") else {"raw": verify.stdout[-500:]}
    )
    if verify.returncode != 0 or not report.get("clean"):
        raise RuntimeError(
            f"electric verify rejected the dataset: {str(report)[:2000]} {verify.stderr[-2000:]}"
        )
    meta |= {"version": DATASET_VERSION, "verify_s": time.perf_counter() - t0, "verify": report}
    marker.write_text(json.dumps(meta) + "\n")
    print(
        f"built in {meta['build_s']:.1f} s ({meta['bytes'] / 1e6:.0f} MB), electric verify clean in "
        f"{meta['verify_s']:.1f} s",
        flush=True,
    )
    return cache, meta | {"cached": False}


# -- measurement ----------------------------------------------------------------------------


async def _queries(kind: str, address: str) -> dict[str, Any]:
    import grpc

    from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
    from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
    from electric_sdk._proto.electric.v1 import types_pb2 as pb

    async with grpc.aio.insecure_channel(address) as channel:
        if kind == "echo":
            await channel.unary_unary(common.ECHO_UNARY)(b"x" * 100, timeout=30)
            return {}
        stub = api_grpc.EntityServiceStub(channel)
        got = await stub.GetEntity(
            api.GetEntityRequest(ref=pb.EntityRef(type="agent0", id="i0000000")), timeout=30
        )
        page = await stub.ListEntities(api.ListEntitiesRequest(page_size=1000), timeout=30)
        return {"get_head_offset": got.entity.head_offset, "listed": len(page.entities)}


def start_once(kind: str, data: Path | None, log: Path) -> dict[str, Any]:
    port = common.free_port()
    listen = f"{common.HOST}:{port}"
    srv = (
        common.start_echo(listen, log=log)
        if kind == "echo"
        else common.start_electric(data, listen=listen, log=log)
    )  # type: ignore[arg-type]
    with srv:
        serving_at = asyncio.run(common.health_serving(srv.address, limit_s=60))
        queries = asyncio.run(_queries(kind, srv.address))
        rss = srv.rss_bytes()
        hwm = common.proc_status_bytes(srv.pid, "VmHWM")
    return {
        "start_s": serving_at - srv.started_at,
        "listening_s": srv.listening_at - srv.started_at,
        "rss_mb": rss / 1e6,
        "hwm_mb": hwm / 1e6,
        **queries,
    }


def main() -> None:
    args = common.bench_args(__doc__.splitlines()[0]).parse_args()
    quick = args.quick
    t_start = time.perf_counter()
    cache, meta = dataset(quick)
    runs: dict[str, list[dict[str, Any]]] = {"echo": [], "electric": []}
    with tempfile.TemporaryDirectory(prefix="electric-bench-restart-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        t0 = time.perf_counter()
        shutil.copy2(cache / "electric.db", data / "electric.db")
        copy_s = time.perf_counter() - t0
        for i in range(STARTS):  # alternate, so neither side gets systematically warmer caches
            runs["echo"].append(start_once("echo", None, Path(tmp) / f"echo{i}.log"))
            runs["electric"].append(start_once("electric", data, Path(tmp) / f"electric{i}.log"))
        log_tail = (Path(tmp) / "electric0.log").read_text()[-1500:]

    def med(kind: str, key: str) -> float:
        return common.percentile([r[key] for r in runs[kind]], 50)

    el = runs["electric"]
    if el[0].get("listed") != 1000 or el[0].get("get_head_offset") != EVENTS_PER_ENTITY:
        print(f"WARNING: unexpected query results {el[0]}", file=sys.stderr)
    if f"armed with {STOPPING} grace" not in log_tail and not quick:
        print("WARNING: the reaper log line with the expected deadline count was not found", file=sys.stderr)
    rows = [
        common.value_row(
            f"restart to health SERVING, {meta['entities']:,} entities / {meta['events']:,} events",
            med("electric", "start_s"),
            med("echo", "start_s"),
            "s",
            "<=",
            3.0,
        ),
        common.value_row(
            "  (info) start to 'listening' line",
            med("electric", "listening_s"),
            med("echo", "listening_s"),
            "s",
        ),
        common.value_row(
            "RSS after GetEntity + ListEntities(1000)",
            med("electric", "rss_mb"),
            med("echo", "rss_mb"),
            "MB",
            "<=",
            200.0,
        ),
        common.value_row("  (info) peak RSS (VmHWM)", med("electric", "hwm_mb"), med("echo", "hwm_mb"), "MB"),
    ]
    elapsed = time.perf_counter() - t_start
    common.report("bench_restart", rows, {"dataset": meta, "copy_s": copy_s, "runs": runs}, elapsed, quick)
    for kind in ("echo", "electric"):
        print(
            f"  {kind}: starts "
            + ", ".join(f"{r['start_s']:.3f} s" for r in runs[kind])
            + "; RSS "
            + ", ".join(f"{r['rss_mb']:.0f} MB" for r in runs[kind])
        )
    print(
        f"  dataset {meta['bytes'] / 1e6:.0f} MB, copied in {copy_s:.2f} s; "
        f"reaper: {[ln for ln in log_tail.splitlines() if 'reaper armed' in ln][:1]}"
    )


if __name__ == "__main__":
    main()
