"""The SQLite file's schema, how an older file is brought up to it, and the store's statements.

The entity table's columns are ``rows.ENTITY_COLUMNS`` (the record's fields);
their SQLite definitions are listed here once, and both the CREATE TABLE and
the columns added to an older file are built from that list. Every statement
is built once, at import: the write path only looks them up.
"""

from __future__ import annotations

import functools
import sqlite3

from electric_sdk.lifecycle import TERMINAL_STATES, State

from ..rows import ENTITY_COLUMNS, ENTITY_KEY, EVENT_COLUMNS

__all__ = [
    "INSERT_EVENT",
    "INSERT_IDEMPOTENCY",
    "PURGE_IDEMPOTENCY",
    "SCHEMA",
    "SELECT_AWAITING",
    "SELECT_BOUND_RUNS",
    "SELECT_CHILDREN_ENDED",
    "SELECT_DUE_DEADLINES",
    "SELECT_ENDED_OPEN_HOLDERS",
    "SELECT_ENTITIES",
    "SELECT_ENTITY",
    "SELECT_EVENTS",
    "SELECT_HELD_BY",
    "SELECT_HOLDERS",
    "SELECT_IDEMPOTENCY",
    "SELECT_INTERRUPTS_DUE",
    "SELECT_NEXT_TXID",
    "SELECT_STOPPING_DEADLINES",
    "SELECT_TYPE_PROFILES",
    "SELECT_VERSION_CHOICES",
    "SELECT_WAITING_RUNS",
    "SET_NEXT_TXID",
    "UPSERT_ENTITY",
    "UPSERT_TYPE_PROFILE",
    "UPSERT_VERSION_CHOICE",
    "migrate",
    "update_entity_sql",
]

# Each entity column's definition, in ENTITY_COLUMNS order. The columns with a
# default came after the first release: an older file gains them when it is
# opened (migrate), so a column added later needs a default too.
_ENTITY_DEFINITIONS = {
    "type": "TEXT NOT NULL",
    "id": "TEXT NOT NULL",
    "state": "TEXT NOT NULL",
    "grace_ms": "INTEGER NOT NULL",
    "idle_timeout_ms": "INTEGER NOT NULL",
    "created_at": "INTEGER NOT NULL",
    "updated_at": "INTEGER NOT NULL",
    "head_offset": "INTEGER NOT NULL",
    "closed": "INTEGER NOT NULL",
    "stopping_deadline": "INTEGER",
    "txid": "INTEGER NOT NULL",
    "lease_epoch": "INTEGER NOT NULL DEFAULT 0",
    "message_cursor": "INTEGER NOT NULL DEFAULT 0",
    "cursor_attempt": "INTEGER NOT NULL DEFAULT 0",
    "last_message_offset": "INTEGER NOT NULL DEFAULT -1",
    "reload_pending": "INTEGER NOT NULL DEFAULT 0",
    "grace_pending": "INTEGER NOT NULL DEFAULT 0",
    "idle_timeout_pending": "INTEGER NOT NULL DEFAULT 0",
    "cancelled_messages": "TEXT NOT NULL DEFAULT ''",
    "lease_session": "TEXT NOT NULL DEFAULT ''",
    "process_running": "INTEGER NOT NULL DEFAULT 0",
    "run_key": "TEXT NOT NULL DEFAULT ''",
    "run_version": "TEXT NOT NULL DEFAULT ''",
    "waiting_since_ms": "INTEGER",
    "parent": "TEXT NOT NULL DEFAULT ''",
    "parent_told": "INTEGER NOT NULL DEFAULT 0",
    "interrupted_runs": "TEXT NOT NULL DEFAULT ''",
    "awaited_runs": "TEXT NOT NULL DEFAULT ''",
    "on_busy": "TEXT NOT NULL DEFAULT ''",
    "on_busy_choices": "TEXT NOT NULL DEFAULT ''",
    "awaiting_run": "TEXT NOT NULL DEFAULT ''",
    "awaiting_offset": "INTEGER NOT NULL DEFAULT 0",
    "awaiting_question": "TEXT NOT NULL DEFAULT ''",
    "awaiting_step": "INTEGER NOT NULL DEFAULT 0",
    "ahead_offset": "INTEGER NOT NULL DEFAULT -1",
    "resume_offset": "INTEGER NOT NULL DEFAULT -1",
    "resume_last": "INTEGER NOT NULL DEFAULT -1",
}
if tuple(_ENTITY_DEFINITIONS) != ENTITY_COLUMNS:
    # A field added to EntityRecord without its column (or the other way round)
    # would fail every write; fail at import instead, naming the difference.
    raise ImportError(
        f"the entities table's columns {tuple(_ENTITY_DEFINITIONS)} are not EntityRecord's {ENTITY_COLUMNS}"
    )

# In State order: the index's WHERE and the query's must read the same in every process.
_TERMINAL = ", ".join(f"'{state.value}'" for state in State if state in TERMINAL_STATES)
_ENTITY_TABLE = ",\n".join(f"    {column} {definition}" for column, definition in _ENTITY_DEFINITIONS.items())
_KEY = ", ".join(ENTITY_KEY)

# The entity table is built from the definitions above (it gains columns); the
# others are as they were first released (an older file gains the tables added
# since, type_profiles, as it is opened).
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS entities (
{_ENTITY_TABLE},
    PRIMARY KEY ({_KEY})
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entities_by_state ON entities (state, type, id);
CREATE INDEX IF NOT EXISTS entities_by_deadline ON entities (stopping_deadline)
    WHERE stopping_deadline IS NOT NULL;
CREATE INDEX IF NOT EXISTS entities_ended_open ON entities (type, id)
    WHERE closed = 0 AND state IN ({_TERMINAL});
CREATE TABLE IF NOT EXISTS events (
    type TEXT NOT NULL,
    id TEXT NOT NULL,
    offset INTEGER NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    operation INTEGER NOT NULL,
    ts INTEGER NOT NULL,
    txid INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (type, id, offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idempotency (
    type TEXT NOT NULL,
    id TEXT NOT NULL,
    key TEXT NOT NULL,
    request_hash BLOB NOT NULL,
    response BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (type, id, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempotency_by_age ON idempotency (created_at);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS type_profiles (
    type TEXT NOT NULL,
    code_version TEXT NOT NULL,
    seq INTEGER NOT NULL,
    grace_ms INTEGER,
    idle_timeout_ms INTEGER,
    PRIMARY KEY (type, code_version)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS version_choices (
    type TEXT PRIMARY KEY,
    selected TEXT NOT NULL,
    ramp_version TEXT NOT NULL,
    ramp_percent INTEGER NOT NULL
) WITHOUT ROWID;
"""
# Columns type_profiles gained after its first release (an older file gains them when opened).
_PROFILE_ADDED = {
    "versioning": "TEXT NOT NULL DEFAULT ''",
    "upgrade_after_ms": "INTEGER",
    "children": "TEXT NOT NULL DEFAULT ''",
}


def migrate(conn: sqlite3.Connection) -> None:
    """Create what the file lacks: its tables and indexes, or the entity columns added since it was written."""
    conn.executescript(SCHEMA)
    present = {row[1] for row in conn.execute("PRAGMA table_info(entities)")}
    for column, definition in _ENTITY_DEFINITIONS.items():
        if column not in present:
            conn.execute(f"ALTER TABLE entities ADD COLUMN {column} {definition}")
    profile_columns = {row[1] for row in conn.execute("PRAGMA table_info(type_profiles)")}
    for column, definition in _PROFILE_ADDED.items():
        if column not in profile_columns:
            conn.execute(f"ALTER TABLE type_profiles ADD COLUMN {column} {definition}")
    # After the columns: an older file gains lease_session just above.
    conn.execute(_HOLDER_INDEX)
    conn.execute(_WAITING_INDEX)
    conn.execute(_PARENT_INDEX)
    conn.execute(_UNTOLD_INDEX)
    conn.execute(_INTERRUPTED_INDEX)
    conn.execute(_AWAITING_INDEX)
    # One server: the sessions were in its memory (store/sessions.py), so no holder outlives it.
    # A run in flight bound to its code version waits for a worker of it from now (the bound on
    # that wait counts from here: runtime/versions.py).
    conn.execute(
        "UPDATE entities SET waiting_since_ms = coalesce(waiting_since_ms, "
        "CAST(strftime('%s', 'now') AS INTEGER) * 1000) "
        "WHERE lease_session <> '' AND cursor_attempt > 0 AND run_version <> ''"
    )
    conn.execute("UPDATE entities SET lease_session = '' WHERE lease_session <> ''")


# The runs waiting for a worker of their code version: few, whatever the table's size.
_WAITING_INDEX = (
    "CREATE INDEX IF NOT EXISTS entities_waiting ON entities (waiting_since_ms) "
    "WHERE waiting_since_ms IS NOT NULL"
)
SELECT_WAITING_RUNS = (
    f"SELECT {', '.join(ENTITY_COLUMNS)} FROM entities INDEXED BY entities_waiting "
    "WHERE waiting_since_ms IS NOT NULL AND lease_session = '' AND closed = 0 "
    "ORDER BY waiting_since_ms LIMIT ?"
)
# Children by parent: `ls --parent` and the cascade sweep (core/cascade.py); roots are not in it.
_PARENT_INDEX = (
    "CREATE INDEX IF NOT EXISTS entities_by_parent ON entities (parent, type, id) WHERE parent <> ''"
)
# Ended children whose parent is not told yet: few, whatever the table's size.
_UNTOLD_INDEX = (
    "CREATE INDEX IF NOT EXISTS entities_untold ON entities (type, id) "
    f"WHERE parent <> '' AND parent_told = 0 AND state IN ({_TERMINAL})"
)
SELECT_CHILDREN_ENDED = (
    f"SELECT {', '.join(ENTITY_COLUMNS)} FROM entities INDEXED BY entities_untold "
    f"WHERE parent <> '' AND parent_told = 0 AND state IN ({_TERMINAL}) LIMIT ?"
)
# Entities with runs whose children are due their signal (due entries lead the column,
# delegating ones start with "~"): few, and each briefly.
_INTERRUPTED_INDEX = "CREATE INDEX IF NOT EXISTS entities_interrupted ON entities (type, id) WHERE interrupted_runs <> '' AND interrupted_runs NOT LIKE '~%'"
SELECT_INTERRUPTS_DUE = (
    f"SELECT {', '.join(ENTITY_COLUMNS)} FROM entities INDEXED BY entities_interrupted "
    "WHERE interrupted_runs <> '' AND interrupted_runs NOT LIKE '~%' LIMIT ?"
)
# Entities waiting to be woken by another's run's end: few, each until that run ends.
_AWAITING_INDEX = (
    "CREATE INDEX IF NOT EXISTS entities_awaiting ON entities (type, id) WHERE awaited_runs <> ''"
)
SELECT_AWAITING = (
    f"SELECT {', '.join(ENTITY_COLUMNS)} FROM entities INDEXED BY entities_awaiting "
    "WHERE awaited_runs <> '' LIMIT ?"
)
_HOLDER_INDEX = (
    "CREATE INDEX IF NOT EXISTS entities_by_holder ON entities (lease_session) WHERE lease_session <> ''"
)


def _placeholders(n: int) -> str:
    return ", ".join("?" * n)


_ENTITY_LIST = ", ".join(ENTITY_COLUMNS)
_EVENT_LIST = ", ".join(EVENT_COLUMNS)
_WHERE_KEY = " AND ".join(f"{column} = ?" for column in ENTITY_KEY)
# A row written whole over an existing one keeps the time the entity was created.
_KEPT_ON_CONFLICT = {*ENTITY_KEY, "created_at"}

SELECT_ENTITY = f"SELECT {_ENTITY_LIST} FROM entities WHERE {_WHERE_KEY}"
SELECT_ENTITIES = f"SELECT {_ENTITY_LIST} FROM entities"  # the caller adds WHERE, ORDER and LIMIT
UPSERT_ENTITY = (
    f"INSERT INTO entities ({_ENTITY_LIST}) VALUES ({_placeholders(len(ENTITY_COLUMNS))}) "
    f"ON CONFLICT ({_KEY}) DO UPDATE SET "
    + ", ".join(
        f"{column} = excluded.{column}" for column in ENTITY_COLUMNS if column not in _KEPT_ON_CONFLICT
    )
)
SELECT_STOPPING_DEADLINES = (
    f"SELECT {_KEY}, stopping_deadline FROM entities WHERE stopping_deadline IS NOT NULL"
)

INSERT_EVENT = f"INSERT INTO events ({_KEY}, {_EVENT_LIST}) VALUES ({_placeholders(len(ENTITY_KEY) + len(EVENT_COLUMNS))})"
SELECT_EVENTS = f"SELECT {_EVENT_LIST} FROM events WHERE {_WHERE_KEY} AND offset >= ? ORDER BY offset LIMIT ?"

INSERT_IDEMPOTENCY = (
    "INSERT INTO idempotency (type, id, key, request_hash, response, created_at) VALUES (?, ?, ?, ?, ?, ?)"
)
SELECT_IDEMPOTENCY = "SELECT request_hash, response FROM idempotency WHERE type = ? AND id = ? AND key = ?"
PURGE_IDEMPOTENCY = "DELETE FROM idempotency WHERE created_at < ? AND key LIKE ?"

# The deadline sweeps' (store/base.py): due grace deadlines, held leases, ended open streams.
SELECT_DUE_DEADLINES = (
    f"SELECT {_KEY}, stopping_deadline FROM entities WHERE stopping_deadline <= ? "
    "ORDER BY stopping_deadline LIMIT ?"
)
# Lost leases are found through their holders (as on PostgreSQL, postgres/statements.py): the
# distinct holders walked in entities_by_holder, one probe each, however many leases each holds;
# then only a gone holder's rows. Reading every held row instead cost each poll O(leases).
SELECT_HOLDERS = (
    "WITH RECURSIVE holders(id) AS (SELECT min(lease_session) FROM entities WHERE lease_session <> '' "
    "UNION ALL SELECT (SELECT min(lease_session) FROM entities WHERE lease_session <> '' "
    "AND lease_session > holders.id) FROM holders WHERE holders.id IS NOT NULL) "
    "SELECT id FROM holders WHERE id IS NOT NULL"
)
SELECT_HELD_BY = (
    f"SELECT {_KEY}, lease_epoch FROM entities INDEXED BY entities_by_holder "
    "WHERE lease_session = ? AND lease_session <> '' LIMIT ?"
)
# The partial index entities_ended_open holds exactly the ended open streams: few, whatever the
# table's size (the planner would rather scan every terminal entity through entities_by_state).
SELECT_ENDED_OPEN_HOLDERS = (
    f"SELECT {_KEY}, lease_session, updated_at FROM entities INDEXED BY entities_ended_open "
    f"WHERE closed = 0 AND state IN ({_TERMINAL})"
)
SELECT_TYPE_PROFILES = (
    "SELECT type, code_version, seq, grace_ms, idle_timeout_ms, versioning, upgrade_after_ms, children "
    "FROM type_profiles"
)
UPSERT_TYPE_PROFILE = (
    "INSERT INTO type_profiles (type, code_version, seq, grace_ms, idle_timeout_ms, versioning, "
    "upgrade_after_ms, children) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (type, code_version) DO UPDATE SET "
    "grace_ms = excluded.grace_ms, idle_timeout_ms = excluded.idle_timeout_ms, "
    "versioning = excluded.versioning, upgrade_after_ms = excluded.upgrade_after_ms, "
    "children = excluded.children"
)
SELECT_VERSION_CHOICES = "SELECT type, selected, ramp_version, ramp_percent FROM version_choices"
UPSERT_VERSION_CHOICE = (
    "INSERT INTO version_choices (type, selected, ramp_version, ramp_percent) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (type) DO UPDATE SET selected = excluded.selected, "
    "ramp_version = excluded.ramp_version, ramp_percent = excluded.ramp_percent"
)
# Runs in flight per code version (the version's row in `electric versions`): a scan of the
# type's entities, for an operator's command.
SELECT_BOUND_RUNS = (
    "SELECT run_version, count(*), sum(lease_session = '') FROM entities WHERE type = ? "
    "AND cursor_attempt > 0 AND run_version <> '' AND closed = 0 GROUP BY run_version"
)

SELECT_NEXT_TXID = "SELECT value FROM meta WHERE name = 'next_txid'"
SET_NEXT_TXID = (
    "INSERT INTO meta (name, value) VALUES ('next_txid', ?) "
    "ON CONFLICT (name) DO UPDATE SET value = excluded.value"
)


@functools.cache
def update_entity_sql(changed: tuple[int, ...]) -> str:
    """UPDATE of just these entity columns (indexes into ENTITY_COLUMNS); the key's values follow theirs."""
    sets = ", ".join(f"{ENTITY_COLUMNS[i]} = ?" for i in changed)
    return f"UPDATE entities SET {sets} WHERE {_WHERE_KEY}"
