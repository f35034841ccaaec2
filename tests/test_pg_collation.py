"""Entities are ordered by code point on PostgreSQL whatever the database's collation, as on SQLite.

A database made with a language's collation (ICU ``en-US`` here; a libc
``en_US.UTF-8`` on many hosts, the default of several hosted services) sorts
``B`` after ``a`` and ``_x`` before both. Listing, its pages and the batch's lock
order follow the entity table's key, so the schema gives that key the ``C``
collation there (postgres_schema, version 5).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from electric_server.store.base import Ref
from electric_server.store.postgres import PostgresStore
from electric_server.store.sqlite import SQLiteStore
from postgres_dbs import Databases
from test_pg_feed import Seen
from test_store import check_stream, committed, note, spawn

pytestmark = pytest.mark.anyio

# Ids the two orders disagree on: punctuation, case, digits (ids are [A-Za-z0-9_.-]).
IDS = ["b", "B", "a-2", "a1", "A3", "_x", "a.b", "9", "Z_"]


@pytest.fixture
async def icu_store(postgres_databases: Databases) -> AsyncIterator[PostgresStore]:
    url = postgres_databases.fresh("LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'")
    store = PostgresStore(url)
    try:
        await store.open()
        yield store
    finally:
        await store.close()
        postgres_databases.drop(url)


KEY_COLLATION = (
    "SELECT coalesce(collation_name, 'default') FROM information_schema.columns "
    "WHERE table_name = 'entities' AND column_name IN ('type', 'id') GROUP BY 1"
)


async def test_the_key_is_altered_only_where_the_database_does_not_order_by_code_point(
    icu_store: PostgresStore, postgres_databases: Databases
) -> None:
    """On a database that orders by code point already (libc C.UTF-8) version 5 leaves the entity
    table alone: altering it would rebuild its indexes for nothing."""
    libc = postgres_databases.fresh("LOCALE_PROVIDER libc LOCALE 'C.UTF-8'")
    try:
        store = PostgresStore(libc)
        await store.open()
        await store.close()
        for url, expected in ((icu_store.url, ["C"]), (libc, ["default"])):
            conn = await asyncpg.connect(url)
            try:
                assert [row[0] for row in await conn.fetch(KEY_COLLATION)] == expected
            finally:
                await conn.close()
    finally:
        postgres_databases.drop(libc)


async def listed(store: Any, page: int) -> list[Ref]:
    """Every entity, read ``page`` at a time from the last one's ref, as ListEntities pages."""
    refs: list[Ref] = []
    after: Ref | None = None
    while batch := await store.list_entities(None, (), after, page):
        refs += [record.ref for record in batch]
        after = batch[-1].ref
    return refs


async def test_entities_list_by_code_point_on_a_database_of_another_collation(
    icu_store: PostgresStore, tmp_path: Any
) -> None:
    sqlite = SQLiteStore(tmp_path / "electric.db")
    await sqlite.open()
    try:
        refs = [("t", id) for id in IDS] + [("T", "a"), ("_t", "a")]
        for store in (icu_store, sqlite):
            for outcome in await store.write_many([spawn(ref) for ref in refs]):
                committed(outcome)
        expected = sorted(refs)  # Python's str order is by code point, as SQLite's BINARY
        assert await listed(sqlite, 1000) == expected
        assert await listed(icu_store, 1000) == expected
        assert await listed(icu_store, 2) == expected  # every page starts where the last ended
        in_state = await icu_store.list_entities("t", (), ("t", "a1"), 1000)
        assert [record.ref for record in in_state] == [
            ref for ref in expected if ref[0] == "t" and ref > ("t", "a1")
        ]
    finally:
        await sqlite.close()


async def test_every_write_path_works_on_a_database_of_another_collation(
    postgres_databases: Databases,
) -> None:
    """The key's columns compare in "C" against the other tables' in the database's collation:
    a batch (its locks and its unnest joins), a lone write, and another replica's feed read."""
    url = postgres_databases.fresh("LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'")
    a, b = PostgresStore(url), PostgresStore(url)
    try:
        await a.open()
        await b.open()
        seen_b = Seen(b)
        refs = [("t", id) for id in IDS]
        for outcome in await a.write_many([spawn(ref) for ref in refs]):
            committed(outcome)
        for outcome in await a.write_many([note(ref) for ref in refs for _ in range(2)]):
            committed(outcome)
        for ref in refs:
            committed(await a.write(note(ref)))
            committed(await b.write(note(ref)))
        await seen_b.count(len(refs) * 5)  # a's four commits each, read from the feed, and b's own
        for ref in refs:
            await check_stream(a, ref)
            assert [e.kind for e in await b.read_events(ref, 0, 100)][1:] == ["note"] * 4
    finally:
        await a.close()
        await b.close()
        postgres_databases.drop(url)
