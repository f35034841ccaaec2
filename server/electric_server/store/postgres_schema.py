"""The PostgreSQL database's schema, its versions, and every statement the store runs.

The entity table's columns are ``rows.ENTITY_COLUMNS`` (the record's fields),
defined here once. Every identifier is quoted (the events' ``offset`` is a
keyword in PostgreSQL). The schema is versioned: ``electric_schema`` holds the
versions applied, ``migrate`` applies the missing ones under an advisory lock
(replicas starting together apply each once) and refuses a database whose
version is newer than this code knows.
"""

from __future__ import annotations

from typing import Any

from electric_sdk.lifecycle import TERMINAL_STATES, State

from .rows import ENTITY_COLUMNS, ENTITY_KEY, EVENT_COLUMNS

__all__ = [
    "CURRENT_SNAPSHOT",
    "EVENT_WIDTH",
    "FEED_BEFORE_COLUMNS",
    "FEED_CHANNEL",
    "FEED_WIDTH",
    "INSERT_ENTITY",
    "INSERT_EVENTS",
    "INSERT_EVENTS_AND_FEED",
    "INSERT_IDEMPOTENCY",
    "LOCK_ENTITIES",
    "LOCK_ENTITY",
    "NEXT_TXIDS",
    "NOTIFY_FEED",
    "PRUNE_FEED",
    "PURGE_IDEMPOTENCY",
    "READ_FEED",
    "SCHEMA_VERSION",
    "SELECT_ENDED_OPEN",
    "SELECT_ENTITIES",
    "SELECT_ENTITY",
    "SELECT_EVENTS",
    "SELECT_HEAD_TXID",
    "SELECT_IDEMPOTENCY",
    "SELECT_IDEMPOTENCY_MANY",
    "SELECT_STOPPING_DEADLINES",
    "SELECT_TYPE_PROFILES",
    "UPDATE_ENTITY",
    "UPSERT_TYPE_PROFILE",
    "SchemaTooNew",
    "migrate",
]

# Each entity column's PostgreSQL type, in ENTITY_COLUMNS order.
_ENTITY_TYPES = {
    "type": "text NOT NULL",
    "id": "text NOT NULL",
    "state": "text NOT NULL",
    "grace_ms": "bigint NOT NULL",
    "idle_timeout_ms": "bigint NOT NULL",
    "created_at": "bigint NOT NULL",
    "updated_at": "bigint NOT NULL",
    "head_offset": "bigint NOT NULL",
    "closed": "boolean NOT NULL",
    "stopping_deadline": "bigint",
    "txid": "bigint NOT NULL",
    "lease_epoch": "bigint NOT NULL",
    "message_cursor": "bigint NOT NULL",
    "cursor_attempt": "bigint NOT NULL",
    "last_message_offset": "bigint NOT NULL",
    "reload_pending": "boolean NOT NULL",
    "grace_pending": "boolean NOT NULL",
    "idle_timeout_pending": "boolean NOT NULL",
    "cancelled_messages": "text NOT NULL",
}
if tuple(_ENTITY_TYPES) != ENTITY_COLUMNS:
    raise ImportError(
        f"the entities table's columns {tuple(_ENTITY_TYPES)} are not EntityRecord's {ENTITY_COLUMNS}"
    )


def _q(columns: tuple[str, ...]) -> str:
    return ", ".join(f'"{c}"' for c in columns)


def _params(n: int, start: int = 1) -> str:
    return ", ".join(f"${i}" for i in range(start, start + n))


# The commit feed's row: the entity's record after the commit, then (``b_`` columns) its fields
# but the key before it, all NULL for a commit that created the entity.
FEED_BEFORE_COLUMNS = tuple(f"b_{c}" for c in ENTITY_COLUMNS if c not in ENTITY_KEY)
_FEED_TABLE = ",\n".join(
    [f'    "{c}" {t}' for c, t in _ENTITY_TYPES.items()]
    + [f'    "b_{c}" {t.removesuffix(" NOT NULL")}' for c, t in _ENTITY_TYPES.items() if c not in ENTITY_KEY]
)
if ENTITY_COLUMNS[: len(ENTITY_KEY)] != ENTITY_KEY:
    raise ImportError(f"the entity's key {ENTITY_KEY} must lead its columns {ENTITY_COLUMNS}")

_TERMINAL = ", ".join(f"'{state.value}'" for state in State if state in TERMINAL_STATES)
_ENTITY_TABLE = ",\n".join(f'    "{c}" {t}' for c, t in _ENTITY_TYPES.items())

# Version 1, the first: a later version is a new entry, expand-then-contract (a replica of the
# version before must still run beside it), never an edit of this one. The rule, and why every
# statement here names its columns: docs/scaling.md, "Changing the schema".
_VERSIONS: dict[int, str] = {
    1: f"""
CREATE TABLE entities (
{_ENTITY_TABLE},
    PRIMARY KEY (type, id)
);
CREATE INDEX entities_by_state ON entities (state, type, id);
CREATE INDEX entities_by_deadline ON entities (stopping_deadline) WHERE stopping_deadline IS NOT NULL;
CREATE INDEX entities_ended_open ON entities (type, id) WHERE NOT closed AND state IN ({_TERMINAL});
CREATE INDEX entities_by_txid ON entities (txid);
CREATE TABLE events (
    type text NOT NULL,
    id text NOT NULL,
    "offset" bigint NOT NULL,
    kind text NOT NULL,
    key text NOT NULL,
    operation integer NOT NULL,
    ts bigint NOT NULL,
    txid bigint NOT NULL,
    body bytea NOT NULL,
    PRIMARY KEY (type, id, "offset")
);
CREATE TABLE idempotency (
    type text NOT NULL,
    id text NOT NULL,
    key text NOT NULL,
    request_hash bytea NOT NULL,
    response bytea NOT NULL,
    created_at bigint NOT NULL,
    PRIMARY KEY (type, id, key)
);
CREATE INDEX idempotency_by_age ON idempotency (created_at);
CREATE TABLE type_profiles (
    type text NOT NULL,
    code_version text NOT NULL,
    seq bigint NOT NULL,
    grace_ms bigint,
    idle_timeout_ms bigint,
    PRIMARY KEY (type, code_version)
);
-- Txids: unique, and drawn after the entity's row is locked, so increasing per entity in
-- commit order (PostgreSQL's own xids are neither: they are taken at a transaction's first write).
CREATE SEQUENCE electric_txid;
""",
    # The commit feed between replicas (postgres_feed.py): a row per commit, and on each entity
    # the transaction that last wrote it. Expand-only: a replica of version 1 runs beside it
    # (its commits reach no other replica until it is replaced).
    2: f"""
CREATE TABLE commit_feed (
    xact xid8 NOT NULL DEFAULT pg_current_xact_id(),
    origin bigint NOT NULL,
    ts bigint NOT NULL,
{_FEED_TABLE}
);
CREATE INDEX commit_feed_by_xact ON commit_feed (xact);
ALTER TABLE entities ADD COLUMN xact xid8;
""",
}
SCHEMA_VERSION = max(_VERSIONS)
# pg_advisory_xact_lock's key for applying the schema: any constant of our own ("electric" in ASCII).
_MIGRATION_LOCK = 0x656C656374726963


class SchemaTooNew(Exception):
    """The database was migrated by a newer electric than this one."""


async def migrate(conn: Any) -> int:
    """Apply the schema versions the database lacks (one transaction, under the advisory lock);
    returns the database's version. Raises ``SchemaTooNew``."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS electric_schema "
            "(version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        current = await conn.fetchval("SELECT coalesce(max(version), 0) FROM electric_schema")
        known = max(_VERSIONS)  # read now, not at import: a test adds a version to see N and N+1 together
        if current > known:
            raise SchemaTooNew(
                f"the database's schema is version {current}, newer than this electric knows "
                f"({known}): run a newer electric against it"
            )
        for version in range(current + 1, known + 1):
            await conn.execute(_VERSIONS[version])
            await conn.execute("INSERT INTO electric_schema (version) VALUES ($1)", version)
        return known


_ENTITY_LIST = _q(ENTITY_COLUMNS)
_VALUE_COLUMNS = tuple(c for c in ENTITY_COLUMNS if c not in ENTITY_KEY)

SELECT_ENTITY = f"SELECT {_ENTITY_LIST} FROM entities WHERE type = $1 AND id = $2"
SELECT_ENTITIES = f"SELECT {_ENTITY_LIST} FROM entities"  # the caller adds WHERE, ORDER and LIMIT
# A write locks its rows with, after the record's columns, the transaction that last wrote each
# (``xact``, NULL if none since version 2; feed_order.py), and sets it to its own.
_XACT = "xact::text::bigint"
LOCK_ENTITY = f"SELECT {_ENTITY_LIST}, {_XACT} FROM entities WHERE type = $1 AND id = $2 FOR UPDATE"
# A batch's rows, locked in (type, id) order, so two batches never wait for each other in a circle.
LOCK_ENTITIES = (
    f"SELECT {_ENTITY_LIST}, {_XACT} FROM entities WHERE (type, id) IN "
    "(SELECT * FROM unnest($1::text[], $2::text[])) ORDER BY type, id FOR UPDATE"
)
# No ON CONFLICT: a racing insert of the same entity fails with unique_violation, and the store
# decides the write again on the row the other transaction committed.
INSERT_ENTITY = (
    f"INSERT INTO entities ({_ENTITY_LIST}, xact) "
    f"VALUES ({_params(len(ENTITY_COLUMNS))}, pg_current_xact_id())"
)
UPDATE_ENTITY = (
    "UPDATE entities SET "
    + ", ".join(f'"{c}" = ${ENTITY_COLUMNS.index(c) + 1}' for c in _VALUE_COLUMNS)
    + ", xact = pg_current_xact_id() WHERE type = $1 AND id = $2"
)
SELECT_STOPPING_DEADLINES = (
    "SELECT type, id, stopping_deadline FROM entities WHERE stopping_deadline IS NOT NULL"
)
SELECT_ENDED_OPEN = f"SELECT type, id FROM entities WHERE NOT closed AND state IN ({_TERMINAL})"
SELECT_HEAD_TXID = "SELECT coalesce(max(txid), 0) FROM entities"
# With each txid, the transaction's own id (the commit feed's position of its commits).
NEXT_TXIDS = (
    "SELECT nextval('electric_txid'), pg_current_xact_id()::text::bigint "
    "FROM generate_series(1, $1::int) ORDER BY 1"
)

INSERT_EVENTS = (
    f"INSERT INTO events (type, id, {_q(EVENT_COLUMNS)}) VALUES ({_params(2 + len(EVENT_COLUMNS))})"
)
SELECT_EVENTS = (
    f'SELECT {_q(EVENT_COLUMNS)} FROM events WHERE type = $1 AND id = $2 AND "offset" >= $3 '
    'ORDER BY "offset" LIMIT $4'
)

INSERT_IDEMPOTENCY = (
    "INSERT INTO idempotency (type, id, key, request_hash, response, created_at) "
    "VALUES ($1, $2, $3, $4, $5, $6)"
)
SELECT_IDEMPOTENCY = "SELECT request_hash, response FROM idempotency WHERE type = $1 AND id = $2 AND key = $3"
# A batch's keys at once, read under its locks.
SELECT_IDEMPOTENCY_MANY = (
    "SELECT type, id, key, request_hash, response FROM idempotency WHERE (type, id, key) IN "
    "(SELECT * FROM unnest($1::text[], $2::text[], $3::text[]))"
)
PURGE_IDEMPOTENCY = "DELETE FROM idempotency WHERE created_at < $1"

SELECT_TYPE_PROFILES = "SELECT type, code_version, seq, grace_ms, idle_timeout_ms FROM type_profiles"
UPSERT_TYPE_PROFILE = (
    "INSERT INTO type_profiles (type, code_version, seq, grace_ms, idle_timeout_ms) "
    "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (type, code_version) DO UPDATE SET "
    "grace_ms = excluded.grace_ms, idle_timeout_ms = excluded.idle_timeout_ms"
)

# -- the commit feed (postgres_feed.py) ----------------------------------------------------

_FEED_COLUMNS = ("origin", "ts", *ENTITY_COLUMNS, *FEED_BEFORE_COLUMNS)
# The row's transaction id is the column's default: the writing transaction's.
# A batch's events and feed rows in one statement, each column an array: the feed costs the
# batch no round trip of its own.
_EVENT_TYPES = ("text", "text", "bigint", "text", "text", "integer", "bigint", "bigint", "bytea")
_FEED_TYPES = (
    "bigint",
    "bigint",
    *(_ENTITY_TYPES[c].split()[0] for c in ENTITY_COLUMNS),
    *(_ENTITY_TYPES[c].split()[0] for c in ENTITY_COLUMNS if c not in ENTITY_KEY),
)


def _unnest(types: tuple[str, ...], start: int) -> str:
    return ", ".join(f"${i}::{t}[]" for i, t in enumerate(types, start=start))


INSERT_EVENTS_AND_FEED = (
    f"WITH appended AS (INSERT INTO events (type, id, {_q(EVENT_COLUMNS)}) "
    f"SELECT * FROM unnest({_unnest(_EVENT_TYPES, 1)})) "
    f"INSERT INTO commit_feed ({_q(_FEED_COLUMNS)}) "
    f"SELECT * FROM unnest({_unnest(_FEED_TYPES, 1 + len(_EVENT_TYPES))})"
)
if len(_EVENT_TYPES) != 2 + len(EVENT_COLUMNS):
    raise ImportError("the events' column types do not match their columns")
# How many values a feed row and an event row have (INSERT_EVENTS_AND_FEED's arrays).
FEED_WIDTH = len(_FEED_COLUMNS)
EVENT_WIDTH = len(_EVENT_TYPES)
CURRENT_SNAPSHOT = "SELECT pg_current_snapshot()::text"
# What the snapshot $1 did not cover and this statement's snapshot (its first column) does: rows
# of transactions from $1's xmax on, or in progress at $1. Not the replica's own ($2), but for
# those whose COMMIT was cut off ($3). One row with NULLs after the snapshot when there is none.
# Each row's last column: its commit's events (from the head before it to the head after it).
READ_FEED = f"""
WITH now AS (SELECT pg_current_snapshot()::text AS snapshot)
SELECT now.snapshot, {", ".join(f'f."{c}"' for c in ("ts", *ENTITY_COLUMNS, *FEED_BEFORE_COLUMNS))},
  ARRAY(SELECT ROW({", ".join(f'e."{c}"' for c in EVENT_COLUMNS)}) FROM events e
        WHERE e.type = f.type AND e.id = f.id
          AND e."offset" >= coalesce(f.b_head_offset, 0) AND e."offset" < f.head_offset
        ORDER BY e."offset")
FROM now LEFT JOIN commit_feed f
  ON (f.xact >= pg_snapshot_xmax($1::text::pg_snapshot)
      OR f.xact = ANY(ARRAY(SELECT pg_snapshot_xip($1::text::pg_snapshot))))
  AND (f.origin <> $2 OR f.txid = ANY($3::bigint[]))
ORDER BY f.txid
"""
FEED_CHANNEL = "electric_feed"
NOTIFY_FEED = f"SELECT pg_notify('{FEED_CHANNEL}', $1)"
PRUNE_FEED = "DELETE FROM commit_feed WHERE xact < $1::text::xid8"
