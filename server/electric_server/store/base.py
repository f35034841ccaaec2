"""The store contract: durable, per-entity, append-only streams.

What every implementation guarantees (SQLite, embedded, for one server;
PostgreSQL, for one server replica or several on one database):

- Writes to one entity are serialized. A write is a ``decide`` function that
  sees the entity's current record and returns a ``Mutation``; the store runs
  it and applies the result atomically, so a decision is never made on a
  stale state (ARCHITECTURE §2: two racing signals are linearized).
- Each mutation is one logical transaction with its own ``txid``: unique
  server-wide and increasing per entity in commit order (SQLite hands them out
  in commit order, gap-free; PostgreSQL's may have gaps, and two entities'
  commits may finish in either order of their txids). Its events
  get gap-free, strictly increasing offsets in the entity's stream, and the
  entity's current state is written in the same transaction.
- Idempotency keys are checked before anything else and stored with the
  response in the same transaction as the write.
- A closed stream keeps its history; nothing is appended after it.
- After each commit, ``Commit`` records are published to the ``Hub`` for
  live watchers (a doorbell: watchers can always fall back to reading),
  each entity's in commit order, once. PostgreSQL's replicas also publish
  the commits the others made (store/postgres/feed.py), their
  ``result`` being ``REMOTE_COMMIT``.
  Each acknowledged batch is also told to the Hub's batch listeners (the
  metrics): its writes and how long its commit took, once per batch.
- A disk that refuses a write fails it with a ``StorageFault``, and nothing
  of its batch is acknowledged, published or readable: ``DiskFull`` pauses
  writes until space is freed (they resume by themselves; reads go on),
  ``StorageFailed`` (e.g. a failed WAL sync) and ``DamagedStore`` stop them
  for good. ``subscribe_faults`` tells the server when writes stop and resume.
  A database server that cannot be reached fails each write and read with
  ``DatabaseUnavailable`` (retryable); the next call tries again.
- Txids are never handed out twice, even after a crash that lost the WAL.

The store knows nothing about gRPC; event bodies are opaque bytes.
"""

from __future__ import annotations

import abc
import copy
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, Self

from electric_sdk.lifecycle import State

if TYPE_CHECKING:
    from .hub import Hub
    from .sessions import SessionBook

Ref = tuple[str, str]  # (entity type, instance id)

log = logging.getLogger(__name__)


# The records a write creates by the thousand are NamedTuples: as immutable as a frozen
# dataclass, and built several times faster (a frozen dataclass sets each field through
# object.__setattr__; EntityRecord's sixteen fields cost a microsecond per write).


class EntityRecord(NamedTuple):
    type: str
    id: str
    state: State
    grace_ms: int
    idle_timeout_ms: int
    created_at_ms: int
    updated_at_ms: int
    # The offset the next event gets (= the number of events).
    head_offset: int
    closed: bool
    stopping_deadline_ms: int | None
    # The txid of the last mutation of this entity.
    txid: int
    # Runtime bookkeeping (the runtime service's; see runtime_service.proto):
    # the last lease epoch granted or revoked — the fencing token;
    lease_epoch: int = 0
    # the offset from which messages are not yet finished, and how many runs
    # were started for the first of them (its next delivery is attempt + 1);
    message_cursor: int = 0
    cursor_attempt: int = 0
    # the offset of the newest message not cancelled (-1: none), so an idle
    # entity with unfinished messages is known to need a wake without reading
    # its stream;
    last_message_offset: int = -1
    # SIGHUP'd: the next lease goes to a worker with the newest code version.
    reload_pending: bool = False
    # Profile values the spawn left to the entity type's default, fixed at the first lease
    # (runtime/profiles.py); until then ``grace_ms`` and ``idle_timeout_ms`` hold the server's defaults.
    grace_pending: bool = False
    idle_timeout_pending: bool = False
    # Offsets past the cursor of messages cancelled before their run started
    # (never delivered; see message_cursor.py). Usually empty.
    cancelled_messages: tuple[int, ...] = ()
    # The lease's holder: the worker session it was granted to ("" none), live while that session
    # is (store/sessions.py; a write's transaction judges it: WriteContext.live).
    lease_session: str = ""
    # The exec process its lease's runtime runs: started (its receipts said so), no exit yet. A
    # grace expiry waits for the exit while that runtime is live (entity_writes.expire_grace).
    process_running: bool = False
    # The key of the message whose run its lease's runtime started and let the server abort (a
    # Python host's run: RuntimeWrite.server_may_abort), until that run's end is recorded or the
    # lease ends; "" none. With ``cursor_attempt`` > 0 the run is in progress, and a SIGINT aborts
    # it in its own commit; once that moved the cursor on (attempt 0) the run's record, with its
    # partial output, is still to come from the runtime (message_cursor.py).
    run_key: str = ""
    # The code version the run at the cursor started on (its `started` record's), while
    # ``cursor_attempt`` > 0: an attempt delivered again is bound to it (runtime/binding.py).
    run_version: str = ""
    # Since when that run waits for a worker of its version: set when its lease ended with the
    # run in flight, cleared by the next grant. The bound a type allows is counted from it, so
    # the deadline outlives a restart.
    waiting_since_ms: int | None = None
    # The entity it was spawned as a child of, as "type/id" (names hold no "/"); "" a root. Set
    # at the spawn and never changed: the cascade sweep (core/cascade.py) reads it.
    parent: str = ""
    # Its end is recorded in its parent's stream (an `electric.child` record; core/cascade.py),
    # or there was no open stream to record it in.
    parent_told: bool = False
    # Its runs that delegated to children ("~key@offset" of each run's message) and those cut
    # short whose children are due their signal ("key@offset", leading), space-separated; ""
    # none (core/child_interrupts.py).
    interrupted_runs: str = ""
    # Runs of other entities it asked to be woken by the end of ("type/id@key@offset" of each
    # message it sent them with ``wake``), space-separated; "" none (core/child_wakes.py).
    awaited_runs: str = ""
    # What a message does while a run is in progress (electric_sdk/busy.py), as the type of the
    # lease's worker announced it at the last grant ("" none yet: enqueue), and the policies its
    # messages may also choose (comma-joined): the message's own write judges it, on any replica.
    on_busy: str = ""
    on_busy_choices: str = ""
    # Its last run asked for input (``ctx.ask``; a RUN_STATUS_INPUT_REQUIRED end) and no reply came
    # yet: that run's message key ("" none) and offset, its question, and the ask's step index
    # (where the reply's run resumes). The next message sent is the reply (entity_writes.reply).
    awaiting_run: str = ""
    awaiting_offset: int = 0
    awaiting_question: str = ""
    awaiting_step: int = 0
    # A message sent ahead of the queue (an ``interrupt`` or ``rollback`` that aborted the run in
    # progress, or the reply to ``ctx.ask``) whose run has not started (-1 none); and, while its
    # run is at the cursor, where the queue it passed resumes (-1 none). message_cursor.py.
    ahead_offset: int = -1
    resume_offset: int = -1
    # The newest message waiting before that one (-1 none): the newest again once it is done.
    resume_last: int = -1

    @property
    def ref(self) -> Ref:
        return (self.type, self.id)

    @property
    def children_due(self) -> bool:
        """Whether a run of it cut short still owes its children their signal, and its stream
        the ``told`` record (core/child_interrupts.py): an ended entity's stream stays open till then."""
        return self.interrupted_runs[:1] not in ("", "~")

    @property
    def message_waiting(self) -> bool:
        """Whether a message waits to be run (an idle entity wakes for it)."""
        return self.last_message_offset >= self.message_cursor

    def replace(self, **changes: Any) -> EntityRecord:
        return self._replace(**changes)


class CascadeFind(NamedTuple):
    """A child its parent's end has not reached yet (``Store.cascades_due``; core/cascade.py)."""

    child: Ref
    parent: Ref
    parent_state: State
    # The parent's grace deadline while it is `stopping` (None otherwise).
    parent_deadline_ms: int | None


class SweepFinds(NamedTuple):
    """What a lease sweep found to do (``Store.sweep_finds``)."""

    lost: list[tuple[Ref, int]]  # leases whose holder is no longer live, with their epochs
    settled: list[Ref]  # ended entities' streams to close
    unleased: list[EntityRecord]  # entities to offer to a worker


class TypeProfile(NamedTuple):
    """The profile defaults one code version of an entity type announced (None: not announced)."""

    type: str
    code_version: str
    # The order code versions were first announced in: the newest has the highest.
    seq: int
    grace_ms: int | None
    idle_timeout_ms: int | None
    # What its runs do when they must be delivered again and no worker of the version is
    # connected: "" the server's default, "pinned" or "auto_upgrade" (runtime/binding.py);
    # pinned runs wait ``upgrade_after_ms`` (None: for good).
    versioning: str = ""
    upgrade_after_ms: int | None = None
    # "detach": the type's entities' SIGTERM and SIGKILL do not reach their children; "" they
    # do (core/cascade.py). The newest version's announcement holds.
    children: str = ""


class VersionChoice(NamedTuple):
    """An operator's choice of the code version new wakes of a type get (runtime/versions.py)."""

    type: str
    # "" the newest announced.
    selected: str
    # A ramp: ``ramp_percent`` of the type's entities (sticky per entity) get ``ramp_version``.
    ramp_version: str = ""
    ramp_percent: int = 0


class NewEvent(NamedTuple):
    kind: str  # the event's `type`: signal, state, message, run, or custom
    key: str
    operation: int  # electric.v1.Operation value
    body: bytes  # the serialized value; opaque to the store


class StoredEvent(NamedTuple):
    offset: int
    kind: str
    key: str
    operation: int
    timestamp_ms: int
    txid: int
    body: bytes


class WriteContext(NamedTuple):
    """What a decide function may use: the transaction's identity and clock (the database's,
    on PostgreSQL), and the worker sessions live as it runs (``sessions.holds_lease``)."""

    txid: int
    now_ms: int
    live: Collection[str] = frozenset()


@dataclass(slots=True)
class Mutation:
    """What a decide function returns: events to append and the new record.

    The store fills in ``head_offset``, ``updated_at_ms`` and ``txid`` of
    ``entity``. An empty mutation (no events, ``entity`` None) writes nothing,
    except that an idempotent write with an encoder still remembers its
    response (a retried no-op returns the same answer).
    """

    events: list[NewEvent] = field(default_factory=list)
    entity: EntityRecord | None = None
    # Anything the caller wants back (e.g. the lifecycle decision).
    result: Any = None


class _Remote:
    def __repr__(self) -> str:
        return "REMOTE_COMMIT"


# A ``Commit.result`` that says another replica made the commit: what its writer meant by it
# (e.g. the runtime's marks of its own writes) stayed in that replica.
REMOTE_COMMIT: Any = _Remote()


class Commit(NamedTuple):
    """One applied mutation, as published to watchers and returned to callers."""

    ref: Ref
    txid: int
    timestamp_ms: int
    events: tuple[StoredEvent, ...]
    before: EntityRecord | None
    after: EntityRecord | None
    result: Any


@dataclass(frozen=True, slots=True)
class Idempotency:
    key: str
    request_hash: bytes


class WriteOutcome(NamedTuple):
    commit: Commit | None  # None when an idempotent retry replayed the response
    response: bytes | None  # the encoded response (stored for idempotent retries)
    replayed: bool


Decide = Callable[[EntityRecord | None, WriteContext], Mutation]
Encode = Callable[[Commit], bytes]


class Write(NamedTuple):
    """One logical write: ``decide`` for ``ref``, optionally idempotent."""

    ref: Ref
    decide: Decide
    idempotency: Idempotency | None = None
    encode: Encode | None = None


class StoreError(Exception):
    """Raised by decide functions to refuse a write; nothing is written."""


class IdempotencyKeyReused(StoreError):
    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"idempotency key {key!r} was already used with a different request")


class StorageFault(Exception):
    """The storage refused a write or a read: nothing of the write was acknowledged,
    published or made readable. Each kind below says what an operator must do."""

    def again(self) -> StorageFault:
        """A fresh copy, to refuse one more write with (an exception raised in many
        tasks would gather all their tracebacks)."""
        return copy.copy(self)


class DiskFull(StorageFault):
    """The disk holding the store is full: writes are refused until space is
    freed, then resume by themselves; reads go on."""


class StorageFailed(StorageFault):
    """The disk failed in a way the store cannot take back (a failed WAL sync, an
    I/O error): it takes no more writes, and the server stops."""


class StoreBusy(StorageFault):
    """Another process holds the database locked, past the busy timeout. No server
    does (the data directory's lock keeps a second one out): a tool must let go."""


class DatabaseUnavailable(StorageFault):
    """The database server (PostgreSQL) cannot be reached, refused the connection, or lost it
    during a write: nothing of the write was acknowledged. Retry: a write cut off during its
    COMMIT may have committed, and its idempotency key tells (a retry replays it)."""


class WritesRefused(DatabaseUnavailable):
    """The database answers but takes no writes (PostgreSQL read-only: ``default_transaction_read_only``,
    which hosted services set on a full disk, or a standby after a failover). Each write fails
    like ``DatabaseUnavailable`` and reads go on; the server's writes are not ready until a write
    commits again (the replica's heartbeat tries one at every poll)."""


class DamagedStore(StorageFault):
    """The store's files are damaged: found before opening them (the server
    refuses to start) or by the database while running."""

    def __init__(self, where: str, problems: Sequence[str], remedy: str) -> None:
        super().__init__(where, tuple(problems), remedy)
        self.where = where
        self.problems = list(problems)
        self.remedy = remedy

    def __str__(self) -> str:
        return "\n".join([f"{self.where} is damaged:", *(f"  - {p}" for p in self.problems), self.remedy])


FaultListener = Callable[[StorageFault | None], None]


class StoreCounter(NamedTuple):
    """A counter of one backend's own (``Store.counters``), read when the metrics are scraped."""

    name: str  # without the ``_total`` suffix Prometheus adds
    help: str
    labels: tuple[str, ...] = ()  # the label names; each sample's values follow them
    samples: tuple[tuple[tuple[str, ...], float], ...] = ()


class Store(abc.ABC):
    """The durable store. See the module docstring for the guarantees."""

    hub: Hub
    # The worker sessions of every server on this store (store/sessions.py).
    sessions: SessionBook

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None:
        """Flush pending writes and release resources."""

    async def __aenter__(self) -> Self:
        """The store as a component of the server (app.py): opened on entering (refusing to
        start with the open's error, having let go of what it opened), closed on leaving."""
        await self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @abc.abstractmethod
    async def write(self, write: Write) -> WriteOutcome:
        """Apply one write; raises what ``decide`` raised, writing nothing."""

    @abc.abstractmethod
    async def write_many(self, writes: Sequence[Write]) -> list[WriteOutcome | BaseException]:
        """Apply independent writes, each its own transaction, in one batch."""

    @abc.abstractmethod
    async def get_entity(self, ref: Ref) -> EntityRecord | None: ...

    @abc.abstractmethod
    async def list_entities(
        self, type: str | None, states: Sequence[State], after: Ref | None, limit: int, parent: str = ""
    ) -> list[EntityRecord]:
        """Entities ordered by (type, id), strictly after ``after``; ``parent`` set ("type/id"):
        only its children."""

    @abc.abstractmethod
    async def read_events(self, ref: Ref, from_offset: int, limit: int) -> list[StoredEvent]: ...

    @abc.abstractmethod
    async def idempotent_response(self, ref: Ref, key: str) -> tuple[bytes, bytes] | None:
        """(request hash, response) stored for an idempotency key, if any."""

    @abc.abstractmethod
    async def stopping_deadlines(self) -> list[tuple[Ref, int]]:
        """Every `stopping` entity and its grace deadline (for the reaper)."""

    # -- what the deadline sweeps find due (any replica may; each write re-checks inside) ---------

    @abc.abstractmethod
    async def due_deadlines(self, limit: int) -> list[tuple[Ref, int]]:
        """`stopping` entities whose grace deadline has passed by the store's clock, and their
        deadlines; rows another transaction is writing now are skipped (SKIP LOCKED)."""

    @abc.abstractmethod
    async def cascades_due(self, limit: int) -> list[CascadeFind]:
        """Open children whose parent is shutting down or has ended and that its signal has not
        reached yet: not ended, and (unless the parent was killed) not `stopping` already."""

    @abc.abstractmethod
    async def children_ended(self, limit: int) -> list[EntityRecord]:
        """Ended children whose end is not recorded in their parent's stream yet."""

    @abc.abstractmethod
    async def awaiting(self, limit: int) -> list[EntityRecord]:
        """Entities waiting to be woken by another's run's end (``awaited_runs``)."""

    @abc.abstractmethod
    async def interrupts_due(self, limit: int) -> list[EntityRecord]:
        """Entities with runs whose children are due their signal (``interrupted_runs``)."""

    @abc.abstractmethod
    async def lost_leases(self, limit: int) -> list[tuple[Ref, int]]:
        """Entities whose lease holder is no longer live, and their lease epochs."""

    @abc.abstractmethod
    async def settled_streams(self, settle_ms: int, limit: int) -> list[Ref]:
        """Ended entities whose stream is open though no live runtime holds it, or whose last
        write is ``settle_ms`` old: the stream closes now."""

    @abc.abstractmethod
    async def unleased(self, types: Sequence[str], states: Sequence[State], limit: int) -> list[EntityRecord]:
        """Open entities of ``types`` in ``states`` that want a runtime and have no holder (for
        offers; a holder that is gone has its lease ended first, ``lost_leases``)."""

    async def sweep_finds(
        self, settle_ms: int, types: Sequence[str], states: Sequence[State], limit: int
    ) -> SweepFinds:
        """What one lease sweep acts on: ``lost_leases``, ``settled_streams`` and ``unleased``
        (none without ``types``), at most ``limit`` of each. A store may read them at once."""
        return SweepFinds(
            await self.lost_leases(limit),
            await self.settled_streams(settle_ms, limit),
            await self.unleased(types, states, limit) if types else [],
        )

    @abc.abstractmethod
    async def type_profiles(self) -> list[TypeProfile]:
        """Every type profile announced, each code version's latest announcement."""

    @abc.abstractmethod
    async def store_type_profile(self, profile: TypeProfile) -> None:
        """Keep a code version's announcement (replacing its earlier one, keeping its ``seq``)."""

    @abc.abstractmethod
    async def version_choices(self) -> list[VersionChoice]:
        """Every entity type's version choice an operator made (``electric versions``)."""

    @abc.abstractmethod
    async def store_version_choice(self, choice: VersionChoice) -> None:
        """Keep a type's version choice, replacing its earlier one."""

    @abc.abstractmethod
    async def bound_runs(self, type_: str) -> list[tuple[str, int, int]]:
        """Per code version, the runs in flight of ``type_``'s open entities bound to it, and
        how many of them no lease holds: (version, in flight, unleased)."""

    @abc.abstractmethod
    async def head_txid(self) -> int:
        """The txid of the last committed mutation."""

    @abc.abstractmethod
    async def purge_idempotency(self, retention_ms: int, prefix: str = "") -> int:
        """Forget idempotency keys stored more than ``retention_ms`` ago by the store's clock
        (the server's on SQLite, the database's on PostgreSQL), those starting with ``prefix``
        (which holds no LIKE wildcard); returns how many."""

    def counters(self) -> Sequence[StoreCounter]:
        """Counters only this backend keeps (its fast paths'), for the server's metrics; none here."""
        return ()

    async def damage(self) -> list[str]:
        """What is damaged in the store's storage, found read-only (for `electric verify`,
        which may run beside a live server); [] when nothing is."""
        return []

    @abc.abstractmethod
    def subscribe_faults(self, callback: FaultListener) -> Callable[[], None]:
        """Call ``callback`` on the loop when writes stop (with the fault that stopped
        them) and when they resume (with None); returns the unsubscribe."""
