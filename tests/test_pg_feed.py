"""The commit feed between replicas on one PostgreSQL database (store/postgres/feed.py, feed_order.py).

Two stores on one database stand for two replicas (each its own pool, feed
reader and hub); then two real servers in this process, sharing the
database with the one-server lock off. What each replica's hub publishes is
checked against the streams in the database: every commit once, each
entity's in commit order, with the events, ``before`` and ``after`` its
writer had. Waits are on the hubs' publishes and on what PostgreSQL reports
(``pg_stat_activity``), bounded, never on sleeps.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest
from electric_server.app import ElectricServer, ServerConfig
from electric_server.store.base import REMOTE_COMMIT, Commit, DatabaseUnavailable, EntityRecord, Ref
from electric_server.store.postgres import PostgresStore
from electric_server.store.postgres import feed as postgres_feed
from electric_server.store.postgres.feed import Doorbell, payload
from electric_server.store.postgres.statements import (
    CURRENT_SNAPSHOT,
    FEED_CHANNEL,
    READ_FEED,
    READER_SETTINGS,
    SESSION_SETTINGS,
)
from electric_server.store.rows import ENTITY_COLUMNS, entity_row
from helpers import lock_waiter
from test_store import note, spawn
from test_store_postgres import behind_a_cutter

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import State

pytestmark = pytest.mark.anyio

WAIT_S = 30


class Seen:
    """The commits a store's hub published, in order; ``until`` waits for a condition on them."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.commits: list[Commit] = []
        self._waiting: list[tuple[Callable[[], bool], asyncio.Event]] = []
        store.hub.subscribe_all(self._on_commit)

    def _on_commit(self, commit: Commit) -> None:
        self.commits.append(commit)
        for condition, event in self._waiting:
            if condition():
                event.set()

    async def until(self, condition: Callable[[], bool]) -> None:
        if condition():
            return
        event = asyncio.Event()
        self._waiting.append((condition, event))
        with anyio.fail_after(WAIT_S):
            await event.wait()

    async def count(self, n: int) -> None:
        await self.until(lambda: len(self.commits) >= n)

    def of(self, ref: Ref) -> list[Commit]:
        return [c for c in self.commits if c.ref == ref]


async def check_published(seen: Seen, refs: list[Ref]) -> None:
    """Every commit of each entity published once, in commit order, as its writer had it."""
    for ref in refs:
        stored = await seen.store.read_events(ref, 0, 100_000)
        published = seen.of(ref)
        assert [e for c in published for e in c.events] == stored
        assert [c.txid for c in published] == sorted({e.txid for e in stored})
        previous = None
        for commit in published:
            assert commit.before == previous
            previous = commit.after
        record = await seen.store.get_entity(ref)
        assert previous == record


OpenStore = Callable[..., Awaitable[PostgresStore]]


@pytest.fixture
async def stores(postgres_url: str) -> AsyncIterator[OpenStore]:
    """Open stores on the test's database (the feed on); closed at teardown."""
    opened: list[PostgresStore] = []

    async def open_store(**options: Any) -> PostgresStore:
        store = PostgresStore(postgres_url, **options)
        await store.open()
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        await store.close()


async def counts(store: PostgresStore, peers: Callable[[int], bool]) -> None:
    """Until the other readers ``store``'s reader knows of (by an announcement, or a count) satisfy
    ``peers`` (None, not known, is taken as 0)."""
    reader = store.feed_reader
    assert reader is not None
    with anyio.fail_after(WAIT_S):
        # Set by the reader's NOTIFY callback or its count at a poll, which signal nothing: looked at.
        while not peers(reader.peers or 0):  # noqa: ASYNC110
            await asyncio.sleep(0.002)


@pytest.fixture
async def pair(stores: OpenStore) -> tuple[PostgresStore, PostgresStore]:
    a, b = await stores(), await stores()
    await counts(a, lambda n: n >= 1)  # b announced itself: a's doorbell rings (b counted a at open)
    return a, b


async def test_commits_reach_the_other_replica_once_in_order(
    pair: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = pair
    seen_a, seen_b = Seen(a), Seen(b)
    ref = ("feed", "one")
    await a.write(spawn(ref))
    for _ in range(5):
        await a.write(note(ref))
    await b.write(note(ref))
    outcomes = await a.write_many([note(ref) for _ in range(3)])
    assert len(outcomes) == 3
    await seen_b.count(10)
    await seen_a.count(10)
    for seen in (seen_a, seen_b):
        await check_published(seen, [ref])
    # Each replica's own commits as its writer made them; the other's marked remote.
    assert [c.result is REMOTE_COMMIT for c in seen_b.commits] == [True] * 6 + [False] + [True] * 3
    assert [c.result is REMOTE_COMMIT for c in seen_a.commits] == [False] * 6 + [True] + [False] * 3


async def test_32_writers_on_two_replicas(pair: tuple[PostgresStore, PostgresStore]) -> None:
    a, b = pair
    seen_a, seen_b = Seen(a), Seen(b)
    refs = [("feed", f"e{i}") for i in range(4)]
    for ref in refs:
        await a.write(spawn(ref))
    writes_each = 15

    async def writer(store: PostgresStore, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(writes_each):
            await store.write(note(rng.choice(refs)))

    async with anyio.create_task_group() as tg:
        for n in range(32):
            tg.start_soon(writer, a if n % 2 else b, n)
    total = len(refs) + 32 * writes_each
    await seen_a.count(total)
    await seen_b.count(total)
    for seen in (seen_a, seen_b):
        await check_published(seen, refs)
        assert len(seen.commits) == total


async def test_a_late_commit_with_an_earlier_txid_is_read(
    pair: tuple[PostgresStore, PostgresStore], admin: Any
) -> None:
    """A transaction that drew its txid first and commits last is read all the same:
    a reader of ``txid > the last one read`` would skip it."""
    a, b = pair
    seen_b = Seen(b)
    late, early = ("feed", "late"), ("feed", "early")
    await a.write(spawn(late))
    await a.write(spawn(early))
    await seen_b.count(2)
    # The late write will wait, its txid drawn, for the test's uncommitted event at its offset.
    blocker = admin.transaction()
    await blocker.start()
    await admin.execute(
        'INSERT INTO events (type, id, "offset", kind, key, operation, ts, txid, body) '
        "VALUES ($1, $2, 1, 'note', 'blocker', 1, 0, 0, '')",
        *late,
    )
    late_write = asyncio.create_task(a.write(note(late)))
    await lock_waiter(admin)
    await a.write(note(early))
    await seen_b.until(lambda: len(seen_b.of(early)) == 2)
    assert len(seen_b.of(late)) == 1  # the late one has not committed yet
    await blocker.rollback()
    outcome = await late_write
    assert outcome.commit is not None
    await seen_b.until(lambda: len(seen_b.of(late)) == 2)
    late_txid, early_txid = seen_b.of(late)[1].txid, seen_b.of(early)[1].txid
    assert late_txid < early_txid  # drawn first, committed last: the interleaving happened
    await check_published(seen_b, [late, early])


async def test_a_local_commit_waits_for_the_remote_one_before_it(stores: OpenStore) -> None:
    """B writes an entity right after A did, before B's reader read A's commit: B's hub gets
    A's commit first (B reads at once, asked by its own write), then B's."""
    a = await stores(notify=False)
    b = await stores(feed_poll_s=3600)  # no NOTIFY, no poll: only B's own write makes it read
    seen_b = Seen(b)
    ref = ("feed", "chain")
    await b.write(spawn(ref))
    await a.write(note(ref))
    await b.write(note(ref))
    await seen_b.count(3)
    assert [c.result is REMOTE_COMMIT for c in seen_b.commits] == [False, True, False]
    await check_published(seen_b, [ref])


async def test_the_listen_connection_killed_misses_nothing(
    pair: tuple[PostgresStore, PostgresStore], admin: Any
) -> None:
    a, b = pair
    seen_b = Seen(b)
    ref = ("feed", "killed")
    await a.write(spawn(ref))
    await seen_b.count(1)
    reader = b.feed_reader
    assert reader is not None
    pid = reader.backend_pid
    assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
    for _ in range(20):
        await a.write(note(ref))
    await seen_b.count(21)
    await check_published(seen_b, [ref])
    assert reader.reconnects >= 1
    assert reader.backend_pid != pid


async def test_polling_delivers_without_notify(stores: OpenStore) -> None:
    a = await stores(notify=False)
    b = await stores(feed_poll_s=0.005)
    seen_b = Seen(b)
    ref = ("feed", "polled")
    await a.write(spawn(ref))
    for _ in range(10):
        await a.write(note(ref))
    await seen_b.count(11)
    await check_published(seen_b, [ref])
    assert isinstance(a.doorbell, Doorbell)
    assert a.doorbell.sent == 0


async def test_a_notify_carries_one_small_position(
    pair: tuple[PostgresStore, PostgresStore], admin: Any
) -> None:
    a, _ = pair
    payloads: list[str] = []
    arrived = asyncio.Event()

    def heard(_conn: Any, _pid: int, _channel: str, text: str) -> None:
        payloads.append(text)
        arrived.set()

    await admin.add_listener(FEED_CHANNEL, heard)
    ref = ("feed", "bell")
    await a.write(spawn(ref))  # a lone commit rings at once
    with anyio.fail_after(WAIT_S):
        await arrived.wait()
    # A batch of 256 commits, and many lone writes at once: still one position a NOTIFY.
    await a.write_many([note(ref) for _ in range(256)])
    await asyncio.gather(*(a.write(note(ref)) for _ in range(64)))
    xact = await admin.fetchval("SELECT max(xact)::text FROM commit_feed")
    with anyio.fail_after(WAIT_S):
        while xact not in payloads:
            arrived.clear()
            await arrived.wait()
    assert all(p.isdigit() and len(p.encode()) <= 20 for p in payloads)
    assert len(payload(2**64 - 1).encode()) < 8000


async def test_rings_while_one_is_in_flight_merge_into_the_next(
    pair: tuple[PostgresStore, PostgresStore], admin: Any
) -> None:
    a, _ = pair
    doorbell = a.doorbell
    assert isinstance(doorbell, Doorbell)
    payloads: list[str] = []
    two = asyncio.Event()

    def heard(_conn: Any, _pid: int, _channel: str, text: str) -> None:
        payloads.append(text)
        if len(payloads) == 2:
            two.set()

    await admin.add_listener(FEED_CHANNEL, heard)
    doorbell.ring(101)  # sent at once
    doorbell.ring(102)  # in flight meanwhile: merged into the next,
    doorbell.ring(103)  # which carries the latest position
    with anyio.fail_after(WAIT_S):
        await two.wait()
    assert payloads == ["101", "103"]


async def test_a_store_without_the_feed_writes_none(stores: OpenStore, admin: Any) -> None:
    alone = await stores(feed=False)
    assert alone.feed_reader is None
    await alone.write(spawn(("feed", "alone")))
    assert await admin.fetchval("SELECT count(*) FROM commit_feed") == 0


async def test_a_commit_cut_off_in_commit_reaches_its_own_hub_once(postgres_url: str) -> None:
    """Its writer answered UNAVAILABLE and published nothing; it committed, so the feed brings it.
    (A batch's COMMIT; a lone write's statement cut off is found out: test_pg_one_write.py.)"""
    async with behind_a_cutter(postgres_url) as (store, cutter):
        seen = Seen(store)
        ref: Ref = ("feed", "cut")
        await store.write(spawn(ref))
        other = await store.write(spawn(("feed", "other")))
        cutter.armed = True
        with anyio.fail_after(WAIT_S), pytest.raises(DatabaseUnavailable, match="during COMMIT"):
            await store.write_many([note(ref, "cut"), note(("feed", "other"))])
        assert other.commit is not None
        await seen.count(4)
        await store.write(note(ref, "after"))
        await seen.count(5)
        await check_published(seen, [ref, ("feed", "other")])
        assert [c.result is REMOTE_COMMIT for c in seen.commits] == [False, False, True, True, False]


async def write_as_version_1(admin: Any, ref: Ref) -> None:
    """A write as a replica of schema version 1 makes it: an event and the entity row, which it
    creates without ``xact`` (NULL) or updates leaving ``xact`` as it was; no feed row."""
    async with admin.transaction():
        txid = await admin.fetchval("SELECT nextval('electric_txid')")
        head = await admin.fetchval("SELECT head_offset FROM entities WHERE type = $1 AND id = $2", *ref)
        if head is None:
            head = 0
            record = EntityRecord(ref[0], ref[1], State.SPAWNING, 1, 1, 0, 0, 1, False, None, txid)
            columns = ", ".join(f'"{c}"' for c in ENTITY_COLUMNS)
            values = ", ".join(f"${i}" for i in range(1, len(ENTITY_COLUMNS) + 1))
            await admin.execute(f"INSERT INTO entities ({columns}) VALUES ({values})", *entity_row(record))
        else:
            await admin.execute(
                "UPDATE entities SET head_offset = head_offset + 1, txid = $3 WHERE type = $1 AND id = $2",
                *ref,
                txid,
            )
        await admin.execute(
            'INSERT INTO events (type, id, "offset", kind, key, operation, ts, txid, body) '
            "VALUES ($1, $2, $3, 'note', 'v1', 1, 0, $4, '')",
            *ref,
            head,
            txid,
        )


async def test_writes_beside_a_replica_of_schema_version_1_are_published(
    stores: OpenStore, admin: Any
) -> None:
    """Its commits reach no other replica (it writes no feed row), and they hold up nothing."""
    b = await stores(feed_poll_s=3600)
    seen_b = Seen(b)
    ref: Ref = ("feed", "v1")
    await write_as_version_1(admin, ref)  # created without a writer's transaction id
    await b.write(note(ref))
    await seen_b.count(1)
    await write_as_version_1(admin, ref)  # the row keeps B's transaction id, now stale
    await b.write(note(ref))
    await seen_b.count(2)
    assert [c.result is REMOTE_COMMIT for c in seen_b.commits] == [False, False]


@pytest.mark.parametrize("replicas", [2, 1], ids=["read-by-another", "alone"])
async def test_feed_rows_past_their_retention_are_deleted(
    stores: OpenStore, admin: Any, replicas: int
) -> None:
    """B's reader deletes them: B beside the writer A, or A itself alone (whose reader then
    reads no commit at all: the deletion does not wait for one)."""
    a = await stores()
    b = await stores() if replicas == 2 else a
    reader = b.feed_reader
    assert reader is not None
    reader.retention_s = 0.02
    ref: Ref = ("feed", "pruned")
    await a.write(spawn(ref))
    first = await admin.fetchval("SELECT min(xact)::text FROM commit_feed")
    with anyio.fail_after(WAIT_S):
        # B's reads (rung by A's writes, or its polls every 0.5 s) take a snapshot's xmin now
        # and then and delete what ended before one older than the retention.
        while await admin.fetchval("SELECT count(*) FROM commit_feed WHERE xact = $1::text::xid8", first):
            await a.write(note(ref))
    assert await admin.fetchval("SELECT count(*) FROM commit_feed") > 0  # the recent rows stay
    if replicas == 1:
        assert reader.delivered == 0


async def test_the_feed_is_read_by_its_index_before_any_analyze(stores: OpenStore, admin: Any) -> None:
    """Until autovacuum first analyzes commit_feed (a new database's first minute) the planner
    would scan the whole table on every read, a cost growing with the table; the readers'
    connections read it through its index on xact all the same."""
    await admin.execute("ALTER TABLE commit_feed SET (autovacuum_enabled = false)")
    a, b = await stores(), await stores()
    seen_b = Seen(b)
    ref: Ref = ("feed", "scan")
    await a.write(spawn(ref))
    await a.write_many([note(ref) for _ in range(200)])
    await seen_b.count(201)
    for _ in range(3):  # 8 times as many rows, of transactions long ended: no read returns them
        await admin.execute("INSERT INTO commit_feed SELECT * FROM commit_feed")
    assert await admin.fetchval("SELECT count(*) FROM pg_stats WHERE tablename = 'commit_feed'") == 0
    snapshot = await admin.fetchval(CURRENT_SNAPSHOT)
    plain = "\n".join(r[0] for r in await admin.fetch("EXPLAIN " + READ_FEED, snapshot, 0, []))
    assert "Seq Scan on commit_feed" in plain  # what a connection without the reader's settings does

    async def scans() -> tuple[int, int]:
        await admin.execute("SELECT pg_stat_force_next_flush()")  # this connection's own, at once
        row = await admin.fetchrow(
            "SELECT seq_scan, idx_scan FROM pg_stat_user_tables WHERE relname = 'commit_feed'"
        )
        return int(row[0]), int(row[1] or 0)

    # Polled: PostgreSQL tells no one when a backend's counts land (about 1 s after it idles).
    with anyio.fail_after(WAIT_S):
        while (await scans())[0] < 3:  # noqa: ASYNC110 (until the copies' scans are counted)
            await asyncio.sleep(0.05)
    seq, idx = await scans()
    for _ in range(5):
        await a.write(note(ref))
    await seen_b.count(206)
    with anyio.fail_after(WAIT_S):
        while sum(await scans()) == seq + idx:  # noqa: ASYNC110 (until the readers' counts land)
            await asyncio.sleep(0.05)
    now_seq, now_idx = await scans()
    assert now_seq == seq
    assert now_idx > idx


async def test_no_connection_of_a_store_compiles_with_jit(stores: OpenStore) -> None:
    """Every statement here is short; JIT compiles any whose estimated cost is high, as the
    estimates on a table without statistics are (hundreds of ms for a read of 0.1 ms)."""
    store = await stores()
    assert [r[0] for r in await store.fetch("SHOW jit")] == ["off"]
    for settings in (SESSION_SETTINGS, READER_SETTINGS):
        conn = await postgres_feed.connect_session(store.url, "test", settings, 5.0, 5.0)
        try:
            assert await conn.fetchval("SHOW jit") == "off"
        finally:
            await conn.close()


# -- two servers ---------------------------------------------------------------------------

StartReplica = Callable[[], Awaitable[ElectricServer]]


@pytest.fixture
async def replicas(tmp_path: Path, postgres_url: str) -> AsyncIterator[StartReplica]:
    """Start servers in this process on the test's database, the one-server lock off."""
    started: list[ElectricServer] = []

    async def start() -> ElectricServer:
        config = ServerConfig(
            listen="127.0.0.1:0",
            data_dir=tmp_path / f"replica{len(started)}",
            drain_grace_s=1.0,
            database_url=postgres_url,
        )
        server = ElectricServer(config, PostgresStore(postgres_url, feed_poll_s=0.05))
        await server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop(0)


Stub = api_grpc.EntityServiceStub


async def sigusr(stub: Stub, ref: pb.EntityRef) -> None:
    await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGUSR))


async def watch_until_end(stub: Stub, ref: pb.EntityRef, seen: list[pb.Event], stop_after: int = 0) -> bool:
    """Watch from ``len(seen)`` on, appending events; True at the end of the stream, False
    once ``stop_after`` more events came (0: never)."""
    call = stub.WatchEvents(api.WatchEventsRequest(ref=ref, from_offset=len(seen)))
    taken = 0
    try:
        async for item in call:
            if item.WhichOneof("item") == "end_of_stream":
                assert item.end_of_stream.head_offset == len(seen)
                return True
            seen.append(item.event)
            taken += 1
            if taken == stop_after:
                return False
    finally:
        call.cancel()
    raise AssertionError("the watch ended without the end of the stream")


async def check_watched(stub: Stub, ref: pb.EntityRef, seen: list[pb.Event]) -> None:
    stored: list[pb.Event] = []
    while page := (
        await stub.ReadEvents(api.ReadEventsRequest(ref=ref, from_offset=len(stored), limit=1000))
    ).events:
        stored.extend(page)
    assert [e.offset for e in seen] == list(range(len(stored)))
    assert [e.SerializeToString(deterministic=True) for e in seen] == [
        e.SerializeToString(deterministic=True) for e in stored
    ]


async def test_a_watch_on_b_sees_what_32_writers_on_a_and_b_commit(replicas: StartReplica) -> None:
    a, b = await replicas(), await replicas()
    async with grpc.aio.insecure_channel(a.address) as to_a, grpc.aio.insecure_channel(b.address) as to_b:
        stub_a, stub_b = Stub(to_a), Stub(to_b)
        ref = pb.EntityRef(type="agent", id="watched")
        await stub_a.SpawnEntity(api.SpawnEntityRequest(ref=ref))
        each = 10
        seen: list[pb.Event] = []

        async def writer(stub: Stub) -> None:
            for _ in range(each):
                await sigusr(stub, ref)

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_until_end, stub_b, ref, seen)
                async with anyio.create_task_group() as writers:
                    for n in range(32):
                        writers.start_soon(writer, stub_a if n % 2 else stub_b)
                await stub_a.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGKILL))
        await check_watched(stub_b, ref, seen)
        assert len(seen) == 1 + 32 * each + 2


async def test_a_watch_resumes_on_b_restarted(replicas: StartReplica) -> None:
    a, b = await replicas(), await replicas()
    ref = pb.EntityRef(type="agent", id="restarted")
    seen: list[pb.Event] = []
    async with grpc.aio.insecure_channel(a.address) as to_a:
        stub_a = Stub(to_a)
        await stub_a.SpawnEntity(api.SpawnEntityRequest(ref=ref))
        writing = True

        async def writer() -> None:
            while writing:
                await sigusr(stub_a, ref)

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(writer)
                async with grpc.aio.insecure_channel(b.address) as to_b:
                    assert not await watch_until_end(Stub(to_b), ref, seen, stop_after=50)
                await b.stop(0)
                b = await replicas()  # a new process's store: it reads the feed from now on
                async with grpc.aio.insecure_channel(b.address) as to_b:
                    assert not await watch_until_end(Stub(to_b), ref, seen, stop_after=50)
                    writing = False
                tg.cancel_scope.cancel()
            await stub_a.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGKILL))
            async with grpc.aio.insecure_channel(b.address) as to_b:
                assert await watch_until_end(Stub(to_b), ref, seen)
                await check_watched(Stub(to_b), ref, seen)


async def test_a_replica_alone_rings_no_doorbell_until_another_listens(stores: OpenStore) -> None:
    """A NOTIFY nobody else hears is left out; a replica that starts is rung for at once (its poll
    is a minute here, so only the doorbell brings it the commit), and one gone is counted out."""
    a = await stores(feed_poll_s=0.01)
    bell, reader = a.doorbell, a.feed_reader
    assert isinstance(bell, Doorbell)
    assert reader is not None
    ref = ("feed", "alone")
    await a.write(spawn(ref))
    await a.write_many([note(ref) for _ in range(3)])
    assert (reader.peers, bell.sent) == (0, 0)

    b = await stores(feed_poll_s=60)
    assert b.feed_reader is not None
    assert b.feed_reader.peers == 1  # counted a as it opened
    await counts(a, lambda n: n >= 1)
    seen_b = Seen(b)
    await a.write(note(ref))
    await seen_b.count(1)
    assert bell.sent >= 1

    await b.close()
    await counts(a, lambda n: n == 0)  # at a's next poll
    assert reader.peers == 0
    sent = bell.sent
    await a.write(note(ref))
    assert bell.sent == sent
