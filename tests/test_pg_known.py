"""A lone write on a guess (store/postgres/guess.py), on a real PostgreSQL: one round trip when the replica
knows the entity, and never a wrong write when what it knows is wrong.

Each test makes one guess wrong in one way (the row, the clock, the holder's
liveness, a key already stored) and shows the database refuses that statement,
the write is read and decided again, and what commits is what the two-trip
path would have committed. They assert what was written and what was sent, not
the guess's counters (``known.guesses``, ``known.misses``): a stall of a loaded
machine makes a guess's clock or spare txid stale, which moves the counters
and changes nothing written.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from electric_server.fastpaths import forced
from electric_server.store.base import EntityRecord, Idempotency, Mutation, NewEvent, Ref, Write, WriteContext
from electric_server.store.postgres import PostgresStore
from electric_server.store.postgres.known import SPARE_TTL_MS, Known
from electric_server.store.postgres.statements import (
    ONE_INSERT,
    ONE_KEY,
    ONE_UPDATE,
    ONE_UPDATE_GUESSED,
    READ_AND_DRAW,
)
from electric_server.store.sessions import SessionRow
from test_store import check_stream, committed, note, spawn

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import State

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        forced("pg_guess") or forced("pg_one_trip"),
        reason="about the write on a guess, whose switch is off: every lone write then reads first",
    ),
]


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(postgres_url)
    await s.open()
    yield s
    await s.close()


_LONE_WRITES = {READ_AND_DRAW, ONE_UPDATE, ONE_UPDATE_GUESSED, ONE_INSERT, ONE_KEY}


class _Statements:
    """The lone write's statements the store's pooled connections send (asyncpg's query loggers)."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def __call__(self, record: Any) -> None:
        if record.query in _LONE_WRITES:  # (not asyncpg's own: its type introspection)
            self.sent.append(record.query)

    async def logged(self) -> list[str]:
        """What was sent: asyncpg calls its loggers with ``call_soon``, so one turn of the loop
        after the statements' answers."""
        await asyncio.sleep(0)
        return self.sent

    async def attach(self, store: PostgresStore) -> None:
        pool = store.connections.pool
        conns = [await pool.acquire() for _ in range(store.pool_size)]
        for conn in conns:
            conn.add_query_logger(self)
        for conn in conns:
            await pool.release(conn)


def _live_note(ref: Ref) -> Write:
    """A note whose body is the sessions the write saw live (``WriteContext.live``)."""

    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        assert current is not None
        body = json.dumps(sorted(ctx.live)).encode()
        return Mutation([NewEvent("note", f"live_{ctx.txid}", pb.OPERATION_INSERT, body)], current)

    return Write(ref, decide)


def _leased_to(ref: Ref, session: str) -> Write:
    def decide(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        assert current is not None
        return Mutation([], current._replace(lease_session=session))

    return Write(ref, decide)


# What one lone write to a known entity may send: its guess alone (committed); its guess, refused,
# then the read and the update (a stall made its clock wrong: more than CLOCK_LAG_MS late at the
# database); or the read and the update (a stall left its spare txid older than SPARE_TTL_MS).
_ON_A_GUESS = [ONE_UPDATE_GUESSED]
_A_GUESS_READ_AGAIN = [ONE_UPDATE_GUESSED, READ_AND_DRAW, ONE_UPDATE]
_READ_FIRST = [READ_AND_DRAW, ONE_UPDATE]


async def test_a_write_to_an_entity_the_replica_wrote_takes_one_statement(store: PostgresStore) -> None:
    ref: Ref = ("agent", "known")
    committed(await store.write(spawn(ref)))
    statements = _Statements()
    await statements.attach(store)
    each: list[list[str]] = []
    for i in range(5):
        before = len(await statements.logged())
        committed(await store.write(note(ref, str(i))))
        each.append((await statements.logged())[before:])
    assert all(sent in (_ON_A_GUESS, _A_GUESS_READ_AGAIN, _READ_FIRST) for sent in each), each
    # One stall per write could leave none on its guess; five in a row are not a stall.
    assert _ON_A_GUESS in each, each
    assert [e.body for e in await store.read_events(ref, 1, 10)] == [b"0", b"1", b"2", b"3", b"4"]
    await check_stream(store, ref)


async def test_a_row_written_by_another_replica_since_is_read_and_decided_again(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    """A's knowledge is made stale (as if its feed had not brought B's commit yet): A's statement
    writes nothing, and A reads the row and decides on it. A refusal decided on a stale row is
    not answered: ``after_three`` refuses on a row below head 3, which A's stale row is."""
    a, b = stores
    ref: Ref = ("agent", "stale")
    committed(await a.write(spawn(ref)))
    stale = a.known.entity(ref)
    assert stale is not None
    committed(await b.write(note(ref, "b")))
    a.known.forget(ref)
    a.known.learn(*stale)
    committed(await a.write(note(ref, "a")))
    committed(await b.write(note(ref, "b2")))
    a.known.forget(ref)
    a.known.learn(*stale)

    def after_three(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        assert current is not None
        if current.head_offset < 3:
            raise ValueError("refused on a row below head 3")
        return note(ref, "a2").decide(current, ctx)

    committed(await a.write(Write(ref, after_three)))  # decided on the row read: not refused
    bodies = [e.body for e in await a.read_events(ref, 1, 10)]
    assert bodies == [b"b", b"a", b"b2", b"a2"]
    await check_stream(a, ref)


@pytest.mark.parametrize("hours", [1, -1], ids=["clock ahead", "clock behind"])
async def test_a_guessed_clock_off_the_databases_writes_nothing_and_is_read_again(
    store: PostgresStore, hours: int
) -> None:
    ref: Ref = ("agent", "clock")
    committed(await store.write(spawn(ref)))
    off = hours * 3_600_000
    store.known.shift_clock(off)
    if off < 0:  # (a guess is never before the row's own time: that is made old too)
        known = store.known.entity(ref)
        assert known is not None
        store.known.forget(ref)
        store.known.learn(known[0]._replace(updated_at_ms=known[0].updated_at_ms + off), known[1])
    outcome = committed(await store.write(note(ref)))
    stored = await store.get_entity(ref)
    assert stored is not None
    database_ms = await _database_ms(store)
    # The time written is the database's, read again (not an hour off).
    assert abs(stored.updated_at_ms - database_ms) < 60_000
    assert outcome.commit is not None
    assert outcome.commit.timestamp_ms == stored.updated_at_ms
    committed(await store.write(note(ref)))
    # The clock read again makes the next write's time the database's too.
    stored = await store.get_entity(ref)
    assert stored is not None
    assert abs(stored.updated_at_ms - await _database_ms(store)) < 60_000
    await check_stream(store, ref)


async def _database_ms(store: PostgresStore) -> int:
    async with store.connections.pool.acquire() as conn:
        return int(await conn.fetchval("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"))


async def test_a_holder_guessed_live_is_checked_by_the_database(store: PostgresStore) -> None:
    """A holder is guessed live; the write sees it live only while its session is."""
    ref: Ref = ("agent", "held")
    await store.sessions.open(SessionRow("s-1", "w-1", "r-1", ("agent",), "v1", 0), 60_000)
    await store.sessions.renew("r-1", ["s-1"], 60_000)
    committed(await store.write(spawn(ref)))
    committed(await store.write(_leased_to(ref, "s-1")))
    committed(await store.write(_live_note(ref)))
    await store.sessions.end(["s-1"])
    committed(await store.write(_live_note(ref)))  # written as the database sees the holder: gone
    bodies = [e.body for e in await store.read_events(ref, 1, 10)]
    assert bodies == [b'["s-1"]', b"[]"]
    await check_stream(store, ref)


@pytest.mark.parametrize("stall", ["none", "spare", "clock"])
async def test_a_key_already_stored_is_replayed_not_written_on_a_guess(
    store: PostgresStore, stall: str
) -> None:
    """The retry of a keyed write to an entity the replica knows is answered with the first
    response and writes nothing, whether its guess is sent (the stored key refuses it) or a stall
    of a loaded machine left the guess's spare txid or clock stale (then it is read first, or its
    guess is refused for the clock)."""
    ref: Ref = ("agent", "keyed")
    committed(await store.write(spawn(ref)))

    def keyed() -> Write:
        return Write(ref, note(ref, "once").decide, Idempotency("k", b"h"), lambda c: f"{c.txid}".encode())

    first = await store.write(keyed())
    assert not first.replayed
    written = await store.get_entity(ref)
    if stall == "spare":
        store.known.age_spare(SPARE_TTL_MS + 1)
    elif stall == "clock":
        store.known.shift_clock(-3_600_000)
    again = await store.write(keyed())
    assert (again.replayed, again.response, again.commit) == (True, first.response, None)
    assert await store.get_entity(ref) == written, "the retry wrote the entity's row again"
    assert [e.body for e in await store.read_events(ref, 1, 10)] == [b"once"]
    assert len(await check_stream(store, ref)) == 2


async def test_a_refusal_or_no_op_is_answered_from_the_row_read_not_the_guess(store: PostgresStore) -> None:
    """Only a commit's statement checks a guess, so a write that would commit nothing is read."""
    ref: Ref = ("agent", "noop")
    committed(await store.write(spawn(ref)))
    statements = _Statements()
    await statements.attach(store)
    outcome = await store.write(Write(ref, lambda current, ctx: Mutation()))
    assert outcome.commit is None
    assert await statements.logged() == [READ_AND_DRAW]  # no guess sent


async def test_a_spare_txid_older_than_a_second_is_not_used(store: PostgresStore) -> None:
    """(A txid used long after it was drawn would put two entities' commits far out of order.)"""
    ref: Ref = ("agent", "spare")
    committed(await store.write(spawn(ref)))
    store.known.age_spare(SPARE_TTL_MS + 1)
    statements = _Statements()
    await statements.attach(store)
    committed(await store.write(note(ref)))
    assert await statements.logged() == [READ_AND_DRAW, ONE_UPDATE]
    committed(await store.write(note(ref)))
    assert (await statements.logged())[:3] == [READ_AND_DRAW, ONE_UPDATE, ONE_UPDATE_GUESSED]
    await check_stream(store, ref)


def test_known_keeps_each_entitys_newest_row_and_forgets_the_least_recent() -> None:
    known = Known(capacity=2)
    base = EntityRecord("agent", "a", State.RUNNING, 0, 0, 0, 0, 0, False, None, 0)
    newer, older = base._replace(txid=9), base._replace(txid=5)
    known.learn(newer, 90)
    known.learn(older, 50)  # a slower source's older commit of the same entity
    assert known.entity(("agent", "a")) == (newer, 90)
    known.learn(base._replace(id="b"), 1)
    known.learn(base._replace(id="c"), 1)
    assert known.entity(("agent", "a")) is None
    assert known.entity(("agent", "c")) is not None


def test_a_guessed_clock_is_never_ahead_of_the_reading_it_came_from() -> None:
    known = Known()
    assert known.now_ms(not_before=0) is None
    reading = 1_700_000_000_000
    arrived = time.monotonic_ns()
    known.clock(reading)
    guess = known.now_ms(not_before=0)
    since_ms = (time.monotonic_ns() - arrived) / 1_000_000
    assert guess is not None
    # The database's clock is at least the reading plus the time since it arrived, which a stall
    # of a loaded machine between these lines makes more than a millisecond: the guess moves on
    # with it, and is never ahead of it.
    assert reading <= guess <= reading + since_ms
    assert known.now_ms(not_before=reading + 5) == reading + 5  # never before the row's own time
    record = EntityRecord("agent", "a", State.RUNNING, 0, 0, 0, 0, 0, False, None, 1)
    known.learn(record, 1)
    known.missed(("agent", "a"), ["holder"])
    assert known.entity(("agent", "a")) is None, "a wrong holder: the row is read again"
    assert known.now_ms(not_before=0) is not None
    known.learn(record, 1)
    known.missed(("agent", "a"), ["clock"])
    assert known.now_ms(not_before=0) is None, "a wrong clock is read again"
    assert known.entity(("agent", "a")) is not None, "and only the clock"
    assert known.misses == {"row": 0, "clock": 1, "holder": 1}
