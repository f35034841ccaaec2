"""The commit feed between replicas on one PostgreSQL database: how one replica's commits reach the others.

Every commit a replica makes writes a row to ``commit_feed`` in its own
transaction (postgres/transaction.py): the entity's record after it and before
it, its time, the replica's ``origin``, and the transaction's id (``xact``).
Its events are read from ``events``, where the same transaction put them, in
the same statement.

**Reading** (``FeedReader``): one connection of its own, outside the pool,
reads what the last snapshot did not cover and this one does (``READ_FEED``):
rows of transactions from the last snapshot's xmax on, or in progress then.
So a transaction that drew txid 10 and commits after one that drew 11 is
read when it commits, never skipped: positions are snapshots, not txids. A
transaction held open anywhere on the server costs nothing but its own
entry in the snapshot (no range of rows is read again). The commits read
go to the replica's ``FeedOrder``, which publishes them to its ``Hub`` in
each entity's commit order (``feed_order``). A lost connection is opened
again and the reader reads from its last snapshot: nothing is missed.

**The doorbell**: after a batch's COMMIT (never inside the transaction:
a ``pg_notify`` there serializes every commit on the server's notify queue)
the writer rings ``Doorbell``, which sends a NOTIFY at once when none is in
flight, so a lone commit waits for no window; rings while one is in flight
merge into the next. It has a connection of its own, like the reader. Its
payload is one position, the ringing transaction's id (a few digits, far
under PostgreSQL's 8,000 bytes): a reader that has read past it ignores it.
The reader also reads every ``poll_s`` (0.5 s by default), so a lost NOTIFY
only delays.

**A replica alone rings no doorbell.** A NOTIFY that no other replica hears
still costs a round trip on the doorbell's connection, a turn of
PostgreSQL's notify queue and a wake-up of this replica's own listening
backend and reader, on the cores the commit's answer needs: a signal's
answer took 0.08-0.1 ms longer of 1.6-1.7 ms on two cores
(``bench/bench_dbos.py`` is one replica). So the reader counts the other
readers listening on the database (``FEED_PEERS``: connections named
``READER_NAME``, of any electric version) when it opens and then every
``poll_s``, and the doorbell rings unless that count is known to be 0. A
reader that connects (a replica starting, or one whose connection came back)
announces itself with a NOTIFY of position 0 (``JOINED``: below every
transaction's, so a reader that does not know it ignores it), on which the
others ring again at once. A commit made in the instant between a new
reader's LISTEN and the arrival of its announcement reaches that reader at
its next poll.

**Cost per write**: one more row (about 40 small columns) in the batch's
transaction, in the statement that writes its events (no round trip of its
own), and 8 bytes on the entity row; a NOTIFY per batch at most, off the
commit's path (``bench/bench_feed_cost.py``, ``bench/bench_replica_signal.py``).
Feed rows older than ``RETENTION_S`` are deleted by every replica's reader,
whether or not it read anything (a server alone on its database never reads a
commit: it makes them all). ``electric verify`` opens its store with the feed off
(``feed=False``): it writes no feed rows and reads none.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import asyncpg

from ...lifetime import TaskGroup
from ..base import REMOTE_COMMIT, Commit
from ..feed_order import FeedOrder, Snapshot
from ..rows import ENTITY_COLUMNS, entity_from_row, event_from_row
from .faults import LOST, lost_reason
from .statements import (
    CURRENT_SNAPSHOT,
    FEED_CHANNEL,
    FEED_PEERS,
    NOTIFY_FEED,
    PRUNE_FEED,
    READ_FEED,
    READER_SETTINGS,
    SESSION_SETTINGS,
)

__all__ = [
    "DEFAULT_POLL_S",
    "JOINED",
    "READER_NAME",
    "RETENTION_S",
    "Doorbell",
    "FeedReader",
    "connect_session",
    "payload",
]

log = logging.getLogger(__name__)

# How often the reader reads without a NOTIFY (the fallback when one is lost).
DEFAULT_POLL_S = 0.5
# How long feed rows are kept: far longer than a reader is ever behind (it reads every poll).
RETENTION_S = 600.0
# A lost reader connection is opened again after this, doubling up to the poll interval.
_RECONNECT_S = 0.05
# Every replica's reader connection's name, by which the readers count each other (FEED_PEERS).
READER_NAME = "electric (feed)"
# A reader's announcement that it listens: a position below every transaction's.
JOINED = "0"
# Bounds the reader's statements (its prune deletes minutes of rows), over the store's own.
_STATEMENT_TIMEOUT_S = 10.0

# READ_FEED's columns: the snapshot, the commit's time, the record after, the fields before, the
# events.
_AFTER = slice(2, 2 + len(ENTITY_COLUMNS))
_BEFORE = slice(2 + len(ENTITY_COLUMNS), -1)
_EVENTS = -1


def payload(xact: int) -> str:
    """A NOTIFY's payload: one feed position (a transaction's id), never a list."""
    return str(xact)


class Doorbell:
    """NOTIFY after commits, at most one in flight; rings meanwhile merge into the next (see above).

    On a connection of its own, outside the pool (a NOTIFY never waits for a
    connection a write needs), with ``synchronous_commit`` off: a NOTIFY's
    transaction would otherwise wait for its own WAL flush, one more disk sync
    per ring, for a signal that polling stands behind anyway.
    """

    def __init__(
        self, url: str, timeout_s: float, enabled: bool = True, heard: Callable[[], bool] = lambda: True
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.enabled = enabled  # tests turn it off to show polling delivers all the same
        self.heard = heard  # whether another replica may hear a ring (FeedReader.heard)
        self._conn: Any = None
        self._next: int | None = None
        self._task: asyncio.Task[None] | None = None  # the NOTIFY in flight, in its group:
        self._tasks = TaskGroup("the doorbell")
        self.sent = 0  # NOTIFYs sent, for tests and benchmarks

    async def open(self) -> None:
        self._conn = await connect_session(
            self.url,
            "electric (doorbell)",
            {**SESSION_SETTINGS, "synchronous_commit": "off"},
            self.timeout_s,
            self.timeout_s,
        )

    def ring(self, xact: int) -> None:
        if not self.enabled or not self.heard():
            return
        if self._task is not None:
            self._next = xact if self._next is None else max(self._next, xact)
            return
        if not self._tasks.closed:
            self._task = self._tasks.start_soon(self._send(xact), name="electric-doorbell")

    async def _send(self, xact: int) -> None:
        try:
            while True:
                try:
                    if self._conn is None:
                        await self.open()
                    await self._conn.execute(NOTIFY_FEED, payload(xact))
                    self.sent += 1
                except (*LOST, asyncpg.PostgresError) as exc:
                    log.debug(
                        "a NOTIFY failed (%s): the other replicas' polling reads the commit",
                        lost_reason(exc, self.timeout_s),
                    )
                    conn, self._conn = self._conn, None
                    if conn is not None:
                        conn.terminate()
                if self._next is None:
                    return
                xact, self._next = self._next, None
        finally:
            self._task = None

    async def close(self) -> None:
        self.enabled = False  # a ring after this opens no connection again
        await self._tasks.aclose()
        await _close(self._conn)
        self._conn = None


async def connect_session(
    url: str, name: str, settings: dict[str, str], timeout_s: float, statement_timeout_s: float
) -> Any:
    """One connection with the given session settings, named ``name`` in ``pg_stat_activity``."""
    return await asyncpg.connect(
        url,
        timeout=timeout_s,
        command_timeout=statement_timeout_s,
        server_settings={**settings, "application_name": name},
    )


async def _close(conn: Any) -> None:
    if conn is not None:
        with contextlib.suppress(*LOST, asyncpg.PostgresError):
            await conn.close(timeout=1)
        conn.terminate()


class FeedReader:
    """Reads the other replicas' commits into a ``FeedOrder`` (see the module docstring)."""

    def __init__(
        self,
        url: str,
        order: FeedOrder,
        origin: int,
        poll_s: float = DEFAULT_POLL_S,
        timeout_s: float = _STATEMENT_TIMEOUT_S,
    ) -> None:
        if poll_s <= 0:
            raise ValueError(f"the feed's poll interval must be positive, not {poll_s}")
        self.url = url
        self.order = order
        self.origin = origin
        self.poll_s = poll_s
        self.timeout_s = timeout_s  # connecting
        self.statement_timeout_s = max(timeout_s, _STATEMENT_TIMEOUT_S)
        self._conn: Any = None
        self._wake = asyncio.Event()
        self._tasks = TaskGroup("the commit feed's reader")  # its one loop, _run
        # Feed rows are kept this long; the snapshots' xmins taken every tenth of it say which.
        self.retention_s = RETENTION_S
        self._marks: collections.deque[tuple[float, int]] = collections.deque()
        # The other readers listening on the database (None: not known), and when last counted.
        self.peers: int | None = None
        self._counted = -math.inf
        self._joins = 0  # announcements heard: one heard while a count is out outdates it
        # For tests and benchmarks: reads done, commits delivered, connections opened again.
        self.reads = 0
        self.delivered = 0
        self.reconnects = 0

    @property
    def backend_pid(self) -> int | None:
        """The reader's PostgreSQL backend (tests end it with pg_terminate_backend)."""
        conn = self._conn
        return None if conn is None or conn.is_closed() else int(conn.get_server_pid())

    def heard(self) -> bool:
        """Whether a NOTIFY may reach another replica: not while none is known to listen."""
        return self.peers != 0

    async def open(self) -> None:
        """Connect, listen, and start from now: what is committed already is the store's to read."""
        await self._connect()
        await self._count_peers(self._conn)
        self.order.snapshot = Snapshot.parse(await self._conn.fetchval(CURRENT_SNAPSHOT))
        self._tasks.start_soon(self._run(), name="electric-feed-reader")

    async def close(self) -> None:
        await self._tasks.aclose()
        conn, self._conn = self._conn, None
        await _close(conn)

    def read_soon(self) -> None:
        self._wake.set()

    async def _connect(self) -> None:
        conn = await connect_session(
            self.url, READER_NAME, READER_SETTINGS, self.timeout_s, self.statement_timeout_s
        )
        try:
            await conn.add_listener(FEED_CHANNEL, self._on_notify)
            # A lost connection is seen at once, not at the next poll: read (and reconnect) now.
            conn.add_termination_listener(lambda _conn: self.read_soon())
            # Listening now: replicas whose doorbells are quiet, none having listened, ring again.
            await conn.execute(NOTIFY_FEED, JOINED)
            self._counted = -math.inf  # and the others are counted again at the first read
        except BaseException:
            conn.terminate()
            raise
        self._conn = conn

    def _on_notify(self, conn: Any, pid: int, _channel: str, position: str) -> None:
        if position == JOINED:
            if pid != conn.get_server_pid():
                self._joins += 1
                if self.peers == 0:
                    self.peers = 1  # at least: counted again at the next poll
                    log.debug("another replica listens on the commit feed: the doorbell rings")
            return
        try:
            xact = int(position)
        except ValueError:
            log.warning(
                "a NOTIFY on %s carried %r, not a feed position: read all the same", FEED_CHANNEL, position
            )
            self.read_soon()
            return
        if not self.order.snapshot.covers(xact) and not self.order.is_own(xact):
            self.read_soon()

    async def _run(self) -> None:
        pause = _RECONNECT_S
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancel that
            # arrives as the wake is set, and close() then waits for this task for ever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s):
                    await self._wake.wait()
            self._wake.clear()
            try:
                if self._conn is None:
                    await self._connect()
                    self.reconnects += 1
                await self._read(self._conn)
                self._prune_marks()
                pause = _RECONNECT_S
            except (*LOST, asyncpg.PostgresError) as exc:
                log.warning(
                    "the commit feed's connection failed (%s): reading again from the last position",
                    lost_reason(exc, self.statement_timeout_s),
                )
                conn, self._conn = self._conn, None
                if conn is not None:
                    conn.terminate()
            except Exception:
                # A row this code cannot read: the reader must not stop for it (the replica would
                # hear of no other commit again), so it is logged and the read tried again.
                log.exception("reading the commit feed failed: trying again from the last position")
            else:
                continue
            await asyncio.sleep(pause)
            pause = min(pause * 2, self.poll_s)
            self._wake.set()

    async def _read(self, conn: Any) -> None:
        order = self.order
        rows = await conn.fetch(READ_FEED, order.snapshot.text(), self.origin, list(order.unknown))
        snapshot = Snapshot.parse(rows[0][0])
        commits = [self._commit(row) for row in rows if row[1] is not None]
        order.read(snapshot, commits)
        self.reads += 1
        self.delivered += len(commits)
        # Whether or not the read brought anything: a replica alone on its database never reads
        # a commit (they are all its own), and its feed rows must go all the same.
        await self._prune(conn)
        if time.monotonic() - self._counted >= self.poll_s:
            await self._count_peers(conn)

    async def _count_peers(self, conn: Any) -> None:
        joins = self._joins
        peers: int | None
        try:
            peers = int(await conn.fetchval(FEED_PEERS, READER_NAME))
        except asyncpg.PostgresError as exc:  # e.g. a view this role may not read: ring all the same
            log.debug("counting the commit feed's readers failed (%s): the doorbell rings", exc)
            peers = None
        if peers == 0 and self._joins != joins:
            peers = 1  # one announced itself after the count looked: the count missed it
        if (peers == 0) != (self.peers == 0):
            quiet = "none: the doorbell is quiet"
            log.debug("other replicas listening on the commit feed: %s", quiet if peers == 0 else peers)
        self.peers, self._counted = peers, time.monotonic()

    @staticmethod
    def _commit(row: Any) -> Commit:
        after = entity_from_row(row[_AFTER])
        fields = row[_BEFORE]
        before = None if fields[0] is None else entity_from_row((after.type, after.id, *fields))
        events = tuple(event_from_row(event) for event in row[_EVENTS])
        return Commit(after.ref, after.txid, row[1], events, before, after, REMOTE_COMMIT)

    def _prune_marks(self) -> None:
        now = time.monotonic()
        if not self._marks or now - self._marks[-1][0] >= self.retention_s / 10:
            self._marks.append((now, self.order.snapshot.xmin))

    async def _prune(self, conn: Any) -> None:
        """Delete feed rows of transactions that ended more than ``retention_s`` ago."""
        marks = self._marks
        if marks and time.monotonic() - marks[0][0] > self.retention_s:
            _, xmin = marks.popleft()
            await conn.execute(PRUNE_FEED, str(xmin))
