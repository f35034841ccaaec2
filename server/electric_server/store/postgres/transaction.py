"""One PostgreSQL batch's transaction: its writes decided on their locked rows (the committer's
``Transaction``, store/transaction.py).

A batch runs in one transaction on one pooled connection:

1. its entities' rows are locked ``FOR UPDATE`` in (type, id) order, so two
   batches never wait for each other in a circle (were they to, PostgreSQL's
   deadlock error, or a serialization failure, re-runs the whole batch: its
   decide functions run again on what is current then);
2. txids are drawn from the ``electric_txid`` sequence after the locks (in
   the locking statement, once every row is locked), so each entity's txids
   increase in commit order (a write that commits takes the next one drawn;
   a refused one takes none, but numbers may be skipped);
3. the batch's stored idempotency keys are read by the locking statement,
   and again, by a statement of their own after the locks, unless that one
   says its snapshot, taken before any wait for a lock, cannot have missed a
   racing retry's key (one row locked, nothing committed or begun
   meanwhile). Each write's rows are staged, to be written at the end, every
   table's in one statement (``FLUSH_ROWS``);
4. a row that did not exist when the batch locked (``FOR UPDATE`` locks no
   missing row) is inserted inside a savepoint: a racing insert of the same
   entity (or idempotency key) ends in unique_violation, the savepoint is
   rolled back, the row the other transaction committed is locked, and the
   write is decided again on it (a spawn then ends as ENTITY_EXISTS, or as
   the idempotent replay), never as an internal error;
5. COMMIT. A connection lost before it fails the batch with
   ``DatabaseUnavailable``: nothing was committed. One lost during COMMIT
   leaves the outcome unknown: also ``DatabaseUnavailable``, and the
   client's retry with the same idempotency key finds out.

Within this process, writes to one entity queue for it (``RefLocks``) from
before the row lock to after publishing, so the hub sees each entity's
commits in commit order.

With the commit feed on (several replicas; postgres/feed.py), a batch also
writes a feed row per commit with its other rows, and each entity row keeps
the transaction that wrote it last; just before COMMIT the batch's txids are
told to the ``FeedOrder``, which publishes the commits after it
(postgres/publisher.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import asyncpg

from ..base import Commit, DatabaseUnavailable, EntityRecord, Idempotency, Ref, Write, WriteContext
from ..outcome import Applied, now_ms
from ..rows import ENTITY_COLUMNS, entity_from_row, entity_row
from .faults import LOST
from .publisher import Publisher
from .statements import (
    FLUSH_ROWS,
    FLUSH_WIDTHS,
    INSERT_ROWS,
    INSERT_WIDTHS,
    LOCK_AND_DRAW,
    LOCK_ENTITY,
    LOCKED_AT,
    NEXT_TXIDS,
    ROLLBACK_TO_SAVEPOINT,
    SAVEPOINT,
    SELECT_IDEMPOTENCY,
    SELECT_IDEMPOTENCY_MANY,
)

__all__ = ["PostgresTransaction", "RefLocks"]

# A locked row's columns: the record's, then the transaction that last wrote it.
_RECORD = len(ENTITY_COLUMNS)
_NO_BEFORE = (None,) * (_RECORD - 2)


class RefLocks:
    """Each entity's turn in this process (see the module docstring), taken in (type, id) order."""

    __slots__ = ("_locks",)

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[Ref, asyncio.Lock] = weakref.WeakValueDictionary()

    @contextlib.asynccontextmanager
    async def hold(self, writes: Sequence[Write]) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for ref in sorted({write.ref for write in writes}):
                lock = self._locks.get(ref)
                if lock is None:
                    lock = self._locks[ref] = asyncio.Lock()
                await stack.enter_async_context(lock)
            yield


class _Txids:
    """The txids a batch drew after its locks; a write that commits takes the next."""

    __slots__ = ("_conn", "_drawn", "_next", "xact")

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._drawn: list[int] = []
        self._next = 0
        self.xact = 0  # the transaction's id

    def drawn(self, txids: Sequence[int], xact: int) -> None:
        """The txids drawn with the locks (LOCK_AND_DRAW)."""
        self._drawn = list(txids)
        self.xact = xact
        self._next = 0

    async def draw(self, n: int) -> int:
        """Draw ``n`` txids; returns the database's clock (ms) as they were drawn."""
        rows = await self._conn.fetch(NEXT_TXIDS, max(n, 1))
        self.drawn([int(row[0]) for row in rows], int(rows[0][1]))
        return int(rows[0][2])

    async def redraw(self) -> None:
        """After a row was locked late: fresh txids, above any that row's committed writes hold."""
        await self.draw(len(self._drawn) - self._next)

    def peek(self) -> int:
        return self._drawn[self._next]

    def take(self) -> None:
        self._next += 1


class PostgresTransaction:
    """One batch's transaction: its locked rows, txids, stored keys, and the rows it stages.

    Rows of entities locked at the start are staged and written at the end, in one
    statement (``commit``); a row missing at the start is written at once, in a
    savepoint (``insert``; see the module docstring, 4). ``origin``: this replica's in
    the feed's rows (None: no commit feed).
    """

    __slots__ = (
        "_commits",
        "_conn",
        "_publisher",
        "_took_writes",
        "_transaction",
        "before_xacts",
        "entities",
        "events",
        "feed_rows",
        "idempotency_rows",
        "live",
        "now",
        "origin",
        "records",
        "remembered_keys",
        "rows",
        "txids",
        "xacts",
    )

    def __init__(
        self,
        conn: Any,
        transaction: Any,
        origin: int | None,
        publisher: Publisher,
        took_writes: Callable[[], None],
    ) -> None:
        self._conn = conn
        self._transaction = transaction
        self._publisher = publisher
        self._took_writes = took_writes
        self.origin = origin
        self.txids = _Txids(conn)
        self.now = now_ms()  # until the txids are drawn: then the database's clock
        self.records: dict[Ref, EntityRecord | None] = {}  # as locked, then as staged
        # The lease holders that are live, read with the rows' locks (store/sessions.py).
        self.live: set[str] = set()
        # Idempotency keys stored, read under the locks, plus those this batch stores.
        self.remembered_keys: dict[tuple[str, str, str], tuple[bytes, bytes]] = {}
        self.entities: dict[Ref, EntityRecord] = {}  # staged: the rows' last records
        self.events: list[tuple[object, ...]] = []
        self.idempotency_rows: list[tuple[object, ...]] = []
        self._commits: list[Commit] = []
        # The transaction that wrote each locked row last; each commit's of the one before it.
        self.xacts: dict[Ref, int | None] = {}
        # Each current record as a row (the feed row's "before"; made once, kept from the lock).
        self.rows: dict[Ref, tuple[object, ...]] = {}
        self.before_xacts: dict[int, int | None] = {}
        self.feed_rows: list[tuple[object, ...]] = []

    async def lock(self, writes: Sequence[Write]) -> None:
        """Lock the rows, draw the txids and read the keys (one statement); read the keys again
        when that statement's snapshot may have missed a retry committed while it waited."""
        conn = self._conn
        refs = sorted({write.ref for write in writes})
        keys = {(w.ref[0], w.ref[1], w.idempotency.key) for w in writes if w.idempotency is not None}
        key_columns: list[list[str]] = [list(c) for c in zip(*keys, strict=True)] if keys else [[], [], []]
        rows = await conn.fetch(
            LOCK_AND_DRAW, [t for t, _ in refs], [i for _, i in refs], max(len(writes), 1), *key_columns
        )
        first = rows[0]
        self.txids.drawn(first[0], first[1])
        self.now = first[2]
        for row in rows:
            if row[LOCKED_AT] is not None:
                self._locked(row[LOCKED_AT:])
        if not keys:
            return
        stored: Any = zip(*first[4:LOCKED_AT], strict=True) if first[4] is not None else ()
        if not first[3]:  # not fresh (see LOCK_AND_DRAW)
            stored = await conn.fetch(SELECT_IDEMPOTENCY_MANY, *key_columns)
        for t, i, k, request_hash, response in stored:
            self.remembered_keys[(t, i, k)] = (bytes(request_hash), bytes(response))

    # -- the committer's Transaction ------------------------------------------------------------

    def context(self) -> WriteContext:
        return WriteContext(self.txids.peek(), self.now, self.live)

    def remembered(self, ref: Ref, key: str) -> tuple[bytes, bytes] | None:
        return self.remembered_keys.get((ref[0], ref[1], key))

    def current(self, ref: Ref) -> EntityRecord | None:
        return self.records.get(ref)

    def stage(self, write: Write, applied: Applied) -> bool:
        if self.records.get(write.ref) is not None:  # its row is locked: nobody else writes it
            if applied.after is not None:
                self.entities[applied.after.ref] = applied.after
            self.events.extend(applied.event_rows)
            if applied.idempotency_row is not None:
                self.idempotency_rows.append(applied.idempotency_row)
        elif applied.after is not None or applied.idempotency_row is not None:
            return False  # a new row: inserted at once (``insert``)
        self._took(applied)
        return True

    async def insert(self, write: Write, applied: Applied) -> bool:
        if not await self._insert(write.ref, write.idempotency, applied):
            return False
        self._took(applied)
        return True

    async def commit(self) -> None:
        try:
            await self._flush()
        except BaseException:
            await self.roll_back()
            raise
        order = self._publisher.order if self.origin is not None else None
        txids = [c.txid for c in self._commits]
        if order is not None and txids:
            order.committing(self.txids.xact, txids)
        try:
            await self._transaction.commit()
        except BaseException as exc:
            if order is not None and txids:  # committed or not: the feed reader finds out
                order.lost(self.txids.xact, txids)
            if isinstance(exc, LOST):
                raise DatabaseUnavailable(
                    "the database connection was lost during COMMIT: the write may or may not have "
                    "committed (a retry with the same idempotency key finds out)"
                ) from exc
            raise
        self._took_writes()

    async def roll_back(self) -> None:
        with contextlib.suppress(*LOST):  # a lost connection has rolled back by itself
            await self._transaction.rollback()

    def publish(self, commits: Sequence[Commit], writes: int, started: float) -> None:
        self._publisher.committed(commits, writes, started, self.txids.xact, self.before_xacts)

    # -- inside ---------------------------------------------------------------------------------

    def _took(self, applied: Applied) -> None:
        """``applied`` is the batch's: its txid taken, its entity and key current for the next writes."""
        commit = applied.outcome.commit
        if commit is not None:
            self.txids.take()
            self._commits.append(commit)
            if self.origin is not None:
                self._feed(commit)
        after = applied.after
        if after is not None:
            self.records[after.ref] = after
            if after.lease_session:  # granted now, by its live session
                self.live.add(after.lease_session)
        row = applied.idempotency_row
        if row is not None:
            self.remembered_keys[(row[0], row[1], row[2])] = (row[3], row[4])

    def _locked(self, row: Any) -> EntityRecord:
        """A row read with its lock (LOCK_ENTITY's columns): its record, the transaction that last
        wrote it, and whether its lease holder is live (noted in ``live``)."""
        values = row[:_RECORD]
        record = entity_from_row(values)
        self.records[record.ref] = record
        self.rows[record.ref] = values
        self.xacts[record.ref] = row[_RECORD]
        if row[_RECORD + 1]:
            self.live.add(record.lease_session)
        return record

    def _feed(self, commit: Commit) -> None:
        """The commit's feed row, and its entity's last writer now this transaction."""
        assert commit.after is not None  # every commit writes its entity's row
        ref = commit.ref
        after = entity_row(commit.after)
        before = self.rows[ref][2:] if commit.before is not None else _NO_BEFORE
        self.feed_rows.append((self.origin, commit.timestamp_ms, *after, *before))
        self.rows[ref] = after
        self.before_xacts[commit.txid] = self.xacts.get(ref)
        self.xacts[ref] = self.txids.xact

    async def _insert(self, ref: Ref, idem: Idempotency | None, applied: Applied) -> bool:
        """Write a new entity's rows in a savepoint; False when another transaction inserted
        them meanwhile (it has committed: the insert waited for it), with its rows now locked."""
        conn = self._conn
        await conn.execute(SAVEPOINT)
        inserted = [entity_row(applied.after)] if applied.after is not None else []
        idempotency = [applied.idempotency_row] if applied.idempotency_row is not None else []
        try:
            await _write_rows(conn, INSERT_ROWS, INSERT_WIDTHS, inserted, applied.event_rows, idempotency)
        except asyncpg.exceptions.UniqueViolationError:
            await conn.execute(ROLLBACK_TO_SAVEPOINT)
            row = await conn.fetchrow(LOCK_ENTITY, *ref)
            if row is not None:
                self._locked(row)
            else:
                self.records[ref] = self.xacts[ref] = None
            if idem is not None:
                found = await conn.fetchrow(SELECT_IDEMPOTENCY, ref[0], ref[1], idem.key)
                if found is not None:
                    self.remembered_keys[(ref[0], ref[1], idem.key)] = (bytes(found[0]), bytes(found[1]))
            await self.txids.redraw()  # above any txid of the rows just locked
            return False
        return True

    async def _flush(self) -> None:
        """The staged rows, every table's in one statement."""
        updated = [entity_row(r) for r in self.entities.values()]
        if updated or self.events or self.idempotency_rows or self.feed_rows:
            await _write_rows(
                self._conn,
                FLUSH_ROWS,
                FLUSH_WIDTHS,
                updated,
                self.events,
                self.idempotency_rows,
                self.feed_rows,
            )


async def _write_rows(
    conn: Any, sql: str, widths: Sequence[int], *tables: Sequence[tuple[object, ...]]
) -> None:
    """FLUSH_ROWS or INSERT_ROWS: each table's rows as columns (``unnest``'s arrays)."""
    arrays: list[list[object]] = []
    for rows, width in zip(tables, widths, strict=True):
        arrays.extend([list(column) for column in zip(*rows, strict=True)] if rows else [[]] * width)
    await conn.execute(sql, *arrays)
