"""RuntimeService: workers' sessions, leases, delivery and fenced writes.

See proto/electric/v1/runtime_service.proto for the contract. A lease is its
entity row's epoch and holder (a worker session, store/sessions.py), granted
by compare-and-set and judged live inside each write's transaction, so
several replicas on one database never grant one entity twice and a zombie
worker's write is refused. This process keeps what it needs to serve its own
sessions (``Runtime.leases``); the sweep (lease_sweep.py) renews them and
fires what any replica may find due. Message delivery reads the stream from
the entity's message cursor; signals are forwarded from commits as they land.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from typing import Any

import grpc

from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import runtime_service_pb2_grpc as rt_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.entities import entity_to_pb
from electric_sdk._wire.events import event_to_pb
from electric_sdk._wire.times import duration_from_ms
from electric_sdk.lifecycle import HOSTED_STATES, STATE_RULES, needs_runtime
from electric_sdk.runtime_session import SESSION_ACCEPTED
from electric_sdk.stream_batches import EMPTY, Empty, coalesce

from ..clock import SYSTEM_CLOCK, Clock
from ..core import message_cursor
from ..core import validation as v
from ..core.auth import Principal, current_principal
from ..core.caps import Caps
from ..core.errors import ApiError, invalid_argument, translate_stream
from ..settings import HELLO_TIMEOUT, POLL, SETTLE
from ..store.base import Commit, EntityRecord, Ref, StorageFault, Store, StoredEvent, Write, WriteOutcome
from ..store.sessions import SessionRow
from .answers import check_write, fill, replayed, request_key, result_bytes
from .lease_sweep import LeaseSweep
from .local_leases import Lease, WorkerSession, owe
from .profiles import TypeProfiles
from .writes import Refused, end_lease, grant, runtime_write, settle_ignored

log = logging.getLogger(__name__)

RUNTIME_WRITE = "runtime-write"  # marks commits the runtime made itself: not echoed back to it
_PAGE = 500
PENDING_LOOKBACK = 1000  # events searched for still-pending signals when a lease is granted


class Runtime:
    """The sessions of this replica's workers and the leases they hold."""

    def __init__(
        self,
        store: Store,
        lease_ttl_ms: int,
        heartbeat_interval_ms: int,
        settle_ms: int = SETTLE.value,
        poll_ms: int = POLL.value,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.clock = clock  # heartbeats' times (clock.py)
        self._unadvance: Callable[[], None] = lambda: None
        self.replica = uuid.uuid4().hex[:12]  # this process, in the session book
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
        self._tasks: set[asyncio.Task[Any]] = set()
        self._expiry: asyncio.Task[None] | None = None
        self._handover: asyncio.Task[None] | None = None
        self.sweep = LeaseSweep(self)
        self._stopping = False
        self._unsubscribe = store.hub.subscribe_all(self._on_commit)
        self.type_profiles = TypeProfiles(store)

    # -- lifecycle of the service -------------------------------------------------------

    async def start(self) -> None:
        await self.type_profiles.load()
        # What is due already (e.g. streams whose runtime's lease ended with a restart) goes first.
        await self.sweep.once()
        self._expiry = asyncio.create_task(self.sweep.run(), name="electric-lease-sweep")
        loop = asyncio.get_running_loop()

        def wake() -> None:  # from the thread that advanced the clock: sessions may have expired
            loop.call_soon_threadsafe(self.sweep.wake)

        self._unadvance = self.clock.on_advance(wake)

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
        for task in list(self._tasks):
            task.cancel()
        self.sweep.stop()
        if self.store.sessions.shared:
            self._handover = asyncio.create_task(self._hand_over(held), name="electric-lease-handover")

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
        if self._expiry is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
            self._expiry = None
        if self._handover is not None:
            await self._handover
            self._handover = None
        else:
            await self._end_replica()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- sessions ---------------------------------------------------------------------------

    async def open(self, hello: rt.Hello) -> WorkerSession:
        # The types' defaults are in effect at once (a lease granted next, to any worker, uses
        # them) and stored before the worker is welcomed; the session exists only after that, so
        # a stream cancelled meanwhile leaves none behind.
        announced = [
            self.type_profiles.announce(
                hosted.type, hello.code_version, hosted.profile if hosted.HasField("profile") else None
            )
            for hosted in hello.types
        ]
        await asyncio.gather(*(self.type_profiles.save(profile) for profile in announced))
        session = WorkerSession(
            id=f"{self.replica}-{next(self._session_ids)}",
            worker_id=hello.worker_id,
            types=frozenset(t.type for t in hello.types),
            code_version=hello.code_version,
            announced=next(self._announcements),
            capacity=hello.capacity,
            last_seen=self.clock.monotonic(),
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
        await self.store.sessions.open(row, self.lease_ttl_ms)
        old = self.sessions.get(hello.worker_id)
        if old is not None:
            self._spawn(self.close(old, "runtime_lost"))
        self.sessions[hello.worker_id] = session
        self._spawn(self.offer_all(session))
        return session

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
            await self._end(lease, cause)

    def _forget(self, lease: Lease) -> None:
        lease.session.leases.pop(lease.ref, None)
        if self.leases.get(lease.ref) is lease:
            del self.leases[lease.ref]

    async def _end(self, lease: Lease, cause: str) -> None:
        self._forget(lease)
        # A runtime that let go had its chance to report; one that was lost did not, and its
        # pending signals go to the next lease holder instead (pending-signal delivery), unless
        # the entity has ended: none will come.
        unsettled = lease.unsettled if cause == "released" else None
        ending = end_lease(lease.ref, lease.epoch, cause, unsettled, dict(lease.pending))
        await self.store.write(Write(lease.ref, ending))
        record = await self.store.get_entity(lease.ref)
        if record is not None and self._needs_runtime(record):
            await self.offer(record)

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
        if record.reload_pending:
            # SIGHUP: the next wake goes to the newest code version announced for the type.
            newest = max(hosts, key=lambda s: s.announced).code_version
            hosts = [s for s in hosts if s.code_version == newest]
        return min(hosts, key=lambda s: len(s.leases))

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
                decide = grant(ref, record.lease_epoch, session.id, default)
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
                next_message=after.message_cursor,
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
                self._spawn(self.store.write(Write(commit.ref, settle_ignored(owed, after.state))))
            lease = None
        if lease is None:
            # No task for an entity no connected worker could take (e.g. spawns with no worker up).
            if self._needs_runtime(after) and self._pick(after) is not None:
                self._spawn(self.offer(after))
            return
        if after.state.terminal and (commit.before is None or not commit.before.state.terminal):
            # Its runtime may append its closing records (lifecycle.CLOSING_RECORDS: the signal's
            # outcome, the end of the run in progress, exec receipts), then the lease ends and
            # the stream closes: when it lets go, or after the settle at the latest.
            self._spawn(self._settle(lease))
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
                self._spawn(self._pump(lease))
        if (
            commit.before is not None
            and commit.before.state is not after.state
            and STATE_RULES[after.state].delivers_messages
        ):
            self._spawn(self._pump(lease))  # e.g. SIGCONT: queued messages flow again

    async def _settle(self, lease: Lease) -> None:
        await asyncio.sleep(self.settle_s)
        if self.leases.get(lease.ref) is lease:
            await self._end(lease, "released")

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

    # -- the worker's requests ---------------------------------------------------------------------

    async def read(self, session: WorkerSession, requests: AsyncIterator[rt.ConnectRequest]) -> None:
        try:
            async for request in requests:
                session.last_seen = self.clock.monotonic()
                if request.WhichOneof("msg") == "batch":
                    self._handle(session, request.batch.requests)
                else:
                    self._handle(session, (request,))
        finally:
            session.outbox.put_nowait(None)  # the worker hung up: end the response stream too

    def _handle(self, session: WorkerSession, requests: Iterable[rt.ConnectRequest]) -> None:
        """Start applying a worker's requests, without waiting for them.

        Requests are not awaited one by one: a fan-out (a SIGHUP to thousands
        of entities) has thousands of writes in flight at once, and the store
        commits them together instead of one fsync each. Per entity, a
        worker's requests still apply in the order it sent them: one waits for
        the session's previous request on that entity (``WorkerSession.tails``).
        """
        together: list[rt.RuntimeWrite] = []  # writes with nothing ahead of them: one store call
        together_refs: list[Ref] = []
        task: asyncio.Task[None] | None = None
        for request in requests:
            kind = request.WhichOneof("msg")
            if kind == "drain":
                session.draining = True
            elif kind == "release":
                ref = v.ref(request.release.ref)
                epoch = v.int64(request.release.epoch, "release.epoch")
                self._after_tail(session, ref, self._release(session, ref, epoch))
            elif kind in ("hello", "batch"):
                # The reader task's error ends the session with this status (see Connect).
                raise invalid_argument(
                    "UNEXPECTED_REQUEST",
                    "hello comes once, first; a batch holds no hello and no batch",
                    request=kind,
                )
            elif kind == "write":
                write = request.write
                check_write(write)
                ref = (write.ref.type, write.ref.id)
                if ref in session.tails:
                    self._after_tail(session, ref, self._answer(session, [write]))
                    continue
                if task is None:
                    task = self._track(session, self._answer(session, together), together_refs)
                together.append(write)
                together_refs.append(ref)
                session.tails[ref] = task

    def _after_tail(self, session: WorkerSession, ref: Ref, step: Coroutine[Any, Any, None]) -> None:
        before = session.tails.get(ref)

        async def chained() -> None:
            if before is not None and not before.done():
                await asyncio.wait([before])
            await step

        task = self._track(session, chained(), [ref])
        # A task cancelled before its step's turn (the server drains, even before the task first
        # ran) never awaits the step: close it, or it is reported as never awaited. Once the task
        # is done, the step has finished or never started, so closing it is always safe.
        task.add_done_callback(lambda _: step.close())
        session.tails[ref] = task

    def _track(
        self, session: WorkerSession, coro: Coroutine[Any, Any, None], refs: list[Ref]
    ) -> asyncio.Task[None]:
        """A task applying requests on ``refs`` (filled in until it first runs), the tail of each."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)

        def untrack(done: asyncio.Task[None]) -> None:
            self._tasks.discard(done)
            for ref in refs:
                if session.tails.get(ref) is done:
                    del session.tails[ref]

        task.add_done_callback(untrack)
        return task

    async def _release(self, session: WorkerSession, ref: Ref, epoch: int) -> None:
        lease = session.leases.get(ref)
        if lease is not None and lease.epoch == epoch:
            await self._end(lease, "released")

    async def _answer(self, session: WorkerSession, writes: list[rt.RuntimeWrite]) -> None:
        """Apply fenced writes (each its own commit, all in one store call) and answer each."""
        results = [rt.WriteResult(request_id=write.request_id) for write in writes]
        staged: list[tuple[rt.WriteResult, Write]] = []
        for write, result in zip(writes, results, strict=True):
            ref = (write.ref.type, write.ref.id)
            idem = request_key(write)
            lease = session.leases.get(ref)
            if lease is None or lease.epoch != write.epoch:
                # A retry of a write whose answer was lost (its session with it) gets that answer.
                if idem is None or not await replayed(self.store, ref, idem, result):
                    result.reason, result.message = "STALE_EPOCH", "this worker does not hold that lease"
                continue
            unsettled = dict(lease.unsettled) if write.release else None
            decide = runtime_write(ref, write, lease.inserts((write,)), unsettled)
            staged.append((result, Write(ref, _marked(decide), idem, result_bytes if idem else None)))
        if staged:
            outcomes: list[WriteOutcome | BaseException]
            try:
                outcomes = await self.store.write_many([w for _, w in staged])
            except Exception as exc:  # e.g. the store is closing: every write says so
                outcomes = [exc] * len(staged)
            for (result, _), outcome in zip(staged, outcomes, strict=True):
                fill(result, outcome)
        for result in results:
            session.send(rt.ConnectResponse(write_result=result))


def _settled_in(events: Sequence[StoredEvent], insert: StoredEvent) -> StoredEvent:
    """The signal ``insert``'s update in the same commit, if there is one; else the insert."""
    if insert.kind == "signal":
        for event in events:
            if event.key == insert.key and event.operation == pb.OPERATION_UPDATE:
                return event
    return insert


def _poll(outbox: asyncio.Queue[rt.ConnectResponse | None]) -> rt.ConnectResponse | Empty | None:
    try:
        return outbox.get_nowait()
    except asyncio.QueueEmpty:
        return EMPTY


def _response_batch(responses: list[rt.ConnectResponse]) -> rt.ConnectResponse:
    return rt.ConnectResponse(batch=rt.ResponseBatch(responses=responses))


def _marked(decide: Any) -> Any:
    def marked(current: EntityRecord | None, ctx: Any) -> Any:
        mutation = decide(current, ctx)
        mutation.result = RUNTIME_WRITE
        return mutation

    return marked


class RuntimeService(rt_grpc.RuntimeServiceServicer):
    def __init__(
        self, runtime: Runtime, caps: Caps | None = None, hello_timeout_ms: int = HELLO_TIMEOUT.value
    ) -> None:
        self.runtime = runtime
        self.caps = caps or Caps()
        self.hello_timeout_s = hello_timeout_ms / 1000

    @translate_stream
    async def Connect(
        self, request_iterator: AsyncIterator[rt.ConnectRequest], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[rt.ConnectResponse]:
        principal = current_principal.get()
        with self.caps.stream(principal.name):  # refused at the door: no marker
            await context.send_initial_metadata((SESSION_ACCEPTED,))  # the worker may now say hello
            try:
                first = await asyncio.wait_for(anext(aiter(request_iterator), None), self.hello_timeout_s)
            except TimeoutError:
                raise ApiError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    "HELLO_TIMEOUT",
                    f"no hello within {self.hello_timeout_s * 1000:g} ms of the stream's start",
                ) from None
            if first is None:
                return
            hello = _check_hello(first, principal)
            with self.caps.session(principal.name):
                session = await self.runtime.open(hello)
                yield rt.ConnectResponse(
                    welcome=rt.Welcome(
                        lease_ttl=duration_from_ms(round(self.runtime.lease_ttl_s * 1000)),
                        heartbeat_interval=duration_from_ms(self.runtime.heartbeat_interval_ms),
                    )
                )
                reader = asyncio.create_task(self.runtime.read(session, request_iterator))
                try:
                    while (item := await session.outbox.get()) is not None:
                        if not hello.accepts_batches:
                            yield item
                            continue
                        message, ended = coalesce(item, lambda: _poll(session.outbox), _response_batch)
                        yield message
                        if ended:
                            break
                    if reader.done() and not reader.cancelled() and (error := reader.exception()) is not None:
                        raise error  # a bad request (e.g. a malformed ref) ends the session with its status
                finally:
                    reader.cancel()
                    await self.runtime.close(session, "runtime_lost")


def _check_hello(first: rt.ConnectRequest, principal: Principal) -> rt.Hello:
    """The session's hello, checked: its names, its types' profiles, the principal's types."""
    if first.WhichOneof("msg") != "hello":
        raise invalid_argument("HELLO_FIRST", "a worker's session starts with hello")
    hello = first.hello
    v.name(hello.worker_id, "hello.worker_id")
    v.code_version(hello.code_version, "hello.code_version")
    types = [t.type for t in hello.types]
    v.hosted_types(types, "hello.types")
    for hosted_type in types:
        v.name(hosted_type, "hello.types.type")
    for hosted in hello.types:
        if hosted.HasField("profile"):  # checked here, so a lease never trips over it later
            v.profile_ms(hosted.profile, "hello.types.profile")
    if not types:
        raise invalid_argument("NO_TYPES", "hello must name at least one entity type", field="hello.types")
    if principal.types is not None and not set(types) <= principal.types:
        raise ApiError(
            grpc.StatusCode.PERMISSION_DENIED,
            "TYPE_NOT_ALLOWED",
            f"principal {principal.name!r} may not host {sorted(set(types) - principal.types)}",
        )
    return hello
