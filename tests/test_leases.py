"""Leases in the store: a holder is judged live inside the write's transaction (store/sessions.py).

Every test runs on both stores (SQLite's book is in memory, PostgreSQL's is
shared by replicas); the ones about several replicas use two PostgreSQL
stores on one database, as two replicas do.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from electric_server.core import entity_writes
from electric_server.core.validation import REQUEST_KEY_PREFIX
from electric_server.runtime.writes import Refused, end_lease, grant, settle_ignored
from electric_server.store.base import EntityRecord, Idempotency, Ref, Store, Write, WriteContext
from electric_server.store.postgres import PostgresStore
from electric_server.store.postgres.sessions import PostgresSessions
from electric_server.store.postgres.statements import SELECT_LOST_LEASES as PG_LOST_LEASES
from electric_server.store.postgres.statements import SWEEP_FINDS as PG_SWEEP_FINDS
from electric_server.store.sessions import SessionRow
from electric_server.store.sqlite import SQLiteStore
from electric_server.store.sqlite.schema import SELECT_HELD_BY as SQLITE_HELD_BY
from electric_server.store.sqlite.schema import SELECT_HOLDERS as SQLITE_HOLDERS
from test_store import committed, spawn

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import HOSTED_STATES, Signal, State

pytestmark = pytest.mark.anyio

TTL_MS = 60_000
REF: Ref = ("agent", "a")
SPEC = entity_writes.SignalSpec(Signal.SIGUSR)


@pytest.fixture(params=["sqlite", "postgres"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "sqlite":
        store: Store = SQLiteStore(tmp_path / "electric.db")
    else:
        store = PostgresStore(request.getfixturevalue("postgres_url"))
    await store.open()
    yield store
    await store.close()


def session(id: str, worker: str = "w", replica: str = "r1") -> SessionRow:
    return SessionRow(id, worker, replica, ("agent",), "v1", 0)


async def granted(store: Store, ref: Ref, session_id: str) -> int:
    record = await store.get_entity(ref)
    assert record is not None
    outcome = committed(await store.write(Write(ref, grant(ref, record.lease_epoch, session_id))))
    assert outcome.commit is not None
    return int(outcome.commit.result.epoch)


async def test_a_live_holder_keeps_its_lease_and_a_holder_whose_session_ended_loses_it(
    any_store: Store,
) -> None:
    store = any_store
    committed(await store.write(spawn(REF)))
    await store.sessions.open(session("s1", "w1"), TTL_MS)
    await store.sessions.open(session("s2", "w2"), TTL_MS)
    first = await granted(store, REF, "s1")
    with pytest.raises(Refused, match="a live runtime holds"):
        await granted(store, REF, "s2")
    await store.sessions.end(["s1"])
    second = await granted(store, REF, "s2")
    assert second > first + 1  # the lost lease's end, then the new grant: both fence s1 off
    record = await store.get_entity(REF)
    assert record is not None
    assert record.lease_session == "s2"


async def test_a_terminal_stream_stays_open_while_its_holder_lives(any_store: Store) -> None:
    store = any_store
    committed(await store.write(spawn(REF)))
    await store.sessions.open(session("s1"), TTL_MS)
    epoch = await granted(store, REF, "s1")
    signal = entity_writes.signal(REF, entity_writes.SignalSpec(Signal.SIGKILL))
    after = committed(await store.write(Write(REF, signal))).commit.after  # type: ignore[union-attr]
    assert after is not None
    assert after.state is State.KILLED
    assert not after.closed  # its runtime may still append its closing records
    assert await store.settled_streams(60_000, 10) == []
    committed(await store.write(Write(REF, end_lease(REF, epoch, "released"))))
    record = await store.get_entity(REF)
    assert record is not None
    assert record.closed
    assert record.lease_session == ""


async def test_a_lease_whose_holder_expired_is_found_lost(any_store: Store) -> None:
    store = any_store
    committed(await store.write(spawn(REF)))
    await store.sessions.open(session("s1"), 0)  # expired at once, by the store's clock
    await granted(store, REF, "s1")
    lost = await store.lost_leases(10)
    record = await store.get_entity(REF)
    assert record is not None
    assert lost == [(REF, record.lease_epoch)]


async def test_a_reader_is_told_only_the_live_holders(any_store: Store) -> None:
    """``holders`` (GetEntity's lease holder): a session ended or expired holds nothing any more,
    whatever an entity's row still names."""
    store = any_store
    live, expired, ended = session("s1", "w1"), session("s2", "w2"), session("s3", "w3")
    await store.sessions.open(live, TTL_MS)
    await store.sessions.open(expired, 0)  # expired at once, by the store's clock
    await store.sessions.open(ended, TTL_MS)
    await store.sessions.end(["s3"])
    assert await store.sessions.holders(["s1", "s2", "s3", "never"]) == {"s1": live}
    assert await store.sessions.holders([]) == {}


@pytest.fixture
async def replicas(any_store: Store, postgres_url: str) -> AsyncIterator[tuple[Store, PostgresStore]]:
    """Replica a (the test's store) holds REF for worker w's session a-1; replica b is a second
    store on the same database."""
    if isinstance(any_store, SQLiteStore):
        pytest.skip("SQLite is one server")
    b = PostgresStore(postgres_url)
    await b.open()
    committed(await any_store.write(spawn(REF)))
    await any_store.sessions.open(session("a-1", "w", "ra"), TTL_MS)
    await granted(any_store, REF, "a-1")
    yield any_store, b
    await b.close()


async def test_replicas_share_holders_and_a_hello_on_one_ends_the_session_on_the_other(
    replicas: tuple[Store, PostgresStore],
) -> None:
    a, b = replicas
    await b.sessions.open(session("b-1", "other", "rb"), TTL_MS)
    with pytest.raises(Refused, match="a live runtime holds"):
        await granted(b, REF, "b-1")
    await b.sessions.open(session("b-2", "w", "rb"), TTL_MS)  # worker w says hello to replica b
    assert await a.sessions.renew("ra", ["a-1"], TTL_MS) == set()  # a learns its session ended
    assert [ref for ref, _ in await b.lost_leases(10)] == [REF]
    await granted(b, REF, "b-2")


async def test_a_replica_that_stops_renewing_loses_its_sessions(
    replicas: tuple[Store, PostgresStore],
) -> None:
    """Its sessions' own rows are unexpired: the replica's row, not renewed, ends them."""
    a, b = replicas
    assert await b.lost_leases(10) == []
    assert list(await b.sessions.holders(["a-1"])) == ["a-1"]  # another replica's, seen from b
    await a.sessions.renew("ra", [], 0)  # the replica's row expires (as if it had stopped renewing)
    assert [ref for ref, _ in await b.lost_leases(10)] == [REF]
    assert await b.sessions.holders(["a-1"]) == {}


async def test_runtime_request_keys_are_forgotten_sooner_than_clients_keys(any_store: Store) -> None:
    """The reaper's two purges: runtime writes' request keys (with their prefix) after an hour,
    clients' keys after the day; a prefix purge leaves every other key alone."""
    store = any_store
    committed(await store.write(spawn(REF)))
    for key in (f"{REQUEST_KEY_PREFIX}1 1", "client-key", "runtime-write-1-1"):
        idem = Idempotency(key, b"h")
        committed(await store.write(Write(REF, entity_writes.signal(REF, SPEC), idem, lambda _c: b"r")))
    assert await store.purge_idempotency(60_000, REQUEST_KEY_PREFIX) == 0  # none is a minute old
    retention_ms = -1000  # every key above is older than this (stamped before now + 1 s)
    assert await store.purge_idempotency(retention_ms, REQUEST_KEY_PREFIX) == 1
    assert await store.idempotent_response(REF, f"{REQUEST_KEY_PREFIX}1 1") is None
    assert await store.idempotent_response(REF, "client-key") is not None
    assert await store.purge_idempotency(retention_ms) == 2


async def hold(store: Store, holder: str, refs: list[Ref]) -> dict[Ref, int]:
    """Spawn ``refs`` and grant each to ``holder``'s session: the epochs granted."""
    for outcome in await store.write_many([spawn(ref) for ref in refs]):
        committed(outcome)
    return {ref: await granted(store, ref, holder) for ref in refs}


async def test_lost_leases_are_the_gone_holders_only_a_page_at_a_time(any_store: Store) -> None:
    store = any_store
    await store.sessions.open(session("s1", "w1"), TTL_MS)
    await store.sessions.open(session("s2", "w2"), 0)  # expired at once, by the store's clock
    await store.sessions.open(session("s3", "w3"), TTL_MS)
    await store.sessions.open(session("s4", "w4"), TTL_MS)
    await hold(store, "s1", [("agent", f"one-{i}") for i in range(12)])
    gone = await hold(store, "s2", [("agent", f"two-{i}") for i in range(7)])
    await hold(store, "s3", [("agent", f"three-{i}") for i in range(3)])
    gone |= await hold(store, "s4", [("agent", f"four-{i}") for i in range(2)])
    await store.sessions.end(["s4"])
    lost = await store.lost_leases(100)
    assert sorted(lost) == sorted(gone.items())  # each with the epoch its grant gave
    page = await store.lost_leases(5)
    assert len(page) == 5
    assert set(page) <= set(gone.items())


async def test_one_sweep_read_finds_what_the_three_reads_find(any_store: Store) -> None:
    """``sweep_finds`` (one statement on PostgreSQL) against ``lost_leases``, ``settled_streams``
    and ``unleased``: the same finds, an entity both lost and settled in both lists, a limit on
    each, no offers without types."""
    store = any_store
    await store.sessions.open(session("live", "w1"), TTL_MS)
    await store.sessions.open(session("gone", "w2", "r2"), 0)  # expired at once, with its replica
    await store.sessions.open(session("dying", "w3", "r3"), TTL_MS)
    lost = await hold(store, "gone", [("agent", "lost-1"), ("agent", "lost-2")])
    await hold(store, "live", [("agent", "kept")])
    lost |= await hold(store, "dying", [("agent", "ended")])
    killed = entity_writes.signal(("agent", "ended"), entity_writes.SignalSpec(Signal.SIGKILL))
    committed(await store.write(Write(("agent", "ended"), killed)))  # open: its holder may append
    await store.sessions.end(["dying"])  # then its holder is gone
    committed(await store.write(spawn(("agent", "free"))))

    found = await store.sweep_finds(60_000, ["agent"], HOSTED_STATES, 100)
    assert sorted(found.lost) == sorted(lost.items()) == sorted(await store.lost_leases(100))
    assert found.settled == [("agent", "ended")] == await store.settled_streams(60_000, 100)
    unleased = await store.unleased(["agent"], HOSTED_STATES, 100)
    assert found.unleased == unleased
    if isinstance(store, PostgresStore):  # (on SQLite, one server, each commit offers what it
        assert [r.ref for r in found.unleased] == [("agent", "free")]  # leaves: no poll needs to)
    assert (await store.sweep_finds(60_000, [], HOSTED_STATES, 100)).unleased == []
    assert len((await store.sweep_finds(60_000, ["agent"], HOSTED_STATES, 1)).lost) == 1


async def test_finding_lost_leases_probes_each_holder_not_each_lease(any_store: Store) -> None:
    """The lease sweep runs every poll on every replica: with every holder live it reads a probe
    per holder in entities_by_holder, not every held row (store/*_schema.py)."""
    store = any_store
    for holder in ("s1", "s2", "s3"):
        await store.sessions.open(session(holder, f"w-{holder}"), TTL_MS)
        await hold(store, holder, [("agent", f"{holder}-{i}") for i in range(100)])
    assert await store.lost_leases(100) == []
    if isinstance(store, SQLiteStore):
        reader = store.reader()
        for sql in (SQLITE_HOLDERS, SQLITE_HELD_BY):
            plan = [
                row[-1] for row in reader.execute(f"EXPLAIN QUERY PLAN {sql}", ("s1", 10)[: sql.count("?")])
            ]
            assert not [step for step in plan if step.startswith("SCAN entities")], plan
        return
    assert isinstance(store, PostgresStore)
    admin = await asyncpg.connect(store.url)
    try:
        await admin.execute("ANALYZE entities")
        [[plan]] = await admin.fetch(f"EXPLAIN (ANALYZE, FORMAT JSON) {PG_LOST_LEASES}", 100)
        states = [s.value for s in HOSTED_STATES]
        explain = f"EXPLAIN (ANALYZE, FORMAT JSON) {PG_SWEEP_FINDS}"
        [[sweep_plan]] = await admin.fetch(explain, 100, 60_000, ["agent"], states)
    finally:
        await admin.close()
    assert 0 < _entity_rows_examined(plan) <= 10  # a probe per holder and one past the last (of 300)
    # The sweep's one read (Store.sweep_finds): the same probes, and the indexes of the ended
    # streams and the unleased entities (none here), whatever the number of rows held.
    assert 0 < _entity_rows_examined(sweep_plan) <= 10


def _entity_rows_examined(plan: str) -> int:
    """The rows of entities an EXPLAIN (ANALYZE, FORMAT JSON) plan read, filtered out or not."""
    examined = 0
    nodes = [json.loads(plan)[0]["Plan"]]
    while nodes:
        node = nodes.pop()
        nodes.extend(node.get("Plans", ()))
        if node.get("Relation Name") == "entities":
            examined += (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"]
    return int(examined)


async def test_a_hello_forgets_sessions_and_replicas_expired_long_ago(postgres_url: str) -> None:
    """A replica killed leaves its rows (and its sessions') expired behind; the next hello
    anywhere deletes those past the keeping time, and keeps the recent and the live."""
    store = PostgresStore(postgres_url)
    await store.open()
    admin = await asyncpg.connect(postgres_url)
    try:
        assert isinstance(store.sessions, PostgresSessions)
        store.sessions.forget_after_ms = 60_000
        await store.sessions.open(session("old", "w-old", "r-dead"), 0)
        await store.sessions.open(session("recent", "w-recent", "r-recent"), 0)
        await admin.execute(
            "UPDATE sessions SET expires_at = now() - interval '2 minutes' WHERE id = 'old'; "
            "UPDATE replicas SET expires_at = now() - interval '2 minutes' WHERE id = 'r-dead'"
        )
        await store.sessions.open(session("new", "w-new", "r-live"), TTL_MS)
        assert await admin.fetchval("SELECT array_agg(id ORDER BY id) FROM sessions") == ["new", "recent"]
        assert await admin.fetchval("SELECT array_agg(id ORDER BY id) FROM replicas") == [
            "r-live",
            "r-recent",
        ]
    finally:
        await admin.close()
        await store.close()


def test_signals_owed_after_a_release_are_not_appended_to_a_stream_closed_meanwhile() -> None:
    """The runtime settles the signals a released lease still owed in a write of its own, after
    the release's commit; if the stream closed in between, its close settled them: nothing is
    appended (a closed stream refuses any append, and the runtime's task would crash on it)."""
    closed = EntityRecord("agent", "a", State.STOPPED, 0, 0, 0, 0, 3, True, None, 5)
    owed = {"sig_1": pb.SignalValue(signal=pb.SIGNAL_SIGUSR)}
    mutation = settle_ignored(owed, State.RUNNING)(closed, WriteContext(6, 0))
    assert (mutation.events, mutation.entity) == ([], None)
    still_open = closed.replace(closed=False)
    assert [e.kind for e in settle_ignored(owed, State.RUNNING)(still_open, WriteContext(6, 0)).events] == [
        "signal"
    ]
