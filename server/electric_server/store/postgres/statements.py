"""Every statement the PostgreSQL store runs (its schema and versions: postgres/schema.py).

Each statement names its columns (``rows.ENTITY_COLUMNS``, ``EVENT_COLUMNS``),
so a replica of the schema version before runs beside one of the next
(docs/scaling.md, "Changing the schema").
"""

from __future__ import annotations

from ..rows import ENTITY_COLUMNS, ENTITY_KEY, EVENT_COLUMNS
from .known import CLOCK_LAG_MS
from .schema import COLUMN_TYPES, FEED_BEFORE_COLUMNS, TERMINAL, WANTS_RUNTIME, params, quoted

__all__ = [
    "ANNOUNCE_SESSION",
    "CURRENT_SNAPSHOT",
    "END_REPLICA",
    "END_REPLICA_SESSIONS",
    "END_SESSIONS",
    "END_WORKER_SESSIONS",
    "FEED_CHANNEL",
    "FEED_PEERS",
    "FLUSH_ROWS",
    "FLUSH_WIDTHS",
    "FORGET_REPLICAS",
    "FORGET_SESSIONS",
    "INSERT_EVENTS",
    "INSERT_ROWS",
    "INSERT_SESSION",
    "INSERT_WIDTHS",
    "LOCKED_AT",
    "LOCK_AND_DRAW",
    "LOCK_ENTITY",
    "NEXT_TXIDS",
    "NOTIFY_FEED",
    "ONE_INSERT",
    "ONE_KEY",
    "ONE_UPDATE",
    "ONE_UPDATE_GUESSED",
    "ONE_WRITE_COLUMNS",
    "PRUNE_FEED",
    "PURGE_IDEMPOTENCY",
    "READER_SETTINGS",
    "READ_AND_DRAW",
    "READ_FEED",
    "RENEW_REPLICA",
    "RENEW_REPLICA_AND_SESSIONS",
    "ROLLBACK_TO_SAVEPOINT",
    "SAVEPOINT",
    "SELECT_AWAITING",
    "SELECT_BACKEND_START",
    "SELECT_BOUND_RUNS",
    "SELECT_CHILDREN_ENDED",
    "SELECT_DUE_DEADLINES",
    "SELECT_ENTITIES",
    "SELECT_ENTITY",
    "SELECT_EVENTS",
    "SELECT_FED_XACT",
    "SELECT_HEAD_TXID",
    "SELECT_IDEMPOTENCY",
    "SELECT_IDEMPOTENCY_MANY",
    "SELECT_INTERRUPTS_DUE",
    "SELECT_LOST_LEASES",
    "SELECT_SETTLED",
    "SELECT_STOPPING_DEADLINES",
    "SELECT_TYPE_PROFILES",
    "SELECT_UNLEASED",
    "SELECT_VERSION_CHOICES",
    "SESSION_SETTINGS",
    "SWEEP_FINDS",
    "TERMINATE_BACKEND",
    "UPSERT_TYPE_PROFILE",
    "UPSERT_VERSION_CHOICE",
]

_ENTITY_LIST = quoted(ENTITY_COLUMNS)
_VALUE_COLUMNS = tuple(c for c in ENTITY_COLUMNS if c not in ENTITY_KEY)
# The database's clock, in milliseconds since the epoch: every replica judges deadlines by it.
_NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
# Whether entity e's lease holder is live: its session and that session's replica unexpired.
_HOLDER_LIVE = (
    "EXISTS (SELECT 1 FROM sessions s JOIN replicas r ON r.id = s.replica "
    "WHERE s.id = e.lease_session AND s.expires_at > clock_timestamp() AND r.expires_at > clock_timestamp())"
)
_E_LIST = ", ".join(f'e."{c}"' for c in ENTITY_COLUMNS)

SELECT_ENTITY = f"SELECT {_ENTITY_LIST} FROM entities WHERE type = $1 AND id = $2"
SELECT_ENTITIES = f"SELECT {_ENTITY_LIST} FROM entities"  # the caller adds WHERE, ORDER and LIMIT
# Ended children whose parent is not told yet (core/cascade.py), through entities_untold.
SELECT_CHILDREN_ENDED = (
    f"SELECT {_ENTITY_LIST} FROM entities WHERE parent <> '' AND NOT parent_told "
    f"AND state IN ({TERMINAL}) LIMIT $1"
)
# Entities whose aborted runs' children are still to be told (core/cascade.py), through
# entities_interrupted.
SELECT_INTERRUPTS_DUE = (
    f"SELECT {_ENTITY_LIST} FROM entities "
    "WHERE interrupted_runs <> '' AND interrupted_runs NOT LIKE '~%' LIMIT $1"
)
# Entities waiting to be woken by another's run's end (core/child_wakes.py), through
# entities_awaiting.
SELECT_AWAITING = f"SELECT {_ENTITY_LIST} FROM entities WHERE awaited_runs <> '' LIMIT $1"
# A write locks its rows with, after the record's columns, the transaction that last wrote each
# (``xact``, NULL if none since version 2; feed_order.py), and sets it to its own; then whether
# the row's lease holder is live (store/sessions.py), judged under the lock.
_XACT = "e.xact::text::bigint"
_LOCKED = f"{_E_LIST}, {_XACT}, e.lease_session <> '' AND {_HOLDER_LIVE}"
LOCK_ENTITY = f"SELECT {_LOCKED} FROM entities e WHERE e.type = $1 AND e.id = $2 FOR UPDATE OF e"
# A batch's locks, txids and stored keys in one statement: the rows locked in (type, id) order,
# then (the one-time filter reads every locked row first) its txids drawn, so after the locks.
# The keys ($4..$6) are read with the statement's snapshot, taken before any wait for a lock: a
# retry that stored a key meanwhile is missed. So ``fresh`` says whether the snapshot still holds
# every commit that could have written the keys of the rows locked: at most one row is locked
# (with two, another transaction could take its id between our two locks, lock the second row,
# store a key and commit, all unseen), no transaction in progress at the snapshot has committed
# since, and none took a transaction id after it (our own, taken by the lock, is its xmax: a
# lock holder we waited for took its id before ours). When not fresh (a write elsewhere too
# clears it), the writer reads the keys again, with a statement of their own.
# One row per locked entity: the txids, the transaction's id, the database's clock, ``fresh``,
# the stored keys as 5 arrays, then LOCK_ENTITY's columns (NULL ones when no row is there yet).
_SNAPSHOT = "pg_current_snapshot()"
LOCK_AND_DRAW = (
    f"WITH locked AS (SELECT {_E_LIST}, {_XACT} AS last_xact, e.lease_session <> '' AND {_HOLDER_LIVE} "
    "AS holder_live FROM entities e WHERE (e.type, e.id) IN (SELECT * FROM unnest($1::text[], $2::text[])) "
    "ORDER BY e.type, e.id FOR UPDATE OF e), "
    "drawn AS (SELECT array_agg(t ORDER BY t) AS txids FROM (SELECT nextval('electric_txid') AS t "
    "FROM generate_series(1, $3::int) WHERE (SELECT count(*) FROM locked) >= 0) s), "
    "stored AS (SELECT array_agg(i.type) AS types, array_agg(i.id) AS ids, array_agg(i.key) AS keys, "
    "array_agg(i.request_hash) AS hashes, array_agg(i.response) AS responses FROM idempotency i "
    "WHERE (i.type, i.id, i.key) IN (SELECT * FROM unnest($4::text[], $5::text[], $6::text[]))) "
    f"SELECT drawn.txids, pg_current_xact_id()::text::bigint, {_NOW_MS}, (SELECT count(*) FROM locked) <= 1 "
    f"AND pg_current_xact_id() = pg_snapshot_xmax({_SNAPSHOT}) AND NOT EXISTS (SELECT 1 FROM "
    f"pg_snapshot_xip({_SNAPSHOT}) x WHERE pg_xact_status(x) IS DISTINCT FROM 'in progress'), "
    "stored.*, locked.* FROM drawn CROSS JOIN stored LEFT JOIN locked ON true"
)
# Where LOCK_AND_DRAW's columns of LOCK_ENTITY's start.
LOCKED_AT = 9
# A new entity's rows are inserted in a savepoint (postgres/transaction.py); never released: COMMIT keeps
# what it holds, and RELEASE would be one more round trip.
SAVEPOINT = "SAVEPOINT electric_insert"
ROLLBACK_TO_SAVEPOINT = "ROLLBACK TO SAVEPOINT electric_insert"
SELECT_STOPPING_DEADLINES = (
    "SELECT type, id, stopping_deadline FROM entities WHERE stopping_deadline IS NOT NULL"
)
SELECT_HEAD_TXID = "SELECT coalesce(max(txid), 0) FROM entities"
# With each txid, the transaction's own id (the commit feed's position of its commits) and the
# database's clock (the batch's ``WriteContext.now_ms``).
NEXT_TXIDS = (
    f"SELECT nextval('electric_txid'), pg_current_xact_id()::text::bigint, {_NOW_MS} "
    "FROM generate_series(1, $1::int) ORDER BY 1"
)

# The deadline sweeps' (store/base.py), judged by the database's clock. Claimed with SKIP LOCKED:
# a row another replica is writing now (firing the same deadline) is left to it.
SELECT_DUE_DEADLINES = (
    f"SELECT type, id, stopping_deadline FROM entities WHERE stopping_deadline <= {_NOW_MS} "
    "ORDER BY stopping_deadline LIMIT $1 FOR UPDATE SKIP LOCKED"
)
# Found through the holders, not the held rows: the distinct holders are walked in the index
# entities_by_holder (a skip scan: one probe per holder, however many leases each holds), the
# live ones dropped, and only a gone holder's rows are read. Scanning every held row instead
# took 51 ms with 100k leases (every poll, on every replica) against 0.26 ms so. The live
# sessions are listed once and hashed: a correlated _HOLDER_LIVE would run once per holder
# (clock_timestamp() keeps PostgreSQL from making it an anti-join).
_HOLDERS = (
    "WITH RECURSIVE holders(id) AS ("
    "(SELECT lease_session FROM entities WHERE lease_session <> '' ORDER BY lease_session LIMIT 1) "
    "UNION ALL SELECT (SELECT e.lease_session FROM entities e WHERE e.lease_session <> '' "
    "AND e.lease_session > h.id ORDER BY e.lease_session LIMIT 1) FROM holders h WHERE h.id IS NOT NULL) "
)


# Each sweep query once, as a function of its columns and parameters: alone (the store's
# lost_leases, settled_streams, unleased) and together (SWEEP_FINDS) they say the same.
def _lost_leases(columns: str, limit: str) -> str:
    """FROM the holders (``_HOLDERS``): the rows (``columns`` of e) held by those not live."""
    return (
        f"SELECT l.* FROM holders h CROSS JOIN LATERAL (SELECT {columns} FROM entities e "
        f"WHERE e.lease_session <> '' AND e.lease_session = h.id LIMIT {limit} FOR UPDATE SKIP LOCKED) l "
        "WHERE h.id IS NOT NULL AND h.id NOT IN (SELECT s.id FROM sessions s JOIN replicas r ON r.id = s.replica "
        f"WHERE s.expires_at > clock_timestamp() AND r.expires_at > clock_timestamp()) LIMIT {limit}"
    )


def _settled(columns: str, settle_ms: str, limit: str) -> str:
    return (
        f"SELECT {columns} FROM entities e WHERE NOT e.closed AND e.state IN ({TERMINAL}) "
        f"AND (e.lease_session = '' OR e.updated_at <= {_NOW_MS} - {settle_ms} OR NOT {_HOLDER_LIVE}) "
        f"LIMIT {limit} FOR UPDATE OF e SKIP LOCKED"
    )


# Entities of some types, in some states, that want a runtime and have no holder (one whose
# holder is gone has none once the sweep's lost_leases ended it), through entities_unleased.
def _unleased(types: str, states: str, limit: str) -> str:
    return (
        f"SELECT {_ENTITY_LIST} FROM entities WHERE {WANTS_RUNTIME} AND type = ANY({types}::text[]) "
        f"AND state = ANY({states}::text[]) ORDER BY type, id LIMIT {limit}"
    )


SELECT_LOST_LEASES = _HOLDERS + _lost_leases("e.type, e.id, e.lease_epoch", "$1")
SELECT_SETTLED = _settled("e.type, e.id", "$1", "$2")
SELECT_UNLEASED = _unleased("$1", "$2", "$3")
# The three in one statement (Store.sweep_finds), each row its kind (1 lost, 2 settled,
# 3 unleased) and then its entity's columns: one round trip at each poll instead of three.
# $1 the limit of each, $2 the settle (ms), $3 the types to offer, $4 their states.
SWEEP_FINDS = (
    f"{_HOLDERS}, lost AS ({_lost_leases(_E_LIST, '$1')}), settled AS ({_settled(_E_LIST, '$2', '$1')}), "
    f"unleased AS ({_unleased('$3', '$4', '$1')}) "
    f"SELECT 1, {_ENTITY_LIST} FROM lost UNION ALL SELECT 2, {_ENTITY_LIST} FROM settled "
    f"UNION ALL SELECT 3, {_ENTITY_LIST} FROM unleased"
)

# The session book (store/sessions.py): $ttl in milliseconds, expiry by the database's clock.
_EXPIRY = "clock_timestamp() + $3::bigint * interval '1 millisecond'"
RENEW_REPLICA = (
    "INSERT INTO replicas (id, expires_at) VALUES ($1, clock_timestamp() + $2::bigint * interval "
    "'1 millisecond') ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at"
)
# The heartbeat: the replica's row and its sessions' in one statement, one round trip and one
# commit at every poll (a transaction of the two took four: BEGIN, two statements, COMMIT).
# A data-modifying WITH runs once, whether the query reads it or not.
RENEW_REPLICA_AND_SESSIONS = (
    "WITH replica AS (INSERT INTO replicas (id, expires_at) VALUES "
    f"($1, {_EXPIRY}) ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at) "
    f"UPDATE sessions SET expires_at = {_EXPIRY} WHERE id = ANY($2::text[]) AND replica = $1 RETURNING id"
)
# A hello ends its worker's other sessions, on any replica; the ids go back (their leases end now).
END_WORKER_SESSIONS = "DELETE FROM sessions WHERE worker_id = $1 RETURNING id"
INSERT_SESSION = (
    "INSERT INTO sessions (id, worker_id, replica, types, code_version, capacity, expires_at) "
    "VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp() + $7::bigint * interval '1 millisecond')"
)
ANNOUNCE_SESSION = "UPDATE sessions SET types = $2::text[], code_version = $3 WHERE id = $1"
END_SESSIONS = "DELETE FROM sessions WHERE id = ANY($1::text[])"
END_REPLICA_SESSIONS = "DELETE FROM sessions WHERE replica = $1"
END_REPLICA = "DELETE FROM replicas WHERE id = $1"
# Rows of sessions and replicas that expired long ago ($1 ms): a replica killed, or a worker gone
# with its replica, leaves its rows behind; a hello forgets them (an expired holder is not live
# with its row or without it, so this changes no lease).
FORGET_SESSIONS = (
    "DELETE FROM sessions WHERE expires_at < clock_timestamp() - $1::bigint * interval '1 millisecond'"
)
FORGET_REPLICAS = (
    "DELETE FROM replicas WHERE expires_at < clock_timestamp() - $1::bigint * interval '1 millisecond'"
)

INSERT_EVENTS = (
    f"INSERT INTO events (type, id, {quoted(EVENT_COLUMNS)}) VALUES ({params(2 + len(EVENT_COLUMNS))})"
)
SELECT_EVENTS = (
    f'SELECT {quoted(EVENT_COLUMNS)} FROM events WHERE type = $1 AND id = $2 AND "offset" >= $3 '
    'ORDER BY "offset" LIMIT $4'
)

SELECT_IDEMPOTENCY = "SELECT request_hash, response FROM idempotency WHERE type = $1 AND id = $2 AND key = $3"
# A batch's keys at once, read under its locks.
SELECT_IDEMPOTENCY_MANY = (
    "SELECT type, id, key, request_hash, response FROM idempotency WHERE (type, id, key) IN "
    "(SELECT * FROM unnest($1::text[], $2::text[], $3::text[]))"
)
# A bounded slice of the keys past their retention by the database's clock, claimed with SKIP
# LOCKED: replicas purging at once take different rows, and none waits on another's.
PURGE_IDEMPOTENCY = (
    "DELETE FROM idempotency WHERE (type, id, key) IN (SELECT type, id, key FROM idempotency "
    f"WHERE created_at < {_NOW_MS} - $1 AND key LIKE $2 ORDER BY created_at LIMIT $3 "
    "FOR UPDATE SKIP LOCKED)"
)

SELECT_TYPE_PROFILES = (
    "SELECT type, code_version, seq, grace_ms, idle_timeout_ms, versioning, upgrade_after_ms, children "
    "FROM type_profiles"
)
UPSERT_TYPE_PROFILE = (
    "INSERT INTO type_profiles (type, code_version, seq, grace_ms, idle_timeout_ms, versioning, "
    "upgrade_after_ms, children) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (type, code_version) "
    "DO UPDATE SET grace_ms = excluded.grace_ms, idle_timeout_ms = excluded.idle_timeout_ms, "
    "versioning = excluded.versioning, upgrade_after_ms = excluded.upgrade_after_ms, "
    "children = excluded.children"
)
SELECT_VERSION_CHOICES = "SELECT type, selected, ramp_version, ramp_percent FROM version_choices"
UPSERT_VERSION_CHOICE = (
    "INSERT INTO version_choices (type, selected, ramp_version, ramp_percent) VALUES ($1, $2, $3, $4) "
    "ON CONFLICT (type) DO UPDATE SET selected = excluded.selected, "
    "ramp_version = excluded.ramp_version, ramp_percent = excluded.ramp_percent"
)
# Runs in flight per code version (the version's row in `electric versions`): a scan of the
# type's entities, for an operator's command.
SELECT_BOUND_RUNS = (
    "SELECT run_version, count(*), count(*) FILTER (WHERE lease_session = '') FROM entities "
    "WHERE type = $1 AND cursor_attempt > 0 AND run_version <> '' AND NOT closed GROUP BY run_version"
)

# -- the commit feed (postgres/feed.py) ----------------------------------------------------

_FEED_COLUMNS = ("origin", "ts", *ENTITY_COLUMNS, *FEED_BEFORE_COLUMNS)
# The row's transaction id is the column's default: the writing transaction's.
_EVENT_TYPES = ("text", "text", "bigint", "text", "text", "integer", "bigint", "bigint", "bytea")
_FEED_TYPES = (
    "bigint",
    "bigint",
    *(COLUMN_TYPES[c].split()[0] for c in ENTITY_COLUMNS),
    *(COLUMN_TYPES[c].split()[0] for c in ENTITY_COLUMNS if c not in ENTITY_KEY),
)


def _unnest(types: tuple[str, ...], start: int) -> str:
    return ", ".join(f"${i}::{t}[]" for i, t in enumerate(types, start=start))


if len(_EVENT_TYPES) != 2 + len(EVENT_COLUMNS):
    raise ImportError("the events' column types do not match their columns")
# A batch's rows in one statement, each table's columns as arrays (``unnest``): one round trip,
# however many rows and tables. No ON CONFLICT: a racing insert of the same entity fails with
# unique_violation, and the store decides the write again on the row the other transaction
# committed.
_ENTITY_ARRAYS = tuple(COLUMN_TYPES[c].split()[0] for c in ENTITY_COLUMNS)
_IDEMPOTENCY_TYPES = ("text", "text", "text", "bytea", "bytea", "bigint")
_WRITES = {
    "updated": (
        "UPDATE entities e SET "
        + ", ".join(f'"{c}" = v."{c}"' for c in _VALUE_COLUMNS)
        + ", xact = pg_current_xact_id() FROM unnest({}) AS v("
        + _ENTITY_LIST
        + ") WHERE e.type = v.type AND e.id = v.id",
        _ENTITY_ARRAYS,
    ),
    "inserted": (
        f"INSERT INTO entities ({_ENTITY_LIST}, xact) SELECT *, pg_current_xact_id() FROM unnest({{}})",
        _ENTITY_ARRAYS,
    ),
    "appended": (
        f"INSERT INTO events (type, id, {quoted(EVENT_COLUMNS)}) SELECT * FROM unnest({{}})",
        _EVENT_TYPES,
    ),
    "remembered": (
        "INSERT INTO idempotency (type, id, key, request_hash, response, created_at) SELECT * FROM unnest({})",
        _IDEMPOTENCY_TYPES,
    ),
    "fed": (f"INSERT INTO commit_feed ({quoted(_FEED_COLUMNS)}) SELECT * FROM unnest({{}})", _FEED_TYPES),
}


def _write_rows(*tables: str) -> tuple[str, tuple[int, ...]]:
    """The statement writing ``tables``' rows (data-modifying CTEs, the last one the main
    statement), and how many values a row of each has."""
    parts, start = [], 1
    for name in tables:
        sql, types = _WRITES[name]
        parts.append(sql.format(_unnest(types, start)))
        start += len(types)
    ctes = ", ".join(f"{name} AS ({sql})" for name, sql in zip(tables, parts[:-1], strict=False))
    return (f"WITH {ctes} " if ctes else "") + parts[-1], tuple(len(_WRITES[t][1]) for t in tables)


# The rows of a batch's locked entities (``flush``), and a new entity's (in a savepoint).
FLUSH_ROWS, FLUSH_WIDTHS = _write_rows("updated", "appended", "remembered", "fed")
INSERT_ROWS, INSERT_WIDTHS = _write_rows("inserted", "appended", "remembered")
CURRENT_SNAPSHOT = "SELECT pg_current_snapshot()::text"
# Session settings of every connection a store opens. JIT off: every statement here is short (a
# row, a page of rows), and PostgreSQL JIT-compiles any whose *estimated* cost passes
# jit_above_cost, which the estimates on a table without statistics do. Measured: one feed read
# over 254k feed rows without statistics spent 434 ms compiling a plan that ran in 0.06 ms.
SESSION_SETTINGS = {"jit": "off"}
# The feed reader's, besides: commit_feed churns, and is read before autovacuum first analyzes it
# (a new database's first minute; every test's database). Without statistics the planner scans
# the whole table on every read (1 ms at 2,000 rows, and growing with it) where the index on xact
# finds the few new rows. Every statement of that connection is such a lookup, so sequential
# scans are priced out there, and only there.
READER_SETTINGS = {**SESSION_SETTINGS, "enable_seqscan": "off"}
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
# How many other feed readers (connections named $1) listen on this database: the replicas a
# doorbell would reach. pg_stat_activity shows every role's application_name and database.
FEED_PEERS = (
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND application_name = $1 AND pid <> pg_backend_pid()"
)
PRUNE_FEED = "DELETE FROM commit_feed WHERE xact < $1::text::xid8"


# -- a lone write in one or two round trips, no transaction block (postgres/one_trip.py) -------

# The first, a read: the row as committed (no lock), the transaction that last wrote it and
# whether its holder is live, a txid drawn after the statement's snapshot was taken (so above
# every txid of a commit the snapshot holds), the database's clock, and the key's stored answer.
# One row: the txid, the clock, the key's request hash and response (NULL: none), then
# LOCK_ENTITY's columns (NULL ones when there is no row), then a spare txid (postgres/known.py).
_SPARE = "nextval('electric_txid')"
# The clock to the microsecond (a float of ms): a reading postgres/known.py bounds its guess by.
_NOW_EXACT_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::float8"
READ_AND_DRAW = (
    f"SELECT nextval('electric_txid'), {_NOW_MS}, k.request_hash, k.response, {_LOCKED}, {_SPARE}, "
    f"{_NOW_EXACT_MS} "
    "FROM (SELECT 1) one LEFT JOIN entities e ON e.type = $1 AND e.id = $2 "
    "LEFT JOIN idempotency k ON k.type = $1 AND k.id = $2 AND k.key = $3"
)
_WRITTEN = "EXISTS (SELECT FROM written)"
_KEY_VALUES = ", ".join(f"${i}::{t}" for i, t in enumerate(_IDEMPOTENCY_TYPES, start=1))


def _one_write(entity_sql: str, entity_params: int, checked: str = "") -> str:
    """The second, one statement that commits by itself: the entity's row (``written``, which
    returns the transaction's id, or no row when the write raced: then nothing is written),
    its events, its key's answer, and its feed row. Its one row (none if nothing was written):
    the transaction's id, a spare txid and the database's clock in ms, exact (postgres/known.py).
    ``checked``: a query of one row of guesses checked (``ONE_UPDATE_GUESSED``), whose columns
    follow, on a row returned whether anything was written or not."""
    start = entity_params + 1
    events = _unnest(_EVENT_TYPES, start)
    start += len(_EVENT_TYPES)
    key = ", ".join(f"${i}::{t}" for i, t in enumerate(_IDEMPOTENCY_TYPES, start=start))
    start += len(_IDEMPOTENCY_TYPES)
    feed = ", ".join(f"${i}::{t}" for i, t in enumerate(_FEED_TYPES, start=start))
    final = f"SELECT xact, {_SPARE}, {_NOW_EXACT_MS} FROM written"
    if checked:
        final = f"SELECT (SELECT xact FROM written), {_SPARE}, {_NOW_EXACT_MS}, c.* FROM checked c"
    return (
        ("WITH " if not checked else f"WITH checked AS ({checked}), ")
        + f"written AS ({entity_sql} RETURNING pg_current_xact_id()::text::bigint AS xact), "
        f"appended AS (INSERT INTO events (type, id, {quoted(EVENT_COLUMNS)}) SELECT * FROM unnest({events}) "
        f"WHERE {_WRITTEN}), "
        "remembered AS (INSERT INTO idempotency (type, id, key, request_hash, response, created_at) "
        f"SELECT {key} WHERE ${start - len(_IDEMPOTENCY_TYPES) + 2}::text IS NOT NULL AND {_WRITTEN}), "
        f"fed AS (INSERT INTO commit_feed ({quoted(_FEED_COLUMNS)}) SELECT {feed} WHERE {_WRITTEN}) " + final
    )


_N_ENTITY = len(ENTITY_COLUMNS)
_SET_ENTITY = (
    "UPDATE entities e SET "
    + ", ".join(
        f'"{c}" = ${i}::{COLUMN_TYPES[c].split()[0]}'
        for i, c in enumerate(ENTITY_COLUMNS, 1)
        if c not in ENTITY_KEY
    )
    + ", xact = pg_current_xact_id() WHERE e.type = $1 AND e.id = $2"
)
# An existing entity's write, compare-and-set on the txid it was read with ($N+1): every commit
# sets a new one, so an unchanged txid means no commit since the read.
ONE_UPDATE = _one_write(
    f"{_SET_ENTITY} AND e.txid = ${_N_ENTITY + 1}",
    _N_ENTITY + 1,
)
# The same on a guess (postgres/guess.py): the row as this replica last knew it ($N+1: its txid), the
# clock ($N+2: no later than the database's, nor more than CLOCK_LAG_MS behind it) and whether
# the holder is live ($N+3), each checked (``checked``, returned in MISS_REASONS' order: which
# guess was wrong); a wrong one writes nothing, as a race does (the compare-and-set on the txid
# is the update's own, so that it holds at the update, not only at the statement's snapshot).
ONE_UPDATE_GUESSED = _one_write(
    f"{_SET_ENTITY} AND e.txid = ${_N_ENTITY + 1} AND (SELECT clock_ok AND holder_ok FROM checked)",
    _N_ENTITY + 3,
    f"SELECT e.txid = ${_N_ENTITY + 1} AS row_ok, "
    f"${_N_ENTITY + 2}::bigint BETWEEN {_NOW_MS} - {CLOCK_LAG_MS} AND {_NOW_MS} AS clock_ok, "
    f"(e.lease_session <> '' AND {_HOLDER_LIVE}) = ${_N_ENTITY + 3}::boolean AS holder_ok "
    "FROM entities e WHERE e.type = $1 AND e.id = $2",
)
# A new entity's: a racing insert of the same entity ends in unique_violation, nothing written.
ONE_INSERT = _one_write(
    f"INSERT INTO entities ({_ENTITY_LIST}, xact) VALUES ("
    + ", ".join(f"${i}::{COLUMN_TYPES[c].split()[0]}" for i, c in enumerate(ENTITY_COLUMNS, 1))
    + ", pg_current_xact_id())",
    _N_ENTITY,
)
# How many values ONE_UPDATE and ONE_INSERT take after the entity's: events, key, feed row.
ONE_WRITE_COLUMNS = (len(_EVENT_TYPES), len(_IDEMPOTENCY_TYPES), len(_FEED_TYPES))
# A write that commits nothing but remembers its answer (a racing retry: unique_violation).
ONE_KEY = (
    f"INSERT INTO idempotency (type, id, key, request_hash, response, created_at) VALUES ({_KEY_VALUES})"
)
# Resolving a lone write whose connection was lost with the outcome unknown: its backend ended
# (the same backend: a pid is reused, its start time is not), then its feed row looked for, among
# the transactions from a snapshot taken before its statement went out (the xact index: the feed
# holds every commit of the last ten minutes, on every replica).
SELECT_BACKEND_START = "SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
TERMINATE_BACKEND = (
    "SELECT pg_terminate_backend(pid), true FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2"
)
SELECT_FED_XACT = (
    "SELECT xact::text::bigint FROM commit_feed WHERE xact >= $3::text::xid8 AND origin = $1 AND txid = $2"
)
