"""Signal to replica A → ``on_signal`` in a worker on replica B, over PostgreSQL's commit feed.

Four processes: two ``electric server`` replicas on one fresh PostgreSQL
database (``ELECTRIC_DATABASE_URL``'s server, database
``electric_bench_replica``; default the local one), an ``electric worker``
connected to B only, and this script as the client. One machine, one wall
clock. B's runtime leases the entity to its own worker; A has none.

Figure: one ``running`` entity (its run holds a step open); sequentially,
``AsyncClient.signal(SIGUSR)`` to **A**, stamped with ``time.time_ns()``
just before the call; the handler's first line takes ``time.time_ns()`` and
emits it in a custom event, which the client reads from B's
``WatchEvents``. Latency = handler call - send. The next signal goes once
the watch shows this one's outcome recorded (its handler returned and the
worker's write of ``delivered`` committed), so each signal is measured
alone, not against the tail of the one before. The path: A commits the
signal and rings the doorbell (NOTIFY), B's feed reader reads the commit
and B's runtime delivers it.

Ceiling, measured in the same run, in alternating rounds: the same signal
sent to **B** (client and worker on one replica: no feed) plus a bare
asyncpg NOTIFY → listener delivery between two connections of this process
(the doorbell's floor), each percentile summed. Info, in the same rounds:
the feed alone, between two stores in this process (a write acknowledged
by one → published on the other's hub), beside the NOTIFY delivery. The
listeners and stores of those two figures are open only in their own rounds:
PostgreSQL wakes every listening backend for every NOTIFY, so while the
signals are measured the database has the deployment's two feed readers and
nothing more. Then,
one server alone on a fresh database with the worker on it: what a second
replica on the database costs a replica's own signals (every server keeps
its commit feed on, alone or not).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import pg_common
from electric_server.core import entity_writes
from electric_server.store.base import EntityRecord, Mutation, NewEvent, Write, WriteContext
from electric_server.store.postgres import PostgresStore

DATABASE = "electric_bench_replica"
APP_MODULE = '''
"""bench_replica_signal's entity type (written by bench/bench_replica_signal.py)."""

import time

import anyio

from electric_sdk.runtime import App

app = App("benchrep")


@app.entity("lat", grace_period="1s", idle_timeout="1h")
class Lat:
    async def on_message(self, ctx, message):
        async with ctx.step("hold"):
            await anyio.sleep(86400)

    async def on_signal(self, ctx, signal):
        called = time.time_ns()
        if signal.signal.value == "SIGUSR":
            await ctx.emit("usr_seen", {"t": str(called), "reason": signal.reason})
'''
WAIT_S = 10.0
# Unrecorded samples at the start of each round (its instruments' connections were just opened).
WARM_PER_ROUND = 5
CHANNEL = "bench_replica_signal"


def note(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
    assert current is not None
    return Mutation([NewEvent("note", f"n{ctx.txid}", 1, b"x" * 64)], current)


def database_url() -> str:
    return pg_common.with_database(pg_common.DSN, DATABASE)


async def fresh_database(url: str) -> None:
    assert url == database_url()
    await pg_common.recreate(DATABASE)


ALL_KINDS = ("cross", "same", "notify", "feed")


async def client(
    url: str, address_a: str, address_b: str, args: Any, kinds: tuple[str, ...] = ALL_KINDS
) -> dict[str, Any]:
    import asyncpg

    from electric_sdk.client import AsyncClient

    a, b = AsyncClient(address_a), AsyncClient(address_b)
    # Spawned through A: B's runtime learns of it from the feed and leases it to its worker.
    await a.spawn("lat/usr")
    await b.wait_for_state("lat/usr", "running", timeout=60)
    await a.send("lat/usr", "hold")
    seen: dict[str, int] = {}
    arrived: dict[str, asyncio.Event] = {}
    settled: dict[str, asyncio.Event] = {}
    started = asyncio.Event()

    async def watch() -> None:
        async for ev in b.watch("lat/usr", 0):
            value = ev.value.get("data", ev.value)
            if ev.type == "usr_seen":
                seen[value["reason"]] = int(value["t"])
                if value["reason"] in arrived:
                    arrived[value["reason"]].set()
            elif ev.type == "signal" and ev.operation == "update" and value.get("reason") in settled:
                settled[value["reason"]].set()  # its outcome is recorded: the signal is done with
            elif ev.type == "run":
                started.set()

    watcher = asyncio.create_task(watch())
    await asyncio.wait_for(started.wait(), WAIT_S)

    notified: dict[str, int] = {}
    heard: dict[str, asyncio.Event] = {}

    def on_notify(_conn: Any, _pid: int, _channel: str, text: str) -> None:
        notified[text] = time.time_ns()
        heard[text].set()

    fed: dict[int, float] = {}
    fed_event = asyncio.Event()

    def on_commit(commit: Any) -> None:
        fed[commit.txid] = time.perf_counter()
        fed_event.set()

    feed_ref = ("feedlat", "one")
    lat: dict[str, list[float]] = {"cross": [], "same": [], "notify": [], "feed": []}
    n = 0
    # The instruments of the "notify" and "feed" rounds, open only during those rounds: each of
    # their listeners is woken by every NOTIFY on the database (PostgreSQL signals every listening
    # backend), so left open they would add two feed readers and a listener to the deployment
    # the signal figures measure (two replicas, one worker) and slow them on two cores.
    tools: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def instruments(kind: str) -> AsyncIterator[None]:
        if kind == "notify":
            listener, sender = await asyncpg.connect(url), await asyncpg.connect(url)
            await listener.add_listener(CHANNEL, on_notify)
            tools["sender"] = sender
            try:
                yield
            finally:
                await listener.close()
                await sender.close()
        elif kind == "feed":
            # The feed alone: two stores in this process on the database, a write through one →
            # the other's hub (no gRPC, no runtime).
            store_a, store_b = PostgresStore(url), PostgresStore(url)
            await store_a.open()
            await store_b.open()
            store_b.hub.subscribe_all(on_commit)
            if await store_a.get_entity(feed_ref) is None:
                await store_a.write(Write(feed_ref, entity_writes.spawn(feed_ref, 1000, 1000)))
            tools["store"] = store_a
            try:
                yield
            finally:
                await store_a.close()
                await store_b.close()
        else:
            yield

    async def one_signal(kind: str, record: bool) -> None:
        nonlocal n
        n += 1
        reason = f"{kind}{n}"
        arrived[reason], settled[reason] = asyncio.Event(), asyncio.Event()
        to = a if kind == "cross" else b
        sent = time.time_ns()
        await to.signal("lat/usr", "SIGUSR", reason=reason)
        await asyncio.wait_for(arrived[reason].wait(), WAIT_S)
        await asyncio.wait_for(settled[reason].wait(), WAIT_S)
        if record:
            lat[kind].append((seen[reason] - sent) / 1e6)

    async def one_notify(record: bool) -> None:
        nonlocal n
        n += 1
        text = str(n)
        heard[text] = asyncio.Event()
        sent = time.time_ns()
        await tools["sender"].execute("SELECT pg_notify($1, $2)", CHANNEL, text)
        await asyncio.wait_for(heard[text].wait(), WAIT_S)
        if record:
            lat["notify"].append((notified[text] - sent) / 1e6)

    async def one_feed(record: bool) -> None:
        fed_event.clear()
        outcome = await tools["store"].write(Write(feed_ref, note))
        acknowledged = time.perf_counter()
        assert outcome.commit is not None
        while outcome.commit.txid not in fed:
            await asyncio.wait_for(fed_event.wait(), WAIT_S)
            fed_event.clear()
        if record:
            lat["feed"].append((fed[outcome.commit.txid] - acknowledged) * 1e3)

    async def one(kind: str, record: bool) -> None:
        if kind == "notify":
            await one_notify(record)
        elif kind == "feed":
            await one_feed(record)
        else:
            await one_signal(kind, record)

    for kind in kinds:  # warm-up
        async with instruments(kind):
            for _ in range(30):
                await one(kind, False)
    per_round = max(1, args.signals // args.rounds)
    for r in range(args.rounds):
        for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
            async with instruments(kind):
                for _ in range(WARM_PER_ROUND):
                    await one(kind, False)
                for _ in range(per_round):
                    await one(kind, True)
    watcher.cancel()
    await a.close()
    await b.close()
    return lat


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--signals", type=int, default=600, help="samples of each figure (at least 500)")
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    args.signals = common.scale(args.signals, args.quick, 30)
    url = database_url()
    asyncio.run(fresh_database(url))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-replica-") as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "benchrep_app.py").write_text(APP_MODULE)
        replica_a = common.start_electric(tmpdir / "a", "--database", url)
        replica_b = common.start_electric(tmpdir / "b", "--database", url)
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(tmpdir), os.environ.get("PYTHONPATH")]))
        }
        worker_log = tmpdir / "worker.log"
        worker = common.start_worker(replica_b.address, worker_log, "benchrep_app:app", env=env)
        try:
            lat = asyncio.run(client(url, replica_a.address, replica_b.address, args))
        except BaseException:
            print(worker_log.read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            common.stop_worker(worker, 5)
            replica_a.stop()
            replica_b.stop()
        # One server alone on the database: what B's figure would be with no replica beside it.
        asyncio.run(fresh_database(url))
        alone = common.start_electric(tmpdir / "alone", "--database", url)
        worker = common.start_worker(alone.address, worker_log, "benchrep_app:app", env=env)
        try:
            lat["alone"] = asyncio.run(client(url, alone.address, alone.address, args, ("same",)))["same"]
        finally:
            common.stop_worker(worker, 5)
            alone.stop()
    elapsed = time.perf_counter() - started
    cross, same, notify, fed, alone_s = (
        common.summarize(lat[k]) for k in ("cross", "same", "notify", "feed", "alone")
    )
    rows = [
        common.value_row(
            "signal to A → on_signal on B's worker, p50",
            cross["p50"],
            same["p50"] + notify["p50"],
            "ms",
            "<=",
            5.0,
        ),
        common.value_row(
            "signal to A → on_signal on B's worker, p99",
            cross["p99"],
            same["p99"] + notify["p99"],
            "ms",
            "<=",
            25.0,
        ),
        common.value_row("info: same replica (signal to B), p50", same["p50"], None, "ms"),
        common.value_row("info: same replica (signal to B), p99", same["p99"], None, "ms"),
        common.value_row(
            "info: one server alone, p50 (vs same replica, two replicas)", alone_s["p50"], same["p50"], "ms"
        ),
        common.value_row(
            "info: one server alone, p99 (vs same replica, two replicas)", alone_s["p99"], same["p99"], "ms"
        ),
        common.value_row(
            "info: the feed alone: write acknowledged → other store's hub, p50",
            fed["p50"],
            notify["p50"],
            "ms",
        ),
        common.value_row(
            "info: the feed alone: write acknowledged → other store's hub, p99",
            fed["p99"],
            notify["p99"],
            "ms",
        ),
        common.value_row("info: asyncpg NOTIFY → listener, p50", notify["p50"], None, "ms"),
        common.value_row("info: asyncpg NOTIFY → listener, p99", notify["p99"], None, "ms"),
        common.value_row(
            "info: the feed's cost (A p50 - B p50)", cross["p50"] - same["p50"], notify["p50"], "ms"
        ),
    ]
    common.report(
        "bench_replica_signal",
        rows,
        {
            "cross": cross,
            "same": same,
            "notify": notify,
            "feed": fed,
            "alone": alone_s,
            "signals": args.signals,
            "rounds": args.rounds,
        },
        elapsed,
        args.quick,
    )


if __name__ == "__main__":
    main()
