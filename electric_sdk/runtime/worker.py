"""Worker: one process's session with the control plane (RuntimeService.Connect).

The worker says Hello (its id, the entity types it hosts with their profiles,
its code version), heartbeats its leases at the interval the Welcome names,
starts an ``EntityHost`` per granted lease, routes deliveries to it, and
resolves fenced writes by request id. If the stream breaks it reconnects (at
once the first time, then with backoff); the hosts of the broken session are
stopped (their leases went with it) and the server leases the entities again.

A replica that dies is noticed by the stream's own error (its connections
reset) or, when nothing answers any more (its host gone, the network cut), by
gRPC keepalive: a ping every ``keepalive_ms`` not answered within
``keepalive_timeout_ms`` ends the stream. The hello on another replica ends
the old session there at once, and its leases with it (docs/scaling.md,
"Failover").

Shutdown is two-phase (``await worker.shutdown(grace)``): take no new lease,
let runs finish within the grace, then cancel what is left, give the leases
back and close the stream. It is safe to call twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import grpc
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from .. import errors
from .._proto.electric.v1 import runtime_service_pb2 as rt
from .._proto.electric.v1 import runtime_service_pb2_grpc as rt_grpc
from .._proto.electric.v1 import types_pb2 as pb
from ..channels import open_channel
from ..client import AsyncClient, ClientOptions
from ..client._options import DurationLike
from ..models import Event, EventPage
from ..runtime_session import SESSION_ACCEPTED
from ..stream_batches import EMPTY, Empty, coalesce
from .app import App
from .entity_type import Versioning
from .exec.host import ExecHost
from .exec.spec import ExecType
from .fenced import SessionLost
from .host import EntityHost
from .lifetime import Lifetime
from .steps import seconds

if TYPE_CHECKING:  # prometheus-client is imported only by a worker that counts
    from .metrics import WorkerMetrics

__all__ = ["Worker", "WorkerClock"]

log = logging.getLogger("electric.runtime")

_FATAL = (errors.Unauthenticated, errors.PermissionDenied, errors.InvalidArgument)
# The hello's capacity is a uint32 on the wire.
MAX_CAPACITY = 2**32 - 1
# A session's keepalive: a replica that stops answering is given up on within 1.5 s at most.
KEEPALIVE_MS = 1000
KEEPALIVE_TIMEOUT_MS = 500


# An exec type's entities are OS processes (exec/host.py); the rest run Python code (host.py).
Host = EntityHost | ExecHost


def _key(ref: pb.EntityRef) -> tuple[str, str]:
    return (ref.type, ref.id)


class WorkerClock(Protocol):
    """A clock a test moves (``electric_sdk.testing.ManualClock``): the idle timeouts count on it,
    and each jump wakes the hosts (``on_advance`` may be called from another thread)."""

    def monotonic(self) -> float: ...
    def on_advance(self, callback: Callable[[], None]) -> Callable[[], None]: ...


@dataclass
class _Pending:
    done: anyio.Event = field(default_factory=anyio.Event)
    result: rt.WriteResult | None = None


class Worker:
    """Hosts the entity types of an ``App``.

    >>> worker = Worker(app, "127.0.0.1:7700")
    >>> async with anyio.create_task_group() as tg:
    ...     await tg.start(worker.run)  # returns once the server welcomed the worker
    ...     ...
    ...     await worker.shutdown(grace=10)
    """

    def __init__(
        self,
        app: App,
        address: str | Sequence[str] | None = None,
        *,
        token: str | None = None,
        worker_id: str | None = None,
        capacity: int = 0,
        options: ClientOptions | None = None,
        max_backoff_s: float = 2.0,
        reload_app: Callable[[], App] | None = None,
        metrics: WorkerMetrics | None = None,
        clock: WorkerClock | None = None,
        keepalive_ms: int = KEEPALIVE_MS,
        keepalive_timeout_ms: int = KEEPALIVE_TIMEOUT_MS,
    ) -> None:
        overrides: dict[str, Any] = {
            k: v for k, v in (("address", address), ("token", token)) if v is not None
        }
        if options is None:  # the environment only for what is not given (a bad variable is refused)
            self.options = ClientOptions(**overrides)
        else:
            self.options = ClientOptions(**{**options.__dict__, **overrides}) if overrides else options
        self.app = app
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
        if isinstance(capacity, bool) or not isinstance(capacity, int) or not 0 <= capacity <= MAX_CAPACITY:
            raise errors.InvalidArgument(
                f"capacity must be a whole number from 0 (no limit) to {MAX_CAPACITY}, got {capacity!r}",
                code="VALUE_OUT_OF_RANGE",
            )
        self.capacity = capacity
        self.keepalive_ms = _positive_ms("keepalive_ms", keepalive_ms)
        self.keepalive_timeout_ms = _positive_ms("keepalive_timeout_ms", keepalive_timeout_ms)
        self.code_version = app.code_version
        self._max_backoff_s = max_backoff_s
        # Called on every wake (dev mode): the app to host the woken entity with.
        self._reload_app = reload_app
        # The idle timeouts' clock: a test's ManualClock (electric_sdk.testing), else the loop's.
        self.clock = clock
        self._hosts: dict[tuple[str, str], Host] = {}
        self._host_tasks: set[asyncio.Task[None]] = set()
        # Each entity's newest host task: a new lease on it waits for the old one's end.
        self._task_of: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._hosts_changed = anyio.Event()
        self._pending: dict[int, _Pending] = {}
        self._next_request_id = 0
        self._outbox: MemoryObjectSendStream[rt.ConnectRequest | None] | None = None
        self._acks: list[rt.ConnectRequest] = []  # to go with the next request (``ack``)
        self._session_scope: anyio.CancelScope | None = None
        self._client: AsyncClient | None = None
        self._draining = False
        self._stopping = False
        self._running = False
        self._stopped = anyio.Event()
        self.heartbeat_interval_s = 1.0
        self.lease_ttl_s = 0.0
        self.connected = anyio.Event()
        # Off (None) unless asked for (``electric worker --metrics``): then fed as things happen.
        self.metrics = metrics
        if metrics is not None:
            metrics.follow(self)

    # -- facts ------------------------------------------------------------------------------

    @property
    def hosts(self) -> dict[tuple[str, str], Host]:
        """The entities hosted now, by (type, id)."""
        return dict(self._hosts)

    @property
    def draining(self) -> bool:
        """Whether ``shutdown`` has begun: no new lease is taken, the runs are finishing."""
        return self._draining

    def host(self, ref: str) -> Host | None:
        type_, _, id_ = ref.removeprefix("/").partition("/")
        return self._hosts.get((type_, id_))

    # -- running ----------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until ``shutdown``; reconnects (the first time at once, then with backoff).
        ``tg.start`` returns once welcomed."""
        if self._running:
            raise RuntimeError("this worker is already running")
        self._running = True
        backoff = 0.05
        at_once = -math.inf  # when a retry last went at once
        started = False
        welcomed = False
        loop = asyncio.get_running_loop()

        def clock_moved() -> None:  # from the thread that advanced the clock
            loop.call_soon_threadsafe(self._clock_moved)

        unsubscribe = self.clock.on_advance(clock_moved) if self.clock is not None else lambda: None

        def on_welcome() -> None:
            nonlocal backoff, started, welcomed
            welcomed, backoff = True, 0.05
            if started and self.metrics is not None:
                self.metrics.reconnects.inc()
            if not started:
                started = True
                task_status.started()

        try:
            while not self._stopping:
                welcomed = False
                try:
                    await self._session(on_welcome)
                except grpc.aio.AioRpcError as exc:
                    error = errors.from_rpc_error(exc)
                    if isinstance(error, _FATAL):
                        raise error from exc
                    self._session_ended(f"{error.code}: {error.message}")
                except (SessionLost, asyncio.InvalidStateError) as exc:  # the call ended under a write
                    self._session_ended(str(exc))
                except errors.Unavailable as error:  # e.g. no replica's name resolves (channels.py):
                    self._session_ended(f"{error.code}: {error}")  # DNS may answer again; so retry
                if self._stopping:
                    break
                if welcomed and anyio.current_time() - at_once > self._max_backoff_s:
                    # A session that ran ended (e.g. its replica died): straight to the others, as
                    # its entities wait for this worker's hello there; once per max_backoff_s, so
                    # a replica that welcomes and hangs up again is not dialled in a loop.
                    at_once = anyio.current_time()
                    continue
                backoff = min(backoff * 2, self._max_backoff_s)
                await anyio.sleep(backoff * (0.5 + random.random()))
        finally:
            unsubscribe()
            self._stopped.set()
            if self._client is not None:
                await self._client.close()
                self._client = None

    def _session_ended(self, why: str) -> None:
        """A session that ended under the worker: news while it serves (it reconnects), not once
        it is shutting down (a server draining at the same moment ends the stream its own way)."""
        if self._draining or self._stopping:
            log.info("runtime session ended while the worker shuts down: %s", why)
        else:
            log.warning("runtime session ended: %s", why)

    async def _session(self, on_welcome: Callable[[], None]) -> None:
        """One Connect stream, until it ends; ``on_welcome`` is called once the server welcomed us."""
        channel = open_channel(
            self.options.address,
            tls=self.options.tls,
            root_certificates=self.options.root_certificates,
            options=self._keepalive(),
        )
        send, receive = anyio.create_memory_object_stream[rt.ConnectRequest | None](math.inf)
        try:
            stub = rt_grpc.RuntimeServiceStub(channel)
            call = stub.Connect(metadata=self.options.metadata)
            # Hello only once the server has accepted the stream (see runtime_session);
            # a stream it refused ends without the marker, and read() says why.
            accepted = await call.initial_metadata()
            if accepted.get(SESSION_ACCEPTED[0]) == SESSION_ACCEPTED[1]:
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    # The stream may still end first (e.g. the server drains); read() says why.
                    await call.write(rt.ConnectRequest(hello=self._hello()))
            welcome = await call.read()
            if not isinstance(welcome, rt.ConnectResponse) or welcome.WhichOneof("msg") != "welcome":
                raise SessionLost("the server did not welcome the worker")
            self.lease_ttl_s = welcome.welcome.lease_ttl.ToTimedelta().total_seconds()
            interval = welcome.welcome.heartbeat_interval.ToTimedelta().total_seconds()
            self.heartbeat_interval_s = interval if interval > 0 else 1.0
            self._outbox, self._acks = send, []  # an old session's acks are its own
            self.connected.set()
            # The line `make run` and `electric worker` show once the server has it: from here
            # `electric workers` lists it, and entities of its types get leased.
            log.info(
                "worker %s connected to %s, hosting %s",
                self.worker_id,
                self.options.address,
                ", ".join(sorted(self.app.types)) or "no type",
            )
            on_welcome()
            failure: list[grpc.aio.AioRpcError] = []
            async with anyio.create_task_group() as tg:
                self._session_scope = tg.cancel_scope
                tg.start_soon(self._sender, call, receive, tg)
                tg.start_soon(self._heartbeats)
                try:
                    await self._receive(call, tg)
                except grpc.aio.AioRpcError as exc:
                    failure.append(exc)  # raised below, outside the task group, for run() to judge
                tg.cancel_scope.cancel()
            if failure:
                raise failure[0]
        finally:
            self._outbox = None
            self._session_scope = None
            self.connected = anyio.Event()
            for pending in self._pending.values():
                pending.done.set()  # result None: the write failed with the session
            self._pending.clear()
            if self.metrics is not None:
                self.metrics.session_lost()
            with anyio.CancelScope(shield=True):
                await self._stop_hosts()  # their leases went with the session
            send.close()
            receive.close()
            with anyio.CancelScope(shield=True):
                await channel.close()

    def _keepalive(self) -> tuple[tuple[str, Any], ...]:
        # A ping once the session's connection has read nothing for keepalive_ms, even while no
        # data flows (the server allows them: grpc/door.py); one unanswered in time ends the
        # stream, UNAVAILABLE. gRPC (1.85) times a keepalive ping out by ping_timeout_ms, whose
        # default is a minute, not by keepalive_timeout_ms alone: both are set.
        return (
            ("grpc.keepalive_time_ms", self.keepalive_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
            ("grpc.http2.ping_timeout_ms", self.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        )

    def _hosted(self) -> list[rt.HostedType]:
        # Under `electric dev` every reload is a new version: a run with no versioning of its own
        # is replayed on the new code at once rather than waiting for code that is gone.
        default: Versioning | None = "auto_upgrade" if self._reload_app is not None else None
        return [t.hosted(default) for t in self.app.types.values()]

    def _hello(self) -> rt.Hello:
        return rt.Hello(
            worker_id=self.worker_id,
            types=self._hosted(),
            code_version=self.code_version,
            capacity=self.capacity,
            accepts_batches=True,
        )

    def _reloaded(self, app: App) -> None:
        """``electric dev`` re-imported the app (or found it unchanged): host with it from now on;
        a new code version is logged and announced, so ``electric workers`` and the next SIGHUP'd
        wake see the version in use now."""
        self.app = app
        if app.code_version == self.code_version:
            return
        log.info("reloaded the app: code version %s -> %s", self.code_version, app.code_version)
        self.code_version = app.code_version
        self._send(
            rt.ConnectRequest(announce=rt.Announce(types=self._hosted(), code_version=self.code_version))
        )

    async def _sender(self, call: Any, receive: Any, tg: TaskGroup) -> None:
        try:
            async for request in receive:
                if request is None:  # shutdown: the leases are back, close our half
                    await call.done_writing()
                    return
                message, ended = coalesce(request, lambda: _poll(receive), _request_batch)
                await call.write(message)
                if ended:
                    await call.done_writing()
                    return
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            tg.cancel_scope.cancel()  # the stream is gone; the receiver reports why, if it can

    async def _heartbeats(self) -> None:
        while True:
            await anyio.sleep(self.heartbeat_interval_s)
            leases = [h.lease for h in self._hosts.values() if h.end_reason is None]
            self._send(rt.ConnectRequest(heartbeat=rt.Heartbeat(leases=leases)))

    def _send(self, request: rt.ConnectRequest | None) -> None:
        if self._outbox is not None:
            # A closed outbox: the session is ending, and the server forgets its leases with it.
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                for ack in self._acks:
                    self._outbox.send_nowait(ack)
                self._acks.clear()
                self._outbox.send_nowait(request)

    async def _receive(self, call: Any, tg: TaskGroup) -> None:
        while True:
            response = await call.read()
            if not isinstance(response, rt.ConnectResponse):  # grpc.aio.EOF
                return
            batch = response.batch.responses if response.WhichOneof("msg") == "batch" else (response,)
            for n, item in enumerate(batch, 1):
                await self._handle(item)
                if n < len(batch) and item.delivery.event.HasField("signal"):
                    # What a signal started (its handler, a SIGTERM's cleanup) runs before the rest
                    # of its batch is handled (a SIGTERM's `stopping` comes right behind it).
                    await anyio.lowlevel.checkpoint()

    async def _handle(self, response: rt.ConnectResponse) -> None:
        kind = response.WhichOneof("msg")
        if kind == "write_result":
            pending = self._pending.pop(response.write_result.request_id, None)
            if pending is not None:
                pending.result = response.write_result
                pending.done.set()
        elif kind == "delivery":
            d = response.delivery
            host = self._hosts.get(_key(d.lease.ref))
            if host is not None and host.lease.epoch == d.lease.epoch and host.end_reason is None:
                host.deliver(d.event, d.attempt)
                if self.metrics is not None:
                    self.metrics.delivered(d.event)
        elif kind == "lease_granted":
            await self._grant(response.lease_granted)
        elif kind == "lease_revoked":
            host = self._hosts.get(_key(response.lease_revoked.lease.ref))
            if host is not None and host.lease.epoch <= response.lease_revoked.lease.epoch:
                host.revoke(response.lease_revoked.reason)

    async def _grant(self, grant: rt.LeaseGranted) -> None:
        if self._reload_app is not None and grant.entity.state in (pb.STATE_IDLE, pb.STATE_SPAWNING):
            self._reloaded(self._reload_app())
        etype = self.app.types.get(grant.lease.ref.type)
        if self._draining or etype is None:
            self._send(rt.ConnectRequest(release=rt.Release(ref=grant.lease.ref, epoch=grant.lease.epoch)))
            return
        key = _key(grant.lease.ref)
        old = self._hosts.get(key)
        if old is not None:  # a newer lease on an entity we still host: the old session is over
            old.revoke("superseded")
        host: Host = (
            ExecHost(self, etype, grant) if isinstance(etype, ExecType) else EntityHost(self, etype, grant)
        )
        self._hosts[key] = host
        host.on_end = self._host_ended
        # A bare asyncio task (the session's end cancels it, below): anyio's task handles cost
        # about a kilobyte per task, and a worker may host ten thousand entities.
        # Deliveries that come before it runs wait in the host.
        previous = self._task_of.get(key)
        run = host.run() if previous is None or previous.done() else _after(previous, host)
        task = asyncio.get_running_loop().create_task(run, name=f"host {key[0]}/{key[1]}")
        self._host_tasks.add(task)
        self._task_of[key] = task
        task.add_done_callback(self._host_tasks.discard)
        task.add_done_callback(
            lambda done: self._task_of.pop(key, None) if self._task_of.get(key) is done else None
        )
        self._ring_hosts()

    async def _stop_hosts(self) -> None:
        # Awaited before the worker reconnects: the steps in flight of the leases that went with
        # the session are cancelled before it can take any new lease (docs/runtime.md, "Step keys").
        tasks = list(self._host_tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _host_ended(self, host: Lifetime) -> None:
        key = _key(host.lease.ref)
        if self._hosts.get(key) is host:
            del self._hosts[key]
        if not host.lease_returned:
            self._send(rt.ConnectRequest(release=rt.Release(ref=host.lease.ref, epoch=host.lease.epoch)))
        self._ring_hosts()

    def _ring_hosts(self) -> None:
        self._hosts_changed.set()
        self._hosts_changed = anyio.Event()

    async def wait_host(self, ref: str, *, gone: bool = False) -> Host | None:
        """Wait until the worker hosts ``ref`` (or, with ``gone=True``, no longer does)."""
        while (self.host(ref) is None) != gone:
            changed = self._hosts_changed
            await changed.wait()
        return self.host(ref)

    # -- the WorkerLink protocol (hosts call these) ------------------------------------------

    async def write(self, request: rt.RuntimeWrite) -> rt.WriteResult:
        if self._outbox is None:
            raise SessionLost("not connected")
        if not request.request_id:  # a request sent again keeps its id (Fenced._stored)
            self._next_request_id += 1
            request.request_id = self._next_request_id
        pending = self._pending[request.request_id] = _Pending()
        self._send(rt.ConnectRequest(write=request))
        await pending.done.wait()
        if pending.result is None:
            raise SessionLost("the session ended before the write was answered")
        return pending.result

    def ack(self, lease: rt.Lease, offset: int) -> None:
        # The server takes an ack as a sign of life: it goes in the batch of the next request (a
        # write, a heartbeat), not as a message of its own read ahead of a SIGINT's run end.
        self._acks.append(rt.ConnectRequest(ack=rt.Ack(ref=lease.ref, epoch=lease.epoch, offset=offset)))

    def client(self) -> AsyncClient:
        """The worker's client to the server (made at first use; closed with the worker)."""
        if self._client is None:
            self._client = AsyncClient(options=self.options, channel_options=self._keepalive())
        return self._client

    async def history(self, ref: pb.EntityRef) -> list[Event]:
        events: list[Event] = []
        offset = 0
        while True:
            page = await self.client().events(f"{ref.type}/{ref.id}", offset, limit=500)
            events.extend(page.events)
            if not page.events or page.next_offset >= page.head_offset:
                return events
            offset = page.next_offset

    def now_s(self) -> float:
        """What time it is for the idle timeouts of the hosted entities, in seconds."""
        return self.clock.monotonic() if self.clock is not None else anyio.current_time()

    def _clock_moved(self) -> None:
        for host in list(self._hosts.values()):
            host.clock_moved()

    async def events_page(self, ref: pb.EntityRef, from_offset: int, limit: int) -> EventPage:
        """One page of the entity's stream (a host reads its durable state and recorded steps)."""
        return await self.client().events(f"{ref.type}/{ref.id}", from_offset, limit=limit)

    # -- shutdown ---------------------------------------------------------------------------

    async def _wait_hosts_gone(self) -> None:
        while self._hosts:
            changed = self._hosts_changed
            await changed.wait()

    async def shutdown(self, grace: DurationLike = 10.0) -> None:
        """Take no new lease, let runs finish within ``grace``, cancel the rest, release, close.

        A second call waits for the first to finish; ``grace=0`` cancels the runs at once.
        """
        grace_s = seconds(grace)
        if self._draining:
            if grace_s <= 0:
                for host in list(self._hosts.values()):
                    host.end("worker shutdown")
            if self._running:
                await self._stopped.wait()
            return
        self._draining = True
        self._send(rt.ConnectRequest(drain=rt.Drain()))  # what we release now goes to other workers
        for host in list(self._hosts.values()):
            host.drain()
        with anyio.move_on_after(grace_s):
            await self._wait_hosts_gone()
        for host in list(self._hosts.values()):
            host.end("worker shutdown")
        with anyio.move_on_after(1.0):
            await self._wait_hosts_gone()
        self._stopping = True
        self._send(None)  # the sender closes our half once the Releases are out
        if not self._running:
            self._stopped.set()
            return
        with anyio.move_on_after(1.0):
            await self._stopped.wait()
        if self._session_scope is not None:
            self._session_scope.cancel()
        await self._stopped.wait()


def _positive_ms(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise errors.InvalidArgument(
            f"{name} must be a whole number of milliseconds, at least 1, got {value!r}",
            code="VALUE_OUT_OF_RANGE",
        )
    return value


def _poll(receive: Any) -> rt.ConnectRequest | Empty | None:
    try:
        item: rt.ConnectRequest | None = receive.receive_nowait()
    except anyio.WouldBlock:
        return EMPTY
    return item


def _request_batch(requests: list[rt.ConnectRequest]) -> rt.ConnectRequest:
    return rt.ConnectRequest(batch=rt.RequestBatch(requests=requests))


async def _after(previous: asyncio.Task[None], host: Host) -> None:
    """Host the entity once the previous host of it has ended: its steps in flight (cancelled
    when its lease was revoked) are over before the new lease runs any (a step in an abandoned
    thread excepted: docs/runtime.md, "Step keys")."""
    try:
        await asyncio.wait({previous})
    except asyncio.CancelledError:
        if host.on_end is not None:  # the session ended first: forgotten as if it had run
            host.on_end(host)
        raise
    await host.run()
