"""The store's rows follow the records' fields: the SQLite schema, an older file, the mappings."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from electric_server.store.base import EntityRecord, StoredEvent, WriteContext
from electric_server.store.rows import (
    ENTITY_COLUMNS,
    ENTITY_KEY,
    EVENT_COLUMNS,
    advanced,
    entity_from_row,
    entity_row,
    event_from_row,
)
from electric_server.store.sqlite import SQLiteStore
from electric_server.store.sqlite.schema import migrate

from electric_sdk.lifecycle import State

pytestmark = pytest.mark.anyio

# Every field away from its default, so a field mapped to the wrong column shows.
RECORD = EntityRecord(
    "agent", "e1", State.STOPPING, 1, 2, 3, 4, 5, True, 6, 7, 8, 9, 10, 11, True, True, True, (12, 13)
)

# The entities table as the first release wrote it, before the runtime's columns.
FIRST_RELEASE_ENTITIES = """
CREATE TABLE entities (
    type TEXT NOT NULL,
    id TEXT NOT NULL,
    state TEXT NOT NULL,
    grace_ms INTEGER NOT NULL,
    idle_timeout_ms INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    head_offset INTEGER NOT NULL,
    closed INTEGER NOT NULL,
    stopping_deadline INTEGER,
    txid INTEGER NOT NULL,
    PRIMARY KEY (type, id)
) WITHOUT ROWID;
INSERT INTO entities VALUES ('agent', 'old', 'idle', 30000, 60000, 1, 2, 3, 0, NULL, 4);
"""


def columns(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    return tuple(row[1] for row in conn.execute(f"PRAGMA table_info({table})"))


def test_the_schema_has_a_column_per_record_field(tmp_path: Path) -> None:
    """A field added to a record without its column, or a column without its field, fails here
    (and sqlite_schema refuses to import)."""
    assert len(ENTITY_COLUMNS) == len(EntityRecord._fields)
    assert len(EVENT_COLUMNS) == len(StoredEvent._fields)
    conn = sqlite3.connect(tmp_path / "x.db")
    try:
        migrate(conn)
        assert columns(conn, "entities") == ENTITY_COLUMNS
        assert columns(conn, "events") == ENTITY_KEY + EVENT_COLUMNS
    finally:
        conn.close()


async def test_an_older_file_gains_the_columns_added_since(tmp_path: Path) -> None:
    path = tmp_path / "electric.db"
    conn = sqlite3.connect(path)
    conn.executescript(FIRST_RELEASE_ENTITIES)
    conn.close()
    store = SQLiteStore(path)
    await store.open()
    try:
        old = await store.get_entity(("agent", "old"))
        assert old == EntityRecord("agent", "old", State.IDLE, 30000, 60000, 1, 2, 3, False, None, 4)
        assert await store.on_writer(lambda conn: columns(conn, "entities")) == ENTITY_COLUMNS
    finally:
        await store.close()


def test_a_record_comes_back_from_its_row() -> None:
    row = entity_row(RECORD)
    assert len(row) == len(ENTITY_COLUMNS)
    assert row[ENTITY_COLUMNS.index("state")] == "stopping"  # the enum as its value
    assert row[ENTITY_COLUMNS.index("cancelled_messages")] == "12,13"  # a tuple as text
    assert all(value is None or type(value) in (str, int, bool) for value in row)
    # SQLite returns the booleans as 0 or 1.
    assert entity_from_row([int(v) if isinstance(v, bool) else v for v in row]) == RECORD


def test_an_event_comes_back_from_its_row() -> None:
    event = StoredEvent(1, "signal", "sig_1", 2, 3, 4, b"body")
    assert event_from_row(tuple(event)) == event


def test_a_commit_advances_the_head_offset_time_and_txid_only() -> None:
    after = advanced(RECORD, 42, WriteContext(txid=99, now_ms=1234))
    assert after == RECORD.replace(head_offset=42, updated_at_ms=1234, txid=99)
