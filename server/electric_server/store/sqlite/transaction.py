"""One SQLite batch's transaction: its writes decided on the entities as the batch sees them, their
rows written with one statement per table at its end (the committer's ``Transaction``).

The writer is the only writer of its file, so it may remember entity records
(``EntityCache``: bounded, least recently used first out) instead of reading
them back, and write only the columns of an entity that changed
(``_write_entities``). Txids are handed out in commit order, gap-free, below
the reservation (sqlite/txids.py): a batch that needs one beyond it reserves
the next block before it commits.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Sequence

from ..base import Commit, EntityRecord, Ref, Write, WriteContext
from ..hub import Hub
from ..outcome import Applied
from ..rows import ENTITY_VALUE_INDEXES, entity_from_row, entity_row
from .faults import roll_back
from .schema import (
    INSERT_EVENT,
    INSERT_IDEMPOTENCY,
    SELECT_ENTITY,
    SELECT_IDEMPOTENCY,
    SET_NEXT_TXID,
    UPSERT_ENTITY,
    update_entity_sql,
)
from .txids import Txids

__all__ = ["ENTITY_CACHE_SIZE", "EntityCache", "SQLiteTransaction"]

ENTITY_CACHE_SIZE = 50_000

# Runs a function in the writer thread (EXTRA: SQLite syncs inside COMMIT).
InThread = Callable[[Callable[[], None]], Awaitable[None]]


class EntityCache:
    """Entity records as the file has them (updated only after a commit), the most recently
    written last; at most ``capacity``."""

    __slots__ = ("_records", "capacity")

    def __init__(self, capacity: int = ENTITY_CACHE_SIZE) -> None:
        self.capacity = capacity
        self._records: OrderedDict[Ref, EntityRecord] = OrderedDict()

    def get(self, ref: Ref) -> EntityRecord | None:
        return self._records.get(ref)

    def read(self, ref: Ref, record: EntityRecord) -> None:
        """A record read from the file."""
        self._records[ref] = record

    def committed(self, entities: dict[Ref, EntityRecord]) -> None:
        """A batch's records, now in the file."""
        records = self._records
        for ref, record in entities.items():
            records[ref] = record
            records.move_to_end(ref)
        while len(records) > self.capacity:
            records.popitem(last=False)


class SQLiteTransaction:
    """See the module docstring: begun (``BEGIN IMMEDIATE``) by the writer, on its connection."""

    __slots__ = (
        "_cache",
        "_conn",
        "_hub",
        "_in_thread",
        "_live",
        "_now",
        "_start_txid",
        "_txid",
        "_txids",
        "entities",
        "events",
        "idempotency",
        "idempotency_rows",
    )

    def __init__(
        self,
        conn: sqlite3.Connection,
        txids: Txids,
        cache: EntityCache,
        hub: Hub,
        now: int,
        live: Collection[str],
        in_thread: InThread | None,
    ) -> None:
        self._conn = conn
        self._txids = txids
        self._cache = cache
        self._hub = hub
        self._now = now
        self._live = live
        self._in_thread = in_thread
        self._start_txid = self._txid = txids.next
        # What the batch writes, applied with one statement per table at its end.
        self.entities: dict[Ref, EntityRecord] = {}
        self.events: list[tuple[object, ...]] = []
        self.idempotency: dict[tuple[str, str, str], tuple[bytes, bytes]] = {}
        self.idempotency_rows: list[tuple[object, ...]] = []

    def context(self) -> WriteContext:
        return WriteContext(self._txid, self._now, self._live)

    def remembered(self, ref: Ref, key: str) -> tuple[bytes, bytes] | None:
        found = self.idempotency.get((ref[0], ref[1], key))
        if found is None:
            row = self._conn.execute(SELECT_IDEMPOTENCY, (ref[0], ref[1], key)).fetchone()
            found = (bytes(row[0]), bytes(row[1])) if row else None
        return found

    def current(self, ref: Ref) -> EntityRecord | None:
        """The entity as this batch sees it: staged, cached, or from the file."""
        record = self.entities.get(ref) or self._cache.get(ref)
        if record is None:
            row = self._conn.execute(SELECT_ENTITY, ref).fetchone()
            if row is not None:
                record = entity_from_row(row)
                self._cache.read(ref, record)
        return record

    def stage(self, write: Write, applied: Applied) -> bool:
        if applied.outcome.commit is not None:  # (then the entity's row is written: ``after``)
            assert applied.after is not None
            self.entities[write.ref] = applied.after
            self.events.extend(applied.event_rows)
            self._txid += 1
        row = applied.idempotency_row
        if row is not None:
            self.idempotency[(row[0], row[1], row[2])] = (row[3], row[4])
            self.idempotency_rows.append(row)
        return True

    async def insert(self, write: Write, applied: Applied) -> bool:
        raise AssertionError("an SQLite batch stages every write (one writer: nothing races it)")

    async def commit(self) -> None:
        if self._in_thread is None:
            # SQLite does not sync inside this commit (sqlite/wal.py): the loop is held for
            # page-cache writes only.
            self._write_and_commit()
        else:
            await self._in_thread(self._write_and_commit)
        self._txids.next = self._txid
        self._cache.committed(self.entities)

    def _write_and_commit(self) -> None:
        """One statement per table for the whole batch; a failure here fails (and rolls back)
        the batch, so no half-written transaction survives."""
        conn = self._conn
        try:
            if self.events:
                conn.executemany(INSERT_EVENT, self.events)
            if self.entities:
                self._write_entities(conn, self.entities)
            if self.idempotency_rows:
                conn.executemany(INSERT_IDEMPOTENCY, self.idempotency_rows)
            txid = self._txid
            if txid != self._start_txid:
                if txid > self._txids.reserved_below:  # once per TXID_BLOCK txids
                    self._txids.reserve(txid)
                conn.execute(SET_NEXT_TXID, (txid,))
            conn.execute("COMMIT")
        except BaseException:
            roll_back(self._conn)
            raise

    async def roll_back(self) -> None:
        roll_back(self._conn)

    def publish(self, commits: Sequence[Commit], writes: int, started: float) -> None:
        self._hub.committed(commits, writes, started)

    def _write_entities(self, conn: sqlite3.Connection, entities: dict[Ref, EntityRecord]) -> None:
        """Write the batch's entity rows, setting only the columns that changed.

        The cache holds each entity as the file has it (it is updated only after
        a commit), so the changed columns are known without reading. Leaving the
        rest out spares SQLite the index entries of unchanged columns: a signal
        that changes no state rewrites one page of the entities table instead of
        also deleting and re-inserting its entry in the state index, which is
        fewer pages to write to the WAL and to sync.
        """
        fresh: list[tuple[object, ...]] = []
        updates: dict[tuple[int, ...], list[tuple[object, ...]]] = {}
        cache = self._cache
        for ref, after in entities.items():
            row = entity_row(after)
            before = cache.get(ref)
            if before is None:  # new, or not read by this batch (a spawn): the whole row
                fresh.append(row)
                continue
            old = entity_row(before)
            changed = tuple([i for i in ENTITY_VALUE_INDEXES if row[i] != old[i]])
            if changed:
                updates.setdefault(changed, []).append(tuple([row[i] for i in changed]) + ref)
        if fresh:
            conn.executemany(UPSERT_ENTITY, fresh)
        for changed, rows in updates.items():
            conn.executemany(update_entity_sql(changed), rows)
