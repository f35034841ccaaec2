"""The PostgreSQL store's lone write in two round trips (postgres_one_write), on a real PostgreSQL.

A batch of one skips the transaction block: a read, then one statement that
commits by itself, compare-and-set on the entity's txid. These tests show it
keeps the batch path's guarantees where it differs from it: writers racing
from two stores (two processes), and a connection lost while its statement is
out, when the write may or may not have committed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, NamedTuple

import anyio
import pytest
from electric_server.fastpaths import forced
from electric_server.store.base import Commit, DatabaseUnavailable, Idempotency, Ref, Write
from electric_server.store.feed_order import FeedOrder, Snapshot
from electric_server.store.postgres import PostgresStore
from electric_server.store.postgres.statements import SELECT_FED_XACT
from helpers import lock_waiter
from test_store import check_stream, committed, note, spawn
from test_store_postgres import behind_a_cutter

pytestmark = pytest.mark.anyio
# Tests of the one-statement path itself (the others hold on the batch path too).
one_trip = pytest.mark.skipif(
    forced("pg_one_trip"), reason="about the one-statement write, whose switch is off: writes take a batch"
)


@one_trip
async def test_a_lone_write_commits_in_two_round_trips_without_a_batch(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    store = stores[0]
    ref: Ref = ("agent", "alone")
    committed(await store.write(spawn(ref)))
    before = store.lone_writes
    for i in range(5):
        committed(await store.write(note(ref, str(i))))
    assert store.lone_writes - before == 5
    await check_stream(store, ref)


async def test_lone_writes_racing_from_two_stores_keep_offsets_gap_free_and_txids_increasing(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    """Each store's lone writes to one entity queue in its process, but the two stores race in
    the database: a write that lost its compare-and-set is decided again on the batch path."""
    ref: Ref = ("agent", "raced")
    committed(await stores[0].write(spawn(ref)))
    writes = [stores[i % 2].write(note(ref, str(i))) for i in range(60)]
    for outcome in await asyncio.gather(*writes):
        committed(outcome)
    assert len(await check_stream(stores[0], ref)) == 1 + 60
    bodies = sorted(e.body for e in await stores[1].read_events(ref, 1, 100))
    assert bodies == sorted(str(i).encode() for i in range(60)), "every write once"


async def test_a_key_stored_by_a_racing_retry_is_replayed(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    ref: Ref = ("agent", "retried")
    committed(await stores[0].write(spawn(ref)))

    def retry(i: int) -> Any:
        write = Write(ref, note(ref, "once").decide, Idempotency("k", b"h"), lambda c: f"{c.txid}".encode())
        return stores[i % 2].write(write)

    outcomes = await asyncio.gather(*(retry(i) for i in range(16)))
    assert [o.replayed for o in outcomes].count(False) == 1
    assert len({o.response for o in outcomes}) == 1
    assert len(await check_stream(stores[1], ref)) == 2


@one_trip
@pytest.mark.parametrize("reached", [True, False], ids=["statement reached", "statement lost"])
async def test_a_connection_lost_with_the_statement_out_is_found_out_and_published_once(
    postgres_url: str, reached: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The statement is its own COMMIT, so a loss while it is out leaves the outcome unknown:
    UNAVAILABLE to the caller; the store ends that backend, waits for it to go, and publishes the
    commit to its watchers if it is in the feed, once, or forgets it. The retry with the same key
    replays what committed, or applies once what did not."""
    caplog.set_level(logging.WARNING, logger="electric_server.store.postgres.one_trip")
    async with behind_a_cutter(postgres_url, reached) as (store, cutter):
        ref: Ref = ("t", "cut")
        committed(await store.write(spawn(("t", "other"))))
        committed(await store.write(spawn(ref)))
        assert store.known.entity(("t", "other")) is not None
        published: list[Commit] = []
        store.hub.subscribe(ref, published.append)
        write = Write(ref, note(ref, "marker-once").decide, Idempotency("n", b"request"), lambda c: b"noted")
        # Read, then written: a guess could miss (its clock window is 10 ms, which a loaded
        # machine overruns), and the cutter would then cut a statement that wrote nothing.
        store.known.forget(ref)
        cutter.marker, cutter.armed = b"marker-once", True
        with anyio.fail_after(10), pytest.raises(DatabaseUnavailable, match="may or may not have committed"):
            await store.write(write)
        assert cutter.cut.is_set()
        # Nothing known is guessed on after a lost connection (the database may be another now).
        assert store.known.entity(("t", "other")) is None
        assert store.known.take_spare(above=0) is None
        with anyio.fail_after(10):
            while store.finding_out:
                await asyncio.gather(*store.finding_out, return_exceptions=True)
        assert [[e.body for e in c.events] for c in published] == ([[b"marker-once"]] if reached else [])
        said = "had committed" if reached else "had not committed"
        assert any(said in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
        retried = await store.write(write)
        assert (retried.replayed, retried.response) == (reached, b"noted")
        assert [e.body for e in await store.read_events(ref, 1, 10)] == [b"marker-once"]
        assert len(published) == 1, "published once: found out, or written by the retry"
        await check_stream(store, ref)


class _Record(NamedTuple):
    """What the feed order reads of an entity's record: its txid."""

    txid: int


def _commit(txid: int, before: int | None) -> Commit:
    prior: Any = None if before is None else _Record(before)
    return Commit(("t", "e"), txid, 0, (), prior, _Record(txid), None)  # type: ignore[arg-type]


def test_a_remote_commit_after_a_lone_write_still_out_waits_for_it() -> None:
    """The feed order holds the entity's later commits while a lone write's statement is out
    (``sending``) and publishes them after it (``committed``), as for a COMMIT under way."""
    published: list[int] = []
    order = FeedOrder(lambda commits: published.extend(c.txid for c in commits), lambda: None)
    order.snapshot = Snapshot(10, 10, frozenset())
    order.sending([5])
    order.read(Snapshot(12, 12, frozenset()), [_commit(6, 5)])  # another replica's, after ours
    assert published == [], "held for the lone write still out"
    order.committing(11, ())
    order.committed([_commit(5, None)], [None])
    assert published == [5, 6]
    order.sending([7])
    order.forgotten([7])
    order.read(Snapshot(13, 13, frozenset()), [_commit(8, 6)])
    assert published == [5, 6, 8], "a forgotten txid holds nothing"


@one_trip
async def test_a_caller_cancelled_with_the_statement_out_is_found_out(
    stores: tuple[PostgresStore, PostgresStore], admin: Any
) -> None:
    """A lone write runs in its caller's task; cancelled while its statement waits (here for a row
    lock the test holds), the statement may still commit, so the store closes that connection and
    finds out as for a lost one: the backend is ended, nothing was committed, nothing published,
    and the entity takes the next write."""
    store = stores[0]
    ref: Ref = ("t", "cancelled")
    committed(await store.write(spawn(ref)))
    published: list[Commit] = []
    store.hub.subscribe(ref, published.append)
    holder = admin.transaction()
    await holder.start()
    await admin.execute("SELECT 1 FROM entities WHERE type = 't' AND id = 'cancelled' FOR UPDATE")
    write = asyncio.ensure_future(store.write(note(ref, "never")))
    await lock_waiter(admin)
    write.cancel()
    with anyio.fail_after(10):
        with pytest.raises(asyncio.CancelledError):
            await write
        while store.finding_out:
            await asyncio.gather(*store.finding_out, return_exceptions=True)
    await holder.rollback()
    assert published == []
    committed(await store.write(note(ref, "next")))
    assert [e.body for e in await store.read_events(ref, 1, 10)] == [b"next"]
    assert [[e.body for e in c.events] for c in published] == [[b"next"]]


async def test_finding_out_reads_the_feed_from_before_the_write_only(
    stores: tuple[PostgresStore, PostgresStore], admin: Any
) -> None:
    """The feed keeps ten minutes of every replica's commits; a lost write is looked for among
    the transactions since a snapshot taken before its statement went out, by the xact index,
    not by reading them all."""
    store = stores[0]
    ref: Ref = ("t", "many")
    committed(await store.write(spawn(ref)))
    for _ in range(16):
        await store.write_many([note(ref) for _ in range(256)])
    await admin.execute("ANALYZE commit_feed")
    floor = Snapshot.parse(await admin.fetchval("SELECT pg_current_snapshot()::text")).xmax
    [[plan]] = await admin.fetch(f"EXPLAIN (FORMAT JSON) {SELECT_FED_XACT}", store.origin, 1, str(floor))
    nodes, scans = [json.loads(plan)[0]["Plan"]], []
    while nodes:
        node = nodes.pop()
        nodes.extend(node.get("Plans", ()))
        if node.get("Relation Name") == "commit_feed" or "Index Name" in node:
            scans.append((node["Node Type"], node.get("Index Name")))
    assert scans, plan
    assert all(kind != "Seq Scan" and index == "commit_feed_by_xact" for kind, index in scans), scans
