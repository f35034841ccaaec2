"""What a backend gives the group committer (store/committer.py): a new backend starts here.

The committer owns every rule of a write that is not about one database:
the queue, the batches, deciding each write (an idempotent replay, or
``outcome.apply_write``), publishing in commit order, and what a fault does
to writes (store/faults.py). A backend supplies:

- ``Backend``: where a batch runs (``session``: the connection, held for the
  batch's attempts), what holds an entity's later writes back until a batch
  has published (``hold``), what makes a commit durable, housekeeping between
  batches, the probe of a full disk, and which errors a batch may simply run
  again after (a deadlock);
- ``Transaction``: one batch's transaction, begun with its entities current
  (read, or locked) and their stored idempotency keys readable. The committer
  asks it for each write's context, record and stored key, hands it each
  write's rows to stage, then commits it (or rolls it back) and has it publish;
- its fault predicates (``faults.Classify``), and its fast paths
  (store/fastpath.py), each one object that answers ``ready()``.

SQLite's is store/sqlite/, PostgreSQL's store/postgres/.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from .base import Commit, EntityRecord, Ref, Write, WriteContext, WriteOutcome
from .outcome import Applied

__all__ = ["Backend", "LoneWrite", "Session", "Transaction"]


class Transaction(Protocol):
    """One batch's transaction (see the module docstring). Its reads answer what the batch has
    staged so far: a write sees the writes before it in the batch."""

    def context(self) -> WriteContext:
        """The next write's: the txid it takes if it commits, the clock, the live lease holders."""
        ...

    def remembered(self, ref: Ref, key: str) -> tuple[bytes, bytes] | None:
        """The stored answer to idempotency ``key`` on ``ref``: (request hash, response). May
        raise: the write then fails with it, the others go on."""
        ...

    def current(self, ref: Ref) -> EntityRecord | None:
        """The entity as the batch sees it. May raise, as ``remembered``."""
        ...

    def stage(self, write: Write, applied: Applied) -> bool:
        """Take ``applied`` (``write``'s) into the batch: its rows are written by ``commit``, and the next writes
        see them. False when this backend must insert them now instead (``insert``): nothing was
        taken."""
        ...

    async def insert(self, write: Write, applied: Applied) -> bool:
        """Write the rows of ``applied`` (a new entity's) at once and take it into the batch;
        False when another transaction inserted them first: nothing was written, their rows are
        current now, and the write is decided again on them."""
        ...

    async def commit(self) -> None:
        """Write what is staged and commit; a failure ends the transaction too (rolled back, or
        its outcome unknown) and is raised."""
        ...

    async def roll_back(self) -> None: ...

    def publish(self, commits: Sequence[Commit], writes: int, started: float) -> None:
        """The committed batch's commits, to the hub in commit order (and its batch listeners:
        ``writes`` writes, its commit begun at ``started``, ``perf_counter``)."""
        ...


class Session(Protocol):
    """A batch's place to run (a connection): its transactions, one per attempt."""

    async def begin(self, writes: Sequence[Write]) -> Transaction: ...


class LoneWrite(Protocol):
    """A fast path that commits a write alone without a batch's transaction (store/fastpath.py)."""

    def ready(self) -> bool: ...

    async def write(self, write: Write, started: float) -> WriteOutcome | BaseException | None:
        """The write's outcome, published; None when it raced another (nothing was written): the
        batch path decides it again."""
        ...


class Backend(Protocol):
    # What the durability step is, for the log when it fails (``durable``).
    durable_step: str
    # Whether batches must take their entities' turn (``hold``): False where one writer runs
    # every batch in order (and a lone write's path is spared the context manager).
    holds: bool

    def hold(self, writes: Sequence[Write]) -> AbstractAsyncContextManager[object]:
        """The writes' entities' turn in this process, from before their batch decides to after it
        has published (so the hub sees each entity's commits in order)."""
        ...

    def session(self) -> AbstractAsyncContextManager[Session]: ...

    async def durable(self, writes: int, lone: bool) -> None:
        """After a commit of ``writes`` writes, before anyone is told: make it durable (SQLite's WAL
        sync). ``lone``: one write, after a batch of one (light load). A failure stops writes for
        good (store/faults.py)."""
        ...

    async def maintain(self) -> None:
        """Housekeeping between batches (a checkpoint when due); a failure fails no write."""
        ...

    async def probe_room(self) -> None:
        """After a full disk: succeed once what the next batches need fits (store/faults.py)."""
        ...

    def retryable(self, exc: BaseException) -> str | None:
        """What ``exc`` is, if the batch may simply run again after it (a deadlock), else None."""
        ...
