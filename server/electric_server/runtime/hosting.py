"""The runtime: this replica's workers' sessions, the leases they hold, and what they are sent.

See proto/electric/v1/runtime_service.proto for the contract. A lease is its
entity row's epoch and holder (a worker session, store/sessions.py), granted
by compare-and-set and judged live inside each write's transaction, so
several replicas on one database never grant one entity twice and a zombie
worker's write is refused. This process keeps what it needs to serve its own
sessions (``Runtime.leases``); the sweep (lease_sweep.py) renews them and
fires what any replica may find due. Message delivery reads the stream from
the entity's message cursor; signals are forwarded from commits as they land.
The workers' requests are requests.py's; the stream a session runs on, connect.py's.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AsyncExitStack
from typing import Any, TypeVar

from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.entities import entity_to_pb
from electric_sdk._wire.events import event_to_pb
from electric_sdk.lifecycle import HOSTED_STATES, STATE_RULES, needs_runtime

from ..clock import SYSTEM_CLOCK, Clock, wake_on_advance
from ..core import message_cursor
from ..core.auth import ANONYMOUS, Principal
from ..lifetime import Component, TaskGroup
from ..settings import POLL, SETTLE, UPGRADE_AFTER
from ..store.base import Commit, EntityRecord, Ref, StorageFault, Store, StoredEvent, VersionChoice, Write
from ..store.sessions import SessionRow
from .announcements import busy_policy, versioning
from .lease_sweep import LeaseSweep
from .local_leases import Lease, WorkerSession, owe
from .profiles import TypeProfiles
from .requests import WorkerRequests
from .versions import Versions
from .writes import RUNTIME_WRITE, Refused, end_lease, grant, settle_ignored

log = logging.getLogger(__name__)
T = TypeVar("T")

_PAGE = 500
PENDING_LOOKBACK = 1000  # events searched for still-pending signals when a lease is granted


class Runtime(Component):
    """The sessions of this replica's workers and the leases they hold."""

    def __init__(
        self,
        store: Store,
        lease_ttl_ms: int,
        heartbeat_interval_ms: int,
        settle_ms: int = SETTLE.value,
        poll_ms: int = POLL.value,
        clock: Clock = SYSTEM_CLOCK,
        upgrade_after_ms: int = UPGRADE_AFTER.value,
        replica: str = "",
    ) -> None:
        self.store = store
        self.clock = clock  # heartbeats' times (clock.py)
        self._unadvance: Callable[[], None] = lambda: None
        self.replica = replica or uuid.uuid4().hex[:12]  # this process, in the session book (and its logs)
        self.lease_ttl_ms = lease_ttl_ms
        self.lease_ttl_s = lease_ttl_ms / 1000
        self.settle_ms = settle_ms
        self.settle_s = settle_ms / 1000
        self.poll_s = poll_ms / 1000
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.sessions: dict[str, WorkerSession] = {}
        self.leases: dict[Ref, Lease] = {}
        self._offering: set[Ref] = set()
        self._announcements = itertools.count(1)
        self._session_ids = itertools.count(1)
        # Every task of the runtime: a worker's requests, offers, deliveries, settles, the handover.
        # One the store refuses is no crash: the store has said why, and what it left undone the
        # sweep finds (a lease whose end was not written, an entity not offered).
        self._tasks = TaskGroup("the runtime", expected=(StorageFault,))
        self._handover: asyncio.Task[None] | None = None
        self.sweep = LeaseSweep(self)
        self._parts = AsyncExitStack()  # the sweep, once started
        self._stopping = False
        self._unsubscribe: Callable[[], None] = lambda: None
        self.type_profiles = TypeProfiles(store)
        self.versions = Versions(store, self.type_profiles, upgrade_after_ms)
        self.requests = WorkerRequests(self)

    # -- lifecycle of the service -------------------------------------------------------

    async def start(self) -> None:
        self._unsubscribe = self.store.hub.subscribe_all(self._on_commit)
        await self.type_profiles.load()
        await self.versions.refresh()
        # What is due already (e.g. streams whose runtime's lease ended with a restart) goes first:
        # entering the sweep sweeps once, then polls.
        await self._parts.enter_async_context(self.sweep)
        self._unadvance = wake_on_advance(self.clock, self.sweep.wake)  # sessions may have expired

    def drain(self) -> None:
        """End every worker session now (no awaiting: the server is draining).

        On a shared session book (PostgreSQL) the sessions' leases are handed over at once:
        ended as lost, so other replicas grant them to the workers that reconnect there. Alone
        (SQLite) nothing is written: the entities keep their state, and the workers are leased
        anew when this server is back.
        """
        if self._stopping:
            return
        self._stopping = True
        self._unsubscribe()
        held = [lease for session in self.sessions.values() for lease in session.leases.values()]
        for session in list(self.sessions.values()):
            session.closed = True
            session.outbox.put_nowait(None)
        self._tasks.cancel()
        self.sweep.stop()
        if self.store.sessions.shared:
            self._handover = self._tasks.start_soon(self._hand_over(held), name="electric-lease-handover")

    async def _hand_over(self, held: list[Lease]) -> None:
        # As for a lost runtime: an ended entity's pending signals are settled with its stream's close.
        writes = [
            Write(lease.ref, end_lease(lease.ref, lease.epoch, "runtime_lost", None, dict(lease.pending)))
            for lease in held
        ]
        if writes:
            try:
                await self.store.write_many(writes)
            except StorageFault as exc:  # they expire with the sessions: other replicas take them then
                log.warning("the leases of a draining server were not handed over: %s", exc)
        await self._end_replica()

    async def _end_replica(self) -> None:
        try:
            await self.store.sessions.end_replica(self.replica)
        except Exception as exc:  # e.g. the database is gone; its rows expire by themselves
            log.warning("the end of this server's sessions was not recorded: %s", exc)

    async def stop(self) -> None:
        self._unadvance()
        self.drain()
        await self._parts.aclose()  # the sweep ends between two polls
        if self._handover is not None:
            await self._handover
            self._handover = None
        else:
            await self._end_replica()
        await self._tasks.aclose()

    def spawn(self, step: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T]:
        """Run ``step`` as a task of the runtime: cancelled by a drain, awaited by ``stop``."""
        return self._tasks.start_soon(step, name)

    # -- sessions ---------------------------------------------------------------------------

    async def _announce_types(self, hosted: Sequence[rt.HostedType], code_version: str) -> None:
        # The types' defaults are in effect at once (a lease granted next, to any worker, uses
        # them) and stored before the worker hears back.
        announced = [
            self.type_profiles.announce(
                h.type,
                code_version,
                h.profile if h.HasField("profile") else None,
                *versioning(h, "hello"),
                "detach" if h.detach_children else "",
            )
            for h in hosted
        ]
        await asyncio.gather(*(self.type_profiles.save(profile) for profile in announced))

    async def open(self, hello: rt.Hello, principal: Principal = ANONYMOUS) -> WorkerSession:
        # The session exists only after its types are announced, so a stream cancelled meanwhile
        # leaves none behind.
        await self._announce_types(hello.types, hello.code_version)
        session = WorkerSession(
            id=f"{self.replica}-{next(self._session_ids)}",
            worker_id=hello.worker_id,
            types=frozenset(t.type for t in hello.types),
            code_version=hello.code_version,
            announced=next(self._announcements),
            capacity=hello.capacity,
            last_seen=self.clock.monotonic(),
            principal=principal,
            busy={t.type: busy_policy(t, "hello") for t in hello.types},
        )
        # Its worker's other session, on any replica, ends now: its leases are no longer live.
        row = SessionRow(
            session.id,
            session.worker_id,
            self.replica,
            tuple(sorted(session.types)),
            session.code_version,
            session.capacity,
        )
        ended = await self.store.sessions.open(row, self.lease_ttl_ms)
        mine = self.sessions.get(hello.worker_id)
        if any(mine is None or session_id != mine.id for session_id in ended):
            # Its session on another replica (one killed, or cut off from the worker) held leases
            # that no live runtime holds now: they end before the welcome, not at a sweep's poll.
            # Before this session is registered: a stream cancelled meanwhile leaves none behind
            # (offer_all, below, offers it what they freed).
            await self.sweep.end_lost()
        old = self.sessions.get(hello.worker_id)
        if old is not None:
            self.spawn(self.close(old, "runtime_lost"))
        self.sessions[hello.worker_id] = session
        self.spawn(self.offer_all(session))
        return session

    async def announce(self, session: WorkerSession, announce: rt.Announce) -> None:
        """The worker's code changed while connected (``electric dev`` re-imported it): from now on
        its session hosts the announced types at the new version, and is the newest announcement
        (a SIGHUP'd entity's next wake may go to it). Its leases go on."""
        if session.closed:
            return
        await self._announce_types(announce.types, announce.code_version)
        before = session.code_version
        session.code_version = announce.code_version
        session.types = frozenset(t.type for t in announce.types)
        session.busy = {t.type: busy_policy(t, "announce") for t in announce.types}
        session.announced = next(self._announcements)
        await self.store.sessions.announce(session.id, tuple(sorted(session.types)), session.code_version)
        if before != session.code_version:
            log.info(
                "worker %s now runs code version %s (was %s)", session.worker_id, session.code_version, before
            )
        self.spawn(self.offer_all(session))  # a type it hosts now may have entities waiting

    def version_chosen(self, choice: VersionChoice) -> None:
        """An operator chose the version new wakes of a type get, on this replica: in effect here
        at once, and what its workers may take now is offered to them."""
        self.versions.keep(choice)
        for session in list(self.sessions.values()):
            if choice.type in session.types:
                self.spawn(self.offer_all(session))

    async def close(self, session: WorkerSession, cause: str) -> None:
        if session.closed and not session.leases:
            return
        session.closed = True
        session.outbox.put_nowait(None)
        if self.sessions.get(session.worker_id) is session:
            del self.sessions[session.worker_id]
        if self._stopping:
            # Draining: its leases are handed over (or kept for the restart) by drain().
            session.leases.clear()
            return
        try:
            await self.store.sessions.end([session.id])
        except StorageFault as exc:  # its row expires by itself
            log.warning("the end of worker %s's session was not recorded: %s", session.worker_id, exc)
        for lease in list(session.leases.values()):
            await self.end(lease, cause)

    def _forget(self, lease: Lease) -> None:
        lease.session.leases.pop(lease.ref, None)
        if self.leases.get(lease.ref) is lease:
            del self.leases[lease.ref]

    async def end(self, lease: Lease, cause: str) -> None:
        self._forget(lease)
        # A runtime that let go had its chance to report; one that was lost did not, and its
        # pending signals go to the next lease holder instead (pending-signal delivery), unless
        # the entity has ended: none will come.
        unsettled = lease.unsettled if cause == "released" else None
        ending = end_lease(lease.ref, lease.epoch, cause, unsettled, dict(lease.pending))
        await self.store.write(Write(lease.ref, ending))
        record = await self.store.get_entity(lease.ref)
        if record is not None and self._needs_runtime(record):
            # A task of the runtime's own: an end may run in a worker stream's cleanup, which gRPC
            # cancels when that stream dies (kill -9), and an offer cancelled after its grant
            # committed would leave the entity held by a session never told of it.
            self.spawn(self.offer(record), name="electric-offer")

    # -- leasing -----------------------------------------------------------------------------

    def _needs_runtime(self, record: EntityRecord) -> bool:
        if record.closed or record.ref in self.leases or record.lease_session:
            return False  # (a holder whose session ended is found by the sweep: lost_leases)
        return needs_runtime(record.state, message_cursor.waiting(record))

    def _pick(self, record: EntityRecord) -> WorkerSession | None:
        hosts = [
            s
            for s in self.sessions.values()
            if not s.closed
            and not s.draining
            and record.type in s.types
            and (not s.capacity or len(s.leases) < s.capacity)
        ]
        if not hosts:
            return None
        # A run bound to its code version goes back to it; a new wake (a SIGHUP'd one too) to the
        # version selected for the type (versions.py).
        hosts = self.versions.hosts_for(record, hosts, self.clock.now_ms())
        return min(hosts, key=lambda s: len(s.leases)) if hosts else None

    async def offer_all(self, session: WorkerSession) -> None:
        for type_ in session.types:
            after: Ref | None = None
            while not session.closed:
                page = await self.store.list_entities(type_, HOSTED_STATES, after, _PAGE)
                for record in page:
                    if self._needs_runtime(record):
                        await self.offer(record)
                if len(page) < _PAGE:
                    break
                after = page[-1].ref

    async def offer(self, record: EntityRecord) -> None:
        """Lease ``record`` to one of this replica's sessions, if one may take it."""
        ref = record.ref
        if ref in self.leases or ref in self._offering:
            return
        session = self._pick(record)
        if session is None:
            return
        self._offering.add(ref)
        try:
            try:
                default = self.type_profiles.default(ref[0])
                decide = grant(
                    ref,
                    record.lease_epoch,
                    session.id,
                    default,
                    message_cursor.bound_version(record),
                    session.busy.get(ref[0], ("", "")),
                )
                outcome = await self.store.write(Write(ref, decide))
            except Refused:
                return  # it changed meanwhile; the commit that changed it offers again if needed
            assert outcome.commit is not None
            after = outcome.commit.after
            assert after is not None
            lease = Lease(
                ref,
                outcome.commit.result.epoch,
                session,
                next_message=message_cursor.floor(after),
                first_attempt=after.cursor_attempt + 1,
                cursor=after.message_cursor,
            )
            if session.closed:
                await self.store.write(Write(ref, end_lease(ref, lease.epoch, "released")))
                return
            self.leases[ref] = session.leases[ref] = lease
            session.send(
                rt.ConnectResponse(
                    lease_granted=rt.LeaseGranted(
                        lease=lease.pb(), entity=entity_to_pb(after), resume_offset=after.head_offset
                    )
                )
            )
        finally:
            self._offering.discard(ref)
        await self._deliver_pending_signals(lease, after.head_offset)
        await self._pump(lease)

    async def _deliver_pending_signals(self, lease: Lease, head: int) -> None:
        """Signals still `pending` (appended while no runtime held the entity,
        or whose runtime died before reporting) go to the new lease holder, so
        every signal gets its outcome."""
        for message in await self.pending_signals(lease.ref, head):
            owe(lease, message)
            lease.session.send(rt.ConnectResponse(delivery=rt.Delivery(lease=lease.pb(), event=message)))

    async def pending_signals(self, ref: Ref, head: int | None = None) -> list[pb.Event]:
        """The signal records of ``ref`` still `pending`, oldest first; the look-back is bounded."""
        if head is None:
            record = await self.store.get_entity(ref)
            head = record.head_offset if record is not None else 0
        start = max(0, head - PENDING_LOOKBACK)
        recent = await self.store.read_events(ref, start, PENDING_LOOKBACK)
        updated = {e.key for e in recent if e.kind == "signal" and e.operation == pb.OPERATION_UPDATE}
        inserts = [
            event_to_pb(e)
            for e in recent
            if e.kind == "signal" and e.operation == pb.OPERATION_INSERT and e.key not in updated
        ]
        return [m for m in inserts if m.signal.outcome == pb.SIGNAL_OUTCOME_PENDING]

    # -- delivery -------------------------------------------------------------------------------

    def _on_commit(self, commit: Commit) -> None:
        after = commit.after
        if after is None:
            return
        lease = self.leases.get(commit.ref)
        if lease is not None and after.lease_epoch > lease.epoch:
            # A write that gave the lease back with it (RuntimeWrite.release): forgotten here, in
            # commit order, so whatever lands next is offered to a runtime instead of this one.
            self._forget(lease)
            settled = {e.key for e in commit.events if e.kind == "signal"}
            owed = {k: insert for k, insert in lease.unsettled.items() if k not in settled}
            if owed:  # signals that landed while the write was on its way: queued before any offer
                self.spawn(self.store.write(Write(commit.ref, settle_ignored(owed, after.state))))
            lease = None
        if lease is None:
            # No task for an entity no connected worker could take (e.g. spawns with no worker up).
            if self._needs_runtime(after) and self._pick(after) is not None:
                self.spawn(self.offer(after))
            return
        if after.state.terminal and (commit.before is None or not commit.before.state.terminal):
            # Its runtime may append its closing records (lifecycle.CLOSING_RECORDS: the signal's
            # outcome, the end of the run in progress, exec receipts), then the lease ends and
            # the stream closes: when it lets go, or after the settle at the latest.
            self.spawn(self._settle(lease))
        if commit.result == RUNTIME_WRITE:
            for event in commit.events:
                if event.kind == "signal":
                    lease.settled(event.key)  # the runtime reported its outcome
            return  # the worker knows what it wrote
        events = commit.events
        for event in events:
            if event.kind in ("signal", "state") and event.operation == pb.OPERATION_INSERT:
                # A signal the server settled in its own commit (a SIGINT that aborted the run)
                # reaches the runtime as that outcome, not as the `pending` insert before it.
                message = event_to_pb(_settled_in(events, event) if len(events) > 1 else event)
                if message.signal.outcome == pb.SIGNAL_OUTCOME_PENDING:
                    owe(lease, message)
                lease.session.send(rt.ConnectResponse(delivery=rt.Delivery(lease=lease.pb(), event=message)))
            elif event.kind == "message":
                self.spawn(self._pump(lease))
        if (
            commit.before is not None
            and commit.before.state is not after.state
            and STATE_RULES[after.state].delivers_messages
        ):
            self.spawn(self._pump(lease))  # e.g. SIGCONT: queued messages flow again

    async def _settle(self, lease: Lease) -> None:
        await asyncio.sleep(self.settle_s)
        if self.leases.get(lease.ref) is lease:
            await self.end(lease, "released")

    async def _pump(self, lease: Lease) -> None:
        """Deliver the lease's messages in stream order, while the state allows it."""
        if lease.pumping:
            lease.pump_again = True
            return
        lease.pumping = True
        try:
            while True:
                lease.pump_again = False
                record = await self.store.get_entity(lease.ref)
                if (
                    record is None
                    or not STATE_RULES[record.state].delivers_messages
                    or self.leases.get(lease.ref) is not lease
                ):
                    if lease.pump_again and self.leases.get(lease.ref) is lease:
                        # Asked again while the record was read (a SIGCONT committed meanwhile):
                        # what was read may be older than that commit, so it is read again.
                        continue
                    return
                page = await self.store.read_events(lease.ref, lease.next_message, _PAGE)
                for event in page:
                    if event.kind == "message" and message_cursor.deliverable(record, event.offset):
                        attempt = lease.first_attempt if event.offset == lease.cursor else 1
                        lease.session.send(
                            rt.ConnectResponse(
                                delivery=rt.Delivery(
                                    lease=lease.pb(), event=event_to_pb(event), attempt=attempt
                                )
                            )
                        )
                    lease.next_message = event.offset + 1
                if len(page) < _PAGE and not lease.pump_again:
                    return
        finally:
            lease.pumping = False


def _settled_in(events: Sequence[StoredEvent], insert: StoredEvent) -> StoredEvent:
    """The signal ``insert``'s update in the same commit, if there is one; else the insert."""
    if insert.kind == "signal":
        for event in events:
            if event.key == insert.key and event.operation == pb.OPERATION_UPDATE:
                return event
    return insert
