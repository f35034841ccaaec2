"""What the commit feed costs PostgreSQL store writes: appends with the feed (and a second replica reading it) vs without.

In-process, no gRPC, on a fresh PostgreSQL database per run
(``ELECTRIC_DATABASE_URL``'s server, database ``electric_bench_feed``;
default the local one). 256 asyncio tasks each append 1-event mutations
with ``store.write`` to an entity of their own (the store's group commit
gathers them into batches, 4 connections). Figure: the store with its
commit feed on (a feed row per commit in the batch's transaction, the
doorbell's NOTIFY after each COMMIT) while a second store on the database,
in a process of its own, reads the feed as another replica would. Ceiling: the same store with the
feed off (``feed=False``: no feed rows, no NOTIFY, no reader). Rounds
alternate and report medians. Info: the feed on with no other replica
reading (the writer's own cost), and the reading replica's CPU: on two
cores it takes its share from the writer and PostgreSQL. Info: NOTIFYs sent per batch (the doorbell
merges rings while one is in flight) and the commits the second store
read.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import pg_common
from electric_server.store.base import EntityRecord, Mutation, NewEvent, Write, WriteContext
from electric_server.store.postgres import PostgresStore
from electric_server.store.postgres.feed import Doorbell

from electric_sdk.lifecycle import State

DATABASE = "electric_bench_feed"
APPENDERS = 256
RUN_TIMEOUT_S = 300.0


def database_url() -> str:
    return pg_common.with_database(pg_common.DSN, DATABASE)


async def fresh_database(url: str) -> None:
    assert url == database_url()
    await pg_common.recreate(DATABASE)


def create(ctx: WriteContext, ref: tuple[str, str]) -> Mutation:
    record = EntityRecord(
        ref[0], ref[1], State.SPAWNING, 30_000, 60_000, ctx.now_ms, ctx.now_ms, 0, False, None, 0
    )
    return Mutation([NewEvent("state", "spawn", 1, b"spawn")], record)


def append(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
    assert current is not None
    return Mutation([NewEvent("note", f"n{ctx.txid}", 1, b"x" * 64)], current)


def replica(url: str, expected: int, queue: Any) -> None:
    """The second replica's process: read the feed until ``expected`` commits came."""

    async def main() -> int:
        store = PostgresStore(url)
        await store.open()
        arrived = asyncio.Event()
        count = 0

        def seen(_commit: Any) -> None:
            nonlocal count
            count += 1
            if count >= expected:
                arrived.set()

        store.hub.subscribe_all(seen)
        queue.put({"ready": True})
        try:
            await asyncio.wait_for(arrived.wait(), RUN_TIMEOUT_S)
        finally:
            await store.close()
        return count

    try:
        delivered = asyncio.run(main())
        usage = resource.getrusage(resource.RUSAGE_SELF)
        queue.put({"delivered": delivered, "cpu_s": usage.ru_utime + usage.ru_stime})
    except BaseException as exc:
        queue.put({"error": repr(exc)})


async def one_run(url: str, feed: bool, writes_each: int, reader: bool = True) -> dict[str, Any]:
    await fresh_database(url)
    store = PostgresStore(url, feed=feed)
    await store.open()  # migrates the fresh database before the replica opens it
    writes = APPENDERS * writes_each
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    other = None
    if feed and reader:
        other = ctx.Process(target=replica, args=(url, APPENDERS + writes, queue), daemon=True)
    try:
        if other is not None:
            other.start()
            assert "ready" in await asyncio.to_thread(queue.get, True, RUN_TIMEOUT_S)
        refs = [("bench", f"e{i}") for i in range(APPENDERS)]
        await store.write_many([Write(ref, lambda _c, ctx, ref=ref: create(ctx, ref)) for ref in refs])
        batches_before = store.batches_committed
        bell = store.doorbell
        rung_before = bell.sent if isinstance(bell, Doorbell) else 0

        async def appender(ref: tuple[str, str]) -> None:
            for _ in range(writes_each):
                await store.write(Write(ref, append))

        started = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(appender(ref) for ref in refs)), RUN_TIMEOUT_S)
        seconds = time.perf_counter() - started
        out: dict[str, Any] = {
            "writes_per_s": writes / seconds,
            "batches": store.batches_committed - batches_before,
        }
        if isinstance(bell, Doorbell):
            out["notifies"] = bell.sent - rung_before
        if other is not None:
            result = await asyncio.to_thread(queue.get, True, RUN_TIMEOUT_S)
            if "error" in result:
                raise RuntimeError(f"the reading replica failed: {result['error']}")
            out["read_by_b"] = result["delivered"] / (APPENDERS + writes)
            out["reader_cpu_s"] = result["cpu_s"]
            out["seconds"] = seconds
        return out
    finally:
        await store.close()
        if other is not None:
            other.join(30)
            if other.is_alive():
                other.kill()


async def run(url: str, rounds: int, writes_each: int) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {"feed": [], "plain": [], "unread": []}
    await one_run(url, True, max(1, writes_each // 10))  # warm-up
    for r in range(rounds):
        for kind in ("feed", "plain", "unread")[r % 3 :] + ("feed", "plain", "unread")[: r % 3]:
            results[kind].append(await one_run(url, kind != "plain", writes_each, reader=kind == "feed"))
    return results


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--writes", type=int, default=40, help="appends per appender per run")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    writes_each = common.scale(args.writes, args.quick, 4)
    url = database_url()
    started = time.perf_counter()
    results = asyncio.run(run(url, args.rounds, writes_each))
    elapsed = time.perf_counter() - started
    feed = statistics.median(r["writes_per_s"] for r in results["feed"])
    plain = statistics.median(r["writes_per_s"] for r in results["plain"])
    unread = statistics.median(r["writes_per_s"] for r in results["unread"])
    batches = sum(r["batches"] for r in results["feed"])
    notifies = sum(r["notifies"] for r in results["feed"])
    rows = [
        common.ratio_row("appends/s, 256 appenders, commit feed on", feed, plain, "/s", ">=", 0.8),
        common.ratio_row(
            "info: appends/s, commit feed on, no other replica reading", unread, plain, "/s", ">=", 0.8
        ),
        common.value_row("info: NOTIFYs per batch committed (feed on)", notifies / batches, None, ""),
        common.value_row(
            "info: the reading replica's CPU, of the writing time",
            statistics.median(r["reader_cpu_s"] / r["seconds"] for r in results["feed"]),
            None,
            "",
        ),
        common.value_row(
            "info: commits read by the second replica, of those written (least)",
            min(r["read_by_b"] for r in results["feed"]),
            None,
            "",
        ),
    ]
    common.report("bench_feed_cost", rows, {"runs": results, "writes_each": writes_each}, elapsed, args.quick)


if __name__ == "__main__":
    main()
