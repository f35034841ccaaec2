"""The PostgreSQL database's schema and its versions (the statements: postgres/statements.py).

The entity table's columns are ``rows.ENTITY_COLUMNS`` (the record's fields),
each with its type here, once. Every identifier is quoted (the events'
``offset`` is a keyword in PostgreSQL). The schema is versioned:
``electric_schema`` holds the versions applied, ``migrate`` applies the
missing ones under an advisory lock (replicas starting together apply each
once) and refuses a database whose version is newer than this code knows.
"""

from __future__ import annotations

from typing import Any

from electric_sdk.lifecycle import STATE_RULES, TERMINAL_STATES, State

from ..rows import ENTITY_COLUMNS, ENTITY_KEY

__all__ = [
    "COLUMN_TYPES",
    "FEED_BEFORE_COLUMNS",
    "SCHEMA_VERSION",
    "TERMINAL",
    "VERSIONS",
    "WANTS_RUNTIME",
    "SchemaTooNew",
    "migrate",
    "params",
    "quoted",
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
# Columns added by a later version (each with its default, for the rows already there).
_ADDED_TYPES = {
    "lease_session": "text NOT NULL DEFAULT ''",  # version 3
    "process_running": "boolean NOT NULL DEFAULT false",  # version 3
    "run_key": "text NOT NULL DEFAULT ''",  # version 4
    "run_version": "text NOT NULL DEFAULT ''",  # version 6
    "waiting_since_ms": "bigint",  # version 6
    "parent": "text NOT NULL DEFAULT ''",  # version 7
    "parent_told": "boolean NOT NULL DEFAULT false",  # version 7
    "interrupted_runs": "text NOT NULL DEFAULT ''",  # version 8
    "awaited_runs": "text NOT NULL DEFAULT ''",  # version 8
    "on_busy": "text NOT NULL DEFAULT ''",  # version 9
    "on_busy_choices": "text NOT NULL DEFAULT ''",  # version 9
    "awaiting_run": "text NOT NULL DEFAULT ''",  # version 9
    "awaiting_offset": "bigint NOT NULL DEFAULT 0",  # version 9
    "awaiting_question": "text NOT NULL DEFAULT ''",  # version 9
    "awaiting_step": "bigint NOT NULL DEFAULT 0",  # version 9
    "ahead_offset": "bigint NOT NULL DEFAULT -1",  # version 10
    "resume_offset": "bigint NOT NULL DEFAULT -1",  # version 10
    "resume_last": "bigint NOT NULL DEFAULT -1",  # version 10
}
# Every column's type, for the statements (the versions above keep each table as it was made).
COLUMN_TYPES = {**_ENTITY_TYPES, **_ADDED_TYPES}
if tuple(COLUMN_TYPES) != ENTITY_COLUMNS:
    raise ImportError(
        f"the entities table's columns {tuple(COLUMN_TYPES)} are not EntityRecord's {ENTITY_COLUMNS}"
    )


def quoted(columns: tuple[str, ...]) -> str:
    return ", ".join(f'"{c}"' for c in columns)


def params(n: int, start: int = 1) -> str:
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

TERMINAL = ", ".join(f"'{state.value}'" for state in State if state in TERMINAL_STATES)
# Open, unheld entities that want a runtime (lifecycle.needs_runtime: their state does, or a
# message waits). An index's predicate and the query that uses it both say it with these words,
# so the planner sees that one implies the other; the index holds only these rows, few.
WANTS_RUNTIME = (
    "lease_session = '' AND NOT closed AND (state IN ("
    + ", ".join(f"'{s.value}'" for s in State if STATE_RULES[s].needs_runtime)
    + ") OR last_message_offset >= message_cursor)"
)
_ENTITY_TABLE = ",\n".join(f'    "{c}" {t}' for c, t in _ENTITY_TYPES.items())

# Version 1, the first: a later version is a new entry, expand-then-contract (a replica of the
# version before must still run beside it), never an edit of this one. The rule, and why every
# statement here names its columns: docs/scaling.md, "Changing the schema".
VERSIONS: dict[int, str] = {
    1: f"""
CREATE TABLE entities (
{_ENTITY_TABLE},
    PRIMARY KEY (type, id)
);
CREATE INDEX entities_by_state ON entities (state, type, id);
CREATE INDEX entities_by_deadline ON entities (stopping_deadline) WHERE stopping_deadline IS NOT NULL;
CREATE INDEX entities_ended_open ON entities (type, id) WHERE NOT closed AND state IN ({TERMINAL});
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
    # The commit feed between replicas (postgres/feed.py): a row per commit, and on each entity
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
    # Leases and sessions in the database, so several replicas share them (store/sessions.py):
    # the holder on the entity's row; the sessions and replicas that keep holders live.
    3: f"""
ALTER TABLE entities ADD COLUMN lease_session text NOT NULL DEFAULT '';
ALTER TABLE entities ADD COLUMN process_running boolean NOT NULL DEFAULT false;
CREATE INDEX entities_by_holder ON entities (lease_session) WHERE lease_session <> '';
CREATE INDEX entities_unleased ON entities (type, id) WHERE {WANTS_RUNTIME};
CREATE TABLE replicas (
    id text PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
CREATE TABLE sessions (
    id text PRIMARY KEY,
    worker_id text NOT NULL,
    replica text NOT NULL,
    types text[] NOT NULL,
    code_version text NOT NULL,
    capacity integer NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX sessions_by_worker ON sessions (worker_id);
CREATE INDEX sessions_by_replica ON sessions (replica);
-- The feed's rows carry the entity's record (version 2): its new columns too.
ALTER TABLE commit_feed ADD COLUMN lease_session text NOT NULL DEFAULT '';
ALTER TABLE commit_feed ADD COLUMN process_running boolean NOT NULL DEFAULT false;
ALTER TABLE commit_feed ADD COLUMN b_lease_session text;
ALTER TABLE commit_feed ADD COLUMN b_process_running boolean;
""",
    # The run a SIGINT may abort in its own commit (EntityRecord.run_key), and on the feed's rows.
    4: """
ALTER TABLE entities ADD COLUMN run_key text NOT NULL DEFAULT '';
ALTER TABLE commit_feed ADD COLUMN run_key text NOT NULL DEFAULT '';
ALTER TABLE commit_feed ADD COLUMN b_run_key text;
""",
    # Entities are listed (and paged, and locked) in (type, id) order by code point, as SQLite's
    # BINARY does, whatever the database's collation: under a language's (ICU 'en-US', a libc
    # 'en_US.UTF-8') 'B' sorts after 'a' and '_x' first, so `electric ls` read differently on
    # the two stores. Only the key's two columns: every other comparison is equality, which a
    # column's collation does not change, and the default collation yields to "C" wherever the
    # two meet. A database that already orders by code point keeps its columns (altering them
    # rebuilds the entity table's indexes under a lock the other replicas' writes wait for).
    # pg_database.datlocprovider is PostgreSQL 15's (before it every database's provider is libc),
    # so it is read only there: the store runs on 13 and 14 too (pg_current_xact_id, xid8).
    5: """
DO $$
DECLARE
    libc boolean := true;
BEGIN
    IF current_setting('server_version_num')::int >= 150000 THEN
        EXECUTE 'SELECT datlocprovider = ''c'' FROM pg_database WHERE datname = current_database()'
            INTO libc;
    END IF;
    IF NOT (libc AND EXISTS (
        SELECT 1 FROM pg_database WHERE datname = current_database()
        AND datcollate IN ('C', 'POSIX', 'C.UTF-8', 'C.utf8')
    )) THEN
        ALTER TABLE entities ALTER COLUMN type TYPE text COLLATE "C",
            ALTER COLUMN id TYPE text COLLATE "C";
    END IF;
END
$$;
""",
    # Runs bound to the code version they started on (EntityRecord.run_version, waiting_since_ms),
    # each type's versioning as announced, and the operators' version choices. Expand-only: a
    # replica of version 5 runs beside it (its statements name their columns; it binds no run).
    6: """
ALTER TABLE entities ADD COLUMN run_version text NOT NULL DEFAULT '';
ALTER TABLE entities ADD COLUMN waiting_since_ms bigint;
ALTER TABLE commit_feed ADD COLUMN run_version text NOT NULL DEFAULT '';
ALTER TABLE commit_feed ADD COLUMN waiting_since_ms bigint;
ALTER TABLE commit_feed ADD COLUMN b_run_version text;
ALTER TABLE commit_feed ADD COLUMN b_waiting_since_ms bigint;
ALTER TABLE type_profiles ADD COLUMN versioning text NOT NULL DEFAULT '';
ALTER TABLE type_profiles ADD COLUMN upgrade_after_ms bigint;
CREATE TABLE version_choices (
    type text PRIMARY KEY,
    selected text NOT NULL,
    ramp_version text NOT NULL,
    ramp_percent integer NOT NULL
);
""",
    # Child entities (EntityRecord.parent), each type's children policy (TypeProfile.children),
    # and the index the cascade sweep and `ls --parent` read.
    # Expand-only: a replica of version 6 runs beside it (it spawns roots; its statements name
    # their columns, so the new one keeps its default).
    7: f"""
ALTER TABLE entities ADD COLUMN parent text NOT NULL DEFAULT '';
ALTER TABLE commit_feed ADD COLUMN parent text NOT NULL DEFAULT '';
ALTER TABLE commit_feed ADD COLUMN b_parent text;
ALTER TABLE entities ADD COLUMN parent_told boolean NOT NULL DEFAULT false;
ALTER TABLE commit_feed ADD COLUMN parent_told boolean NOT NULL DEFAULT false;
ALTER TABLE commit_feed ADD COLUMN b_parent_told boolean;
ALTER TABLE type_profiles ADD COLUMN children text NOT NULL DEFAULT '';
CREATE INDEX entities_by_parent ON entities (parent, type, id) WHERE parent <> '';
CREATE INDEX entities_untold ON entities (type, id) WHERE parent <> '' AND NOT parent_told
    AND state IN ({TERMINAL});
""",
    # The delegating runs and those whose children are due their signal
    # (EntityRecord.interrupted_runs; core/child_interrupts.py), and the index the sweep reads
    # (due entries lead the column, pending ones start with "~"). Expand-only: a replica of
    # version 7 runs beside it (it never sets the column, so the runs it ends tell no children).
    # And the runs an entity asked to be woken by the end of (EntityRecord.awaited_runs;
    # core/child_wakes.py), with the index their sweep reads.
    8: """
ALTER TABLE entities ADD COLUMN interrupted_runs text NOT NULL DEFAULT '';
ALTER TABLE commit_feed ADD COLUMN interrupted_runs text NOT NULL DEFAULT '';
ALTER TABLE commit_feed ADD COLUMN b_interrupted_runs text;
CREATE INDEX entities_interrupted ON entities (type, id)
    WHERE interrupted_runs <> '' AND interrupted_runs NOT LIKE '~%';
ALTER TABLE entities ADD COLUMN awaited_runs text NOT NULL DEFAULT '';
ALTER TABLE commit_feed ADD COLUMN awaited_runs text NOT NULL DEFAULT '';
ALTER TABLE commit_feed ADD COLUMN b_awaited_runs text;
CREATE INDEX entities_awaiting ON entities (type, id) WHERE awaited_runs <> '';
""",
    # Each entity's double-texting policy (EntityRecord.on_busy, electric_sdk/busy.py), set at
    # its lease grants, and the run awaiting input (EntityRecord.awaiting_run, ctx.ask).
    # Expand-only: a replica of version 8 runs beside it (its statements name their columns;
    # its grants leave the policy as it was, its sends enqueue).
    9: """
ALTER TABLE entities ADD COLUMN on_busy text NOT NULL DEFAULT '';
ALTER TABLE entities ADD COLUMN on_busy_choices text NOT NULL DEFAULT '';
ALTER TABLE commit_feed ADD COLUMN on_busy text NOT NULL DEFAULT '';
ALTER TABLE commit_feed ADD COLUMN on_busy_choices text NOT NULL DEFAULT '';
ALTER TABLE commit_feed ADD COLUMN b_on_busy text;
ALTER TABLE commit_feed ADD COLUMN b_on_busy_choices text;
ALTER TABLE entities ADD COLUMN awaiting_run text NOT NULL DEFAULT '';
ALTER TABLE entities ADD COLUMN awaiting_offset bigint NOT NULL DEFAULT 0;
ALTER TABLE entities ADD COLUMN awaiting_question text NOT NULL DEFAULT '';
ALTER TABLE entities ADD COLUMN awaiting_step bigint NOT NULL DEFAULT 0;
ALTER TABLE commit_feed ADD COLUMN awaiting_run text NOT NULL DEFAULT '';
ALTER TABLE commit_feed ADD COLUMN awaiting_offset bigint NOT NULL DEFAULT 0;
ALTER TABLE commit_feed ADD COLUMN awaiting_question text NOT NULL DEFAULT '';
ALTER TABLE commit_feed ADD COLUMN awaiting_step bigint NOT NULL DEFAULT 0;
ALTER TABLE commit_feed ADD COLUMN b_awaiting_run text;
ALTER TABLE commit_feed ADD COLUMN b_awaiting_offset bigint;
ALTER TABLE commit_feed ADD COLUMN b_awaiting_question text;
ALTER TABLE commit_feed ADD COLUMN b_awaiting_step bigint;
""",
    # A message sent ahead of the queue, and where the queue it passed resumes
    # (EntityRecord.ahead_offset, resume_offset; core/message_cursor.py). Expand-only: a replica
    # of version 9 beside it sends every message to the back of the queue.
    10: """
ALTER TABLE entities ADD COLUMN ahead_offset bigint NOT NULL DEFAULT -1;
ALTER TABLE entities ADD COLUMN resume_offset bigint NOT NULL DEFAULT -1;
ALTER TABLE commit_feed ADD COLUMN ahead_offset bigint NOT NULL DEFAULT -1;
ALTER TABLE commit_feed ADD COLUMN resume_offset bigint NOT NULL DEFAULT -1;
ALTER TABLE commit_feed ADD COLUMN b_ahead_offset bigint;
ALTER TABLE commit_feed ADD COLUMN b_resume_offset bigint;
ALTER TABLE entities ADD COLUMN resume_last bigint NOT NULL DEFAULT -1;
ALTER TABLE commit_feed ADD COLUMN resume_last bigint NOT NULL DEFAULT -1;
ALTER TABLE commit_feed ADD COLUMN b_resume_last bigint;
""",
}
SCHEMA_VERSION = max(VERSIONS)
# pg_advisory_xact_lock's key for applying the schema: any constant of our own ("electric" in ASCII).
_MIGRATION_LOCK = 0x656C656374726963


class SchemaTooNew(Exception):
    """The database was migrated by a newer electric than this one."""


async def migrate(conn: Any, timeout_s: float | None = None) -> int:
    """Apply the schema versions the database lacks (one transaction, under the advisory lock);
    returns the database's version. Raises ``SchemaTooNew``. ``timeout_s``: each statement's bound
    (None: the connection's own)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK, timeout=timeout_s)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS electric_schema "
            "(version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())",
            timeout=timeout_s,
        )
        current = await conn.fetchval(
            "SELECT coalesce(max(version), 0) FROM electric_schema", timeout=timeout_s
        )
        known = max(VERSIONS)  # read now, not at import: a test adds a version to see N and N+1 together
        if current > known:
            raise SchemaTooNew(
                f"the database's schema is version {current}, newer than this electric knows "
                f"({known}): run a newer electric against it"
            )
        for version in range(current + 1, known + 1):
            await conn.execute(VERSIONS[version], timeout=timeout_s)
            await conn.execute(
                "INSERT INTO electric_schema (version) VALUES ($1)", version, timeout=timeout_s
            )
        return known
