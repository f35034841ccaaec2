"""The stores' contract, on both (``any_store``: SQLite on a real file, PostgreSQL on a database
of its own): refusals, per-entity offsets, reopen, every field's round trip. Then SQLite's own:
group commit, durability, checkpoints, and a writer that no error ends silently."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from electric_server.core import entity_writes
from electric_server.fastpaths import ENV, forced
from electric_server.fastpaths.ready_queue import BUSY, ready_queue
from electric_server.fastpaths.wal_index import FRAMES_PER_WRITE, Estimate, WalIndex, frame_counter
from electric_server.store.base import (
    Commit,
    Decide,
    EntityRecord,
    Idempotency,
    Mutation,
    NewEvent,
    Ref,
    StorageFailed,
    Store,
    StoreError,
    Write,
    WriteContext,
    WriteOutcome,
)
from electric_server.store.postgres import PostgresStore
from electric_server.store.sqlite import SQLiteStore
from electric_server.store.sqlite.wal import CHECKPOINT_FRAMES, INLINE_SYNC_S

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import State

pytestmark = pytest.mark.anyio


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "electric.db")
    await s.open()
    yield s
    await s.close()


@pytest.fixture(params=["sqlite", "postgres"])
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Store]:
    """Makes stores on one storage (opened by the test): a SQLite file, or a PostgreSQL database."""
    if request.param == "sqlite":
        return lambda: SQLiteStore(tmp_path / "electric.db")
    url = request.getfixturevalue("postgres_url")
    return lambda: PostgresStore(url)


@pytest.fixture
async def any_store(new_store: Callable[[], Store]) -> AsyncIterator[Store]:
    s = new_store()
    await s.open()
    yield s
    await s.close()


def spawn(ref: Ref) -> Write:
    return Write(ref, entity_writes.spawn(ref, 30_000, 60_000))


def note(ref: Ref, text: str = "n") -> Write:
    """Append one custom event to an existing entity."""

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        assert current is not None
        return Mutation([NewEvent("note", f"note_{ctx.txid}", pb.OPERATION_INSERT, text.encode())], current)

    return Write(ref, decide)


class Refused(StoreError):
    pass


def refuse(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
    raise Refused("no")


def committed(outcome: WriteOutcome | BaseException) -> WriteOutcome:
    assert isinstance(outcome, WriteOutcome), outcome
    assert outcome.commit is not None
    return outcome


async def check_stream(store: Store, ref: Ref) -> list[int]:
    """Offsets gap-free from 0 and txids strictly increasing; returns the txids."""
    events = await store.read_events(ref, 0, 10_000)
    record = await store.get_entity(ref)
    assert record is not None
    assert [e.offset for e in events] == list(range(record.head_offset))
    txids = [e.txid for e in events]
    assert all(a < b for a, b in itertools.pairwise(txids)), txids
    assert record.txid == txids[-1]
    return txids


async def test_group_commit_batches_but_each_write_is_its_own_transaction(store: SQLiteStore) -> None:
    refs: list[Ref] = [("agent", f"e{i}") for i in range(20)]
    for outcome in await store.write_many([spawn(r) for r in refs]):
        committed(outcome)
    batches = store.batches_committed
    writes = [note(refs[i % len(refs)], str(i)) for i in range(200)]
    outcomes = await asyncio.gather(*(store.write(w) for w in writes))
    assert store.batches_committed - batches <= 10, "200 concurrent writes should share a few fsyncs"
    txids = [committed(o).commit.txid for o in outcomes]  # type: ignore[union-attr]
    assert sorted(txids) == list(range(min(txids), min(txids) + 200)), "one txid per write, no gaps"
    for o in outcomes:
        commit = committed(o).commit
        assert commit is not None
        assert len(commit.events) == 1
        assert commit.events[0].txid == commit.txid
    for ref in refs:
        assert len(await check_stream(store, ref)) == 1 + 10
    assert await store.head_txid() == max(txids)


@pytest.mark.parametrize("delay_ms", [0, 100])
async def test_a_commit_delay_lets_a_later_write_share_the_commit(tmp_path: Path, delay_ms: int) -> None:
    """--commit-delay: once batches have company, the writer waits for more before committing, so
    a write that comes after it woke up still shares the commit; without a delay it gets its own."""
    store = SQLiteStore(tmp_path / "electric.db", commit_delay_ms=delay_ms)
    await store.open()
    try:
        refs: list[Ref] = [("agent", "a"), ("agent", "b")]
        for outcome in await store.write_many([spawn(r) for r in refs]):  # a batch of two: company
            committed(outcome)
        batches = store.batches_committed
        first = asyncio.ensure_future(store.write(note(refs[0])))
        for _ in range(3):  # scheduling passes, not a wait: the writer takes `first` (or waits)
            await asyncio.sleep(0)
        second = asyncio.ensure_future(store.write(note(refs[1])))
        outcomes = await asyncio.gather(first, second)
        txids = [committed(o).commit.txid for o in outcomes]  # type: ignore[union-attr]
        assert txids[1] == txids[0] + 1
        assert store.batches_committed - batches == (1 if delay_ms else 2)
    finally:
        await store.close()


def test_a_commit_delay_is_bounded(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="the commit delay must be 0-100 ms"):
        SQLiteStore(tmp_path / "electric.db", commit_delay_ms=101)


async def test_a_refused_write_leaves_no_trace_and_spares_its_batch(any_store: Store) -> None:
    store = any_store
    ref: Ref = ("agent", "a")
    committed(await store.write(spawn(ref)))
    before = await store.get_entity(ref)
    batches = store.batches_committed
    first, refused, second = await store.write_many([note(ref, "1"), Write(ref, refuse), note(ref, "2")])
    assert store.batches_committed == batches + 1, "one batch"
    assert isinstance(refused, Refused)
    a, b = committed(first).commit, committed(second).commit
    assert a is not None
    assert b is not None
    assert b.txid == a.txid + 1, "the refused write took no txid"
    assert [e.offset for e in (*a.events, *b.events)] == [1, 2]
    events = await store.read_events(ref, 0, 100)
    assert [e.body for e in events[1:]] == [b"1", b"2"]
    after = await store.get_entity(ref)
    assert after is not None
    assert before is not None
    assert after.head_offset == before.head_offset + 2
    # Through `write`, the refusal is raised to the caller; concurrent writes are unaffected.
    results = await asyncio.gather(
        store.write(note(ref, "3")),
        store.write(Write(ref, refuse)),
        store.write(note(ref, "4")),
        return_exceptions=True,
    )
    assert isinstance(results[1], Refused)
    committed(results[0])
    committed(results[2])
    assert [e.body for e in (await store.read_events(ref, 3, 100))] == [b"3", b"4"]
    await check_stream(store, ref)


async def test_offsets_are_per_entity_and_gap_free(any_store: Store) -> None:
    store = any_store
    a, b = ("agent", "a"), ("agent", "b")
    for outcome in await store.write_many([spawn(a), spawn(b)]):
        committed(outcome)
    mixed = [note(a if i % 3 else b, str(i)) for i in range(60)]
    await asyncio.gather(*(store.write(w) for w in mixed))
    txids_a, txids_b = await check_stream(store, a), await check_stream(store, b)
    assert (len(txids_a), len(txids_b)) == (1 + 40, 1 + 20)
    assert not set(txids_a) & set(txids_b), "a txid belongs to one entity's transaction"
    assert await store.read_events(a, 41, 10) == []


async def test_reopen_keeps_everything_and_continues_txids(new_store: Callable[[], Store]) -> None:
    store = new_store()
    await store.open()
    refs: list[Ref] = [("agent", f"e{i}") for i in range(5)]
    await store.write_many([spawn(r) for r in refs])
    await asyncio.gather(*(store.write(note(r)) for r in refs))
    idem = Idempotency("key-1", b"hash")
    remembered = await store.write(Write(refs[0], note(refs[0]).decide, idem, lambda c: b"answer"))
    head = await store.head_txid()
    records = [await store.get_entity(r) for r in refs]
    events = [await store.read_events(r, 0, 100) for r in refs]
    await store.close()

    reopened = new_store()
    await reopened.open()
    try:
        assert await reopened.head_txid() == head
        assert [await reopened.get_entity(r) for r in refs] == records
        assert [await reopened.read_events(r, 0, 100) for r in refs] == events
        assert await reopened.list_entities(None, (), None, 100) == records
        assert await reopened.idempotent_response(refs[0], "key-1") == (b"hash", b"answer")
        retried = await reopened.write(Write(refs[0], note(refs[0]).decide, idem, lambda c: b"other"))
        assert (retried.replayed, retried.response) == (True, remembered.response)
        nxt = committed(await reopened.write(note(refs[1])))
        assert nxt.commit is not None
        assert nxt.commit.txid > head  # (PostgreSQL's txids may skip numbers: store/base.py)
        assert nxt.commit.events[0].offset == 2  # after its spawn and one note
    finally:
        await reopened.close()


async def test_stopping_deadlines_follow_the_state(any_store: Store) -> None:
    store = any_store
    ref: Ref = ("agent", "s")
    committed(await store.write(spawn(ref)))

    def to(state: State, deadline: int | None) -> Decide:
        def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
            assert current is not None
            return Mutation([], current.replace(state=state, stopping_deadline_ms=deadline))

        return decide

    committed(await store.write(Write(ref, to(State.STOPPING, 123_456))))
    assert await store.stopping_deadlines() == [(ref, 123_456)]
    committed(await store.write(Write(ref, to(State.KILLED, None))))
    assert await store.stopping_deadlines() == []


@pytest.mark.parametrize(
    ("mode", "level", "syncs_itself"),
    [(None, 1, True), ("FULL", 1, True), ("NORMAL", 1, False), ("EXTRA", 3, False)],
)
async def test_synchronous_full_by_default(
    tmp_path: Path, mode: str | None, level: int, syncs_itself: bool
) -> None:
    """FULL is SQLite at NORMAL plus the store's own WAL sync after every commit."""
    store = (
        SQLiteStore(tmp_path / "electric.db")
        if mode is None
        else SQLiteStore(tmp_path / "x.db", synchronous=mode)
    )
    await store.open()
    try:
        assert store.synchronous == (mode or "FULL")
        # Ask the writer's own connection, on the writer's thread.
        sync, journal = await store.on_writer(
            lambda conn: (
                conn.execute("PRAGMA synchronous").fetchone()[0],
                conn.execute("PRAGMA journal_mode").fetchone()[0],
            ),
        )
        assert (sync, journal) == (level, "wal")
        assert (store.wal.syncs_itself) == syncs_itself
        ref = ("t", "a")
        committed(await store.write(spawn(ref)))  # a lone write: synced on the loop
        committed_batches = store.wal.committed
        await asyncio.gather(*(store.write(note(ref)) for _ in range(5)))  # a burst: a batch of several
        assert store.wal.committed > committed_batches
        if syncs_itself:
            assert store.wal.synced == store.wal.committed, "every acknowledged batch was synced"
        assert (await store.get_entity(ref)) is not None
    finally:
        await store.close()
    with pytest.raises(ValueError, match="synchronous"):
        SQLiteStore(tmp_path / "y.db", synchronous="SOMETIMES")


class _GatedExecutor(ThreadPoolExecutor):
    """The store's sync thread, held at the door: each sync waits for ``opened``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(1)
        self.loop = loop
        self.requested = asyncio.Event()
        self.opened = threading.Event()

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.loop.call_soon_threadsafe(self.requested.set)

        def gated() -> Any:
            self.opened.wait(30)
            return fn(*args, **kwargs)

        return super().submit(gated)


def _gate_syncs(store: SQLiteStore) -> _GatedExecutor:
    gate = _GatedExecutor(asyncio.get_running_loop())
    store.wal.use_sync_thread(gate)
    return gate


@pytest.mark.skipif(
    forced("sqlite_inline_sync"),
    reason="about the sync on the loop; with its switch off every sync runs in the thread, as the next test's",
)
async def test_a_fast_disks_syncs_run_on_the_loop_and_a_slow_ones_in_the_sync_thread(
    store: SQLiteStore,
) -> None:
    """Where a burst's sync runs follows how long syncs took lately, measured wherever they ran."""
    a, b = ("t", "a"), ("t", "b")
    committed(await store.write(spawn(a)))
    committed(await store.write(spawn(b)))
    gate = _gate_syncs(store)
    store.wal.inline.average_s = 0.0  # a fast disk's
    outcomes = await asyncio.wait_for(store.write_many([note(a), note(b)]), 10)
    assert all(isinstance(o, WriteOutcome) for o in outcomes)
    assert not gate.requested.is_set(), "synced on the loop: the thread was never asked"
    assert store.wal.synced == store.wal.committed
    assert store.wal.inline.average_s > 0.0  # the sync's own duration, averaged in

    # A disk whose syncs took a minute: any real sync is shorter, so it pulls the average down.
    slow = store.wal.inline.average_s = 60.0
    burst = asyncio.ensure_future(store.write_many([note(a), note(b)]))
    await asyncio.wait_for(gate.requested.wait(), 10)  # the sync went to the thread
    gate.opened.set()
    await asyncio.wait_for(burst, 10)
    assert store.wal.synced == store.wal.committed
    assert store.wal.inline.average_s < slow  # this sync, measured in the thread, was averaged in


async def test_a_commit_is_acknowledged_published_and_readable_only_once_synced(store: SQLiteStore) -> None:
    """A burst commits on the loop and (on a slow disk) syncs in the sync thread: until the
    fdatasync returns, no writer is answered, no watcher told and no read shown the change."""
    a, b = ("t", "a"), ("t", "b")
    committed(await store.write(spawn(a)))
    committed(await store.write(spawn(b)))
    gate = _gate_syncs(store)
    store.wal.inline.average_s = INLINE_SYNC_S * 10  # a slow disk's: bursts sync in the thread
    seen: list[Ref] = []
    store.hub.subscribe_all(lambda commit: seen.append(commit.ref))
    burst = asyncio.ensure_future(store.write_many([note(a), note(b)]))  # two writes: not a lone one
    try:
        await asyncio.wait_for(gate.requested.wait(), 10)  # committed; its sync is waiting at the gate
        read = asyncio.ensure_future(store.get_entity(a))
        events = asyncio.ensure_future(store.read_events(b, 0, 10))
        for _ in range(20):  # many turns of the loop: enough for any of them to finish if not held
            await asyncio.sleep(0)
        assert not burst.done()
        assert not read.done()
        assert not events.done()
        assert seen == []
    finally:
        gate.opened.set()
    outcomes = await asyncio.wait_for(burst, 10)
    assert all(isinstance(o, WriteOutcome) and o.commit is not None for o in outcomes)
    record = await asyncio.wait_for(read, 10)
    assert record is not None
    assert record.head_offset == 2  # what it shows is what was synced
    assert [e.kind for e in await asyncio.wait_for(events, 10)][-1] == "note"
    assert seen == [a, b]


async def test_a_failed_wal_sync_acknowledges_nothing_and_stops_the_store(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "electric.db")
    await store.open()
    try:
        ref = ("t", "a")
        committed(await store.write(spawn(ref)))
        assert store.wal.fd is not None
        os.close(store.wal.fd)  # the next fdatasync fails with a real OSError (EBADF)
        with pytest.raises(StorageFailed, match="Bad file descriptor"):
            await store.write(note(ref))
        with pytest.raises(StorageFailed, match="Bad file descriptor"):  # at once, for good
            await store.write_many([note(ref), note(ref)])
    finally:
        await store.close()


async def test_a_subscriber_that_raises_stops_neither_the_writer_nor_the_others(
    any_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    store = any_store
    seen: list[Ref] = []

    def broken(commit: Commit) -> None:
        raise ValueError("a bug in a subscriber")

    store.hub.subscribe_all(broken)
    store.hub.subscribe_all(lambda commit: seen.append(commit.ref))
    a, b = ("t", "a"), ("t", "b")
    # Two writes: through the writer task, which the subscriber's error used to end.
    for outcome in await asyncio.wait_for(store.write_many([spawn(a), spawn(b)]), 10):
        assert not isinstance(outcome, BaseException)
    failures = [r for r in caplog.records if "subscriber" in r.getMessage()]
    assert failures
    assert all(r.exc_info is not None for r in failures)  # with its traceback
    for outcome in await asyncio.wait_for(store.write_many([note(a), note(b)]), 10):
        assert not isinstance(outcome, BaseException)
    assert seen == [a, b, a, b]


async def test_an_unexpected_error_in_a_batch_fails_that_batch_loudly_and_the_writer_goes_on(
    store: SQLiteStore, caplog: pytest.LogCaptureFixture
) -> None:
    a = ("t", "a")

    def encode(commit: Commit) -> bytes:
        raise TypeError("a bug in a response's encoder")

    broken = Write(a, entity_writes.spawn(a, 30_000, 60_000), encode=encode)
    with pytest.raises(TypeError, match="encoder"):  # one batch, one transaction: all of it rolled back
        await asyncio.wait_for(store.write_many([broken, spawn(("t", "other"))]), 10)
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info is not None]
    assert len(logged) == 1
    assert "during a commit" in logged[0].getMessage()
    assert await store.get_entity(a) is None
    assert await store.get_entity(("t", "other")) is None
    for outcome in await asyncio.wait_for(store.write_many([spawn(a), note(a)]), 10):
        assert not isinstance(outcome, BaseException)
    assert (await store.get_entity(a)) is not None


async def test_the_store_checkpoints_the_wal_so_it_stops_growing(store: SQLiteStore) -> None:
    """SQLite's own checkpoint is off (it would run on the loop); the store's keeps
    the WAL about as small as SQLite's default 1,000 pages would."""
    refs = [("t", f"e{i}") for i in range(200)]
    await store.write_many([spawn(r) for r in refs])
    for i in range(3000):  # lone writes, one commit each: about 4 WAL pages apiece
        committed(await store.write(note(refs[i % len(refs)])))
    wal = os.path.getsize(f"{store.path}-wal")  # noqa: ASYNC240 (one stat call)
    assert wal < 16 * 1024 * 1024, f"the WAL grew to {wal} bytes: checkpoints are not running"
    assert store.checkpoints >= 5  # ~3,000 commits of ~3 pages each: about 9 checkpoints of 1,000 pages
    assert len(await store.read_events(refs[0], 0, 100)) == 16  # the spawn record and 15 notes


@pytest.mark.skipif(
    forced("wal_index"),
    reason="about the WAL index header; test_the_wal_index_fallback_still_checkpoints runs this load on the fallback",
)
async def test_checkpoints_follow_the_frames_sqlite_wrote(store: SQLiteStore) -> None:
    """Checkpoints are scheduled by the frames the WAL index says were appended,
    not by an estimate per write: a batch of many writes to one entity changes a
    few pages, so it must not checkpoint as if each write had changed three."""
    ref = ("t", "busy")
    await store.write_many([spawn(ref)])
    for _ in range(4):  # 4 batches of 256 writes: 3,072 frames at 3 per write
        for outcome in await store.write_many([note(ref) for _ in range(256)]):
            committed(outcome)
    wal_bytes = os.path.getsize(f"{store.path}-wal")  # noqa: ASYNC240 (one stat call)
    frames = (wal_bytes - 32) // (4096 + 24)  # WAL header, then frames of header + page
    assert store.checkpoints == 0, f"{store.checkpoints} checkpoints for {frames} frames"
    assert 0 < frames < 200
    assert store.wal.frames_since_checkpoint == frames
    assert len(await store.read_events(ref, 0, 2000)) == 1 + 4 * 256


async def test_a_wal_pinned_by_a_reader_checkpoints_every_1000_pages_not_every_write(
    store: SQLiteStore,
) -> None:
    """A reader's open snapshot keeps the WAL from restarting, so it keeps growing;
    pages are then counted from where the last checkpoint left them, not from the
    start of the WAL (which would checkpoint after every write)."""
    ref = ("t", "pinned")
    await store.write_many([spawn(ref)])
    reader = sqlite3.connect(store.path, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM events").fetchone()  # the snapshot is now held
        for _ in range(1500):  # ~3 pages each: ~4,500 pages
            committed(await store.write(note(ref)))
        pinned = store.checkpoints
        assert 2 <= pinned <= 8, f"{pinned} checkpoints for ~4,500 pages"
        wal_bytes = os.path.getsize(f"{store.path}-wal")  # noqa: ASYNC240 (one stat call)
        assert wal_bytes > 3_000 * 4096, "the reader's snapshot should have kept the WAL growing"
    finally:
        reader.execute("COMMIT")
        reader.close()
    for _ in range(1500):
        committed(await store.write(note(ref)))
    assert store.checkpoints - pinned <= 8
    assert len(await store.read_events(ref, 0, 5000)) == 3001


def test_an_unreadable_wal_index_header_is_none(tmp_path: Path) -> None:
    """Where the header is not SQLite's 3.7.0 wal-index layout, the store falls back
    to its estimate instead of trusting what it read."""
    shm = tmp_path / "x.db-shm"
    for content in (b"", b"\0" * 40, (3007001).to_bytes(4, "little") + b"\0" * 36):
        shm.write_bytes(content)
        assert WalIndex.open(tmp_path / "x.db") is None
    assert WalIndex.open(tmp_path / "missing.db") is None


async def test_the_wal_index_fallback_still_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the wal_index seam's fallback, checkpoints follow its estimate of 3 frames
    a write: the load of test_checkpoints_follow_the_frames_sqlite_wrote, whose few
    frames called for no checkpoint, now checkpoints twice, and lone writes keep the
    WAL from growing."""
    monkeypatch.setenv(ENV, "wal_index")
    store = SQLiteStore(tmp_path / "electric.db")
    await store.open()
    try:
        ref = ("t", "busy")
        await store.write_many([spawn(ref)])
        for _ in range(4):  # 4 batches of 256 writes: 3,075 frames, counted after each batch
            for outcome in await store.write_many([note(ref) for _ in range(256)]):
                committed(outcome)
        assert store.checkpoints == 2  # after the 2nd batch (1,539 frames) and the 4th (1,536)
        assert store.wal.frames_since_checkpoint == 0
        for _ in range(1000):  # lone writes, one commit each: 3,000 frames
            committed(await store.write(note(ref)))
        assert store.checkpoints >= 4
        assert store.wal.frames_since_checkpoint < CHECKPOINT_FRAMES
        wal = os.path.getsize(f"{store.path}-wal")  # noqa: ASYNC240 (one stat call)
        assert wal < 16 * 1024 * 1024, f"the WAL grew to {wal} bytes: checkpoints are not running"
        assert len(await store.read_events(ref, 0, 3000)) == 1 + 4 * 256 + 1000
    finally:
        await store.close()


def test_the_wal_index_seam_falls_back_to_the_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The estimate where the header cannot be read, or where the fallback is forced."""
    db = tmp_path / "x.db"
    monkeypatch.setenv(ENV, "")
    assert isinstance(frame_counter(db), Estimate)  # no -shm file
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (x)")
        counter = frame_counter(db)
        assert isinstance(counter, WalIndex)
        counter.close()
        monkeypatch.setenv(ENV, "wal_index")
        assert isinstance(frame_counter(db), Estimate)
    finally:
        conn.close()
    assert Estimate().appended(10, 2) == 10 + 2 * FRAMES_PER_WRITE


@pytest.mark.parametrize("fallback", [False, True], ids=["ready_queue", "ready_queue_fallback"])
async def test_a_lone_write_commits_in_its_callers_task_unless_the_ready_queue_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fallback: bool
) -> None:
    """A write alone commits right in its caller's task: the ready_queue seam finds
    nothing else ready on the loop. With the seam's fallback it goes through the
    writer task, every time."""
    monkeypatch.setenv(ENV, "ready_queue" if fallback else "")
    store = SQLiteStore(tmp_path / "electric.db")
    await store.open()
    try:
        publishers: list[asyncio.Task[Any] | None] = []
        store.hub.subscribe_all(lambda commit: publishers.append(asyncio.current_task()))
        ref = ("t", "a")
        committed(await store.write(spawn(ref)))  # the writer task's first turn may still be ready
        for _ in range(3):
            committed(await store.write(note(ref)))
        expected = store.committer.writer_tasks[0] if fallback else asyncio.current_task()
        assert publishers[1:] == [expected] * 3
        assert len(await store.read_events(ref, 0, 10)) == 4
    finally:
        await store.close()


def test_a_loop_without_a_ready_queue_is_always_busy() -> None:
    loop = asyncio.AbstractEventLoop()  # the interface alone, as a loop that keeps its own queue
    assert ready_queue(loop) is BUSY
    assert len(BUSY) > 0


def change(**fields: Any) -> Decide:
    """A write that appends a note and changes the given entity fields."""

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        assert current is not None
        event = NewEvent("note", f"note_{ctx.txid}", pb.OPERATION_INSERT, b"n")
        return Mutation([event], current.replace(**fields))

    return decide


@pytest.mark.parametrize(
    "fields",
    [
        {},  # only what every write changes: updated_at, head_offset, txid
        {"state": State.RUNNING},
        {"state": State.STOPPING, "stopping_deadline_ms": 123_456},
        {"lease_epoch": 7, "message_cursor": 3, "cursor_attempt": 2, "last_message_offset": 9},
        {"reload_pending": True, "closed": True},
        {"grace_ms": 5, "idle_timeout_ms": 6},
        {"cancelled_messages": (4, 7), "grace_pending": True, "idle_timeout_pending": True},
    ],
)
async def test_an_entity_row_written_with_only_its_changed_columns_matches_the_commit(
    any_store: Store, fields: dict[str, Any]
) -> None:
    store = any_store
    """The batch writes only the columns that changed: what the file then holds, and
    what the indexes find, must be exactly the record the commit reported."""
    ref, other = ("t", "a"), ("t", "b")
    await store.write_many([spawn(ref), spawn(other)])
    outcomes = await store.write_many([Write(ref, change(**fields)), Write(other, change())])
    after = committed(outcomes[0]).commit.after  # type: ignore[union-attr]
    assert await store.get_entity(ref) == after
    assert await store.get_entity(other) == committed(outcomes[1]).commit.after  # type: ignore[union-attr]
    state = fields.get("state", State.SPAWNING)
    assert ref in [r.ref for r in await store.list_entities("t", [state], None, 10)]
    expected = [(ref, 123_456)] if "stopping_deadline_ms" in fields else []
    assert await store.stopping_deadlines() == expected
    if not fields.get("closed"):  # a closed stream takes no more events
        lone = committed(await store.write(Write(ref, change())))  # and a lone write after it
        assert await store.get_entity(ref) == lone.commit.after  # type: ignore[union-attr]
