"""The PostgreSQL store's writer: where its batches run (the group committer's backend,
store/transaction.py).

Up to the pool's size of batches run at once, each on a pooled connection
(postgres/connections.py), in its entities' turn in this process
(``RefLocks``), each attempt one ``PostgresTransaction`` (postgres/transaction.py).
A deadlock or a serialization failure runs the batch again (``retryable``);
a commit is durable when PostgreSQL acknowledges it (``synchronous_commit=on``),
so there is nothing more to make it so, and nothing to maintain between
batches.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from ..base import Write
from . import faults
from .connections import Connections
from .faults import LOST
from .publisher import Publisher
from .transaction import PostgresTransaction, RefLocks

__all__ = ["PostgresWriter"]


class _Session:
    """A batch's connection: its transactions, one per attempt."""

    __slots__ = ("_conn", "_writer")

    def __init__(self, writer: PostgresWriter, conn: Any) -> None:
        self._writer = writer
        self._conn = conn

    async def begin(self, writes: Sequence[Write]) -> PostgresTransaction:
        writer = self._writer
        transaction = self._conn.transaction()
        await transaction.start()
        tx = PostgresTransaction(
            self._conn,
            transaction,
            writer.origin if writer.publisher.order is not None else None,
            writer.publisher,
            writer.publisher.took_writes,
        )
        try:
            await tx.lock(writes)
        except BaseException:
            with contextlib.suppress(*LOST):  # a lost connection has rolled back by itself
                await transaction.rollback()
            raise
        return tx


class PostgresWriter:
    """See the module docstring."""

    durable_step = "a commit"  # (never fails: PostgreSQL's COMMIT is the durability)
    holds = True

    __slots__ = ("_connections", "_ref_locks", "origin", "publisher")

    def __init__(self, connections: Connections, publisher: Publisher) -> None:
        self._connections = connections
        self.publisher = publisher
        self.origin = 0  # this replica's in the feed's rows (set with the feed)
        self._ref_locks = RefLocks()

    def hold(self, writes: Sequence[Write]) -> AbstractAsyncContextManager[None]:
        return self._ref_locks.hold(writes)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[_Session]:
        async with self._connections.connection("a write") as conn:
            yield _Session(self, conn)

    async def durable(self, writes: int, lone: bool) -> None:
        pass

    async def maintain(self) -> None:
        pass

    async def probe_room(self) -> None:
        pass  # never paused: a full database refuses each write (DatabaseUnavailable)

    def retryable(self, exc: BaseException) -> str | None:
        return faults.retryable(exc)
