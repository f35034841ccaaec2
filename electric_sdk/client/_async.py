"""AsyncClient: the one implementation of every client operation (grpc.aio).

``Client`` (sync) runs this same code on a portal thread; nothing here is
duplicated there. An AsyncClient belongs to the event loop it was created on
(grpc.aio binds its channel to that loop); using it from another loop raises
``WrongEventLoop`` instead of hanging.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import copy
import random
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, stop_after_delay
from tenacity.wait import wait_random_exponential

from .. import errors
from .._proto.electric.v1 import entity_service_pb2 as api
from .._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from .._proto.electric.v1 import types_pb2 as pb
from .._wire.enums import state_from_pb, state_to_pb
from ..arguments import (
    RefLike,
    StateLike,
    parse_int64,
    parse_offset,
    parse_ref,
    parse_states,
)
from ..channels import open_channel
from ..durable_state import apply_all, ops_of
from ..models import (
    Entity,
    EntityChange,
    Event,
    EventPage,
    MessageReceipt,
)
from ..presence import WorkerInfo
from ..state_read import Loaded, load_state
from ._options import ClientOptions, DurationLike, to_duration
from ._sends import SendCalls, message_receipt, new_idempotency_key
from ._signal_calls import SignalCalls
from ._versions import VersionCalls

T = TypeVar("T")

_RETRYABLE = (errors.Unavailable, errors.DeadlineExceeded)
# grpc.health.v1: Check(HealthCheckRequest{service: ""}) -> HealthCheckResponse{status = 1: enum}.
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_SERVING = 1
_HEALTH_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _health_status(answer: bytes) -> int:
    """The status of an encoded HealthCheckResponse: field 1, a varint (0..3: one byte); absent: 0."""
    return answer[1] if len(answer) >= 2 and answer[0] == 0x08 else 0


# A stream open this long had connected: gRPC gives up a connection attempt after 20 s.
_CONNECTED_AFTER_S = 30.0


class AsyncClient(SendCalls, SignalCalls, VersionCalls):
    """The electric control plane, asynchronously.

    >>> async with AsyncClient("127.0.0.1:7700") as client:
    ...     await client.spawn("my_agent/agent_1")
    ...     result = await client.terminate("my_agent/agent_1", reason="done")
    """

    def __init__(
        self,
        address: str | Sequence[str] | None = None,
        *,
        options: ClientOptions | None = None,
        channel_options: Sequence[tuple[str, Any]] = (),
        **kw: Any,
    ) -> None:
        opts = options or ClientOptions(**kw)
        if address is not None:
            opts = ClientOptions(**{**opts.__dict__, "address": address})
        self.options = opts
        # gRPC channel arguments replacing the SDK's of the same names (a worker's keepalive).
        self.channel_options = tuple(channel_options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._channel: grpc.aio.Channel | None = None
        self._stub: api_grpc.EntityServiceStub | None = None
        self._closed = False
        with contextlib.suppress(RuntimeError):
            self._bind(asyncio.get_running_loop())

    async def wait_ready(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109 - as the sync Client's
        """Wait until the server is up and serving (its grpc.health.v1 status is SERVING), e.g.
        right after starting it; raises Unavailable after ``timeout`` seconds."""
        self._stub_for_this_loop()
        assert self._channel is not None
        # Raw bytes: the health protos ship with the [server] extra, not with the client.
        check: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(_HEALTH_CHECK)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last = "no answer"
        backoff = self.options.retry.initial_backoff_s
        while (left := deadline - loop.time()) > 0:
            try:
                # wait_for_ready: the call waits for a connection (a server still starting) rather
                # than failing at once.
                answer: bytes = await check(b"", timeout=left, wait_for_ready=True)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise errors.from_rpc_error(exc) from exc
                last = exc.code().name
            else:
                status = _health_status(answer)
                if status == _SERVING:
                    return
                last = _HEALTH_NAMES.get(status, str(status))
            await asyncio.sleep(min(backoff, max(0.0, deadline - loop.time())))
            backoff = min(backoff * 2, self.options.retry.max_backoff_s)
        raise errors.Unavailable(
            f"{self.options.address} not ready after {timeout:g} s ({last})", status="UNAVAILABLE"
        )

    # -- plumbing ---------------------------------------------------------------------

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        opts = self.options
        self._channel = open_channel(
            opts.address, tls=opts.tls, root_certificates=opts.root_certificates, options=self.channel_options
        )
        self._stub = api_grpc.EntityServiceStub(self._channel)

    def _stub_for_this_loop(self) -> api_grpc.EntityServiceStub:
        if self._closed:
            raise errors.ElectricError("this client is closed", code="CLIENT_CLOSED")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._bind(loop)
        elif loop is not self._loop:
            raise errors.WrongEventLoop(
                "this AsyncClient belongs to another event loop (grpc.aio binds a channel to the loop that "
                "created it); create one AsyncClient per event loop, or use the sync Client"
            )
        assert self._stub is not None
        return self._stub

    async def _call(self, rpc: str, request: Any, wait_s: float = 0.0) -> Any:
        """One unary call: deadline, metadata, retries, and error translation. ``wait_s``: how long
        the server may hold the answer on purpose (a signal's stage), added to each deadline."""
        method = getattr(self._stub_for_this_loop(), rpc)
        policy = self.options.retry
        loop = asyncio.get_running_loop()
        # Every attempt's deadline ends by the policy's total: one that started late does not run
        # a whole timeout past it (a database that stops answering costs total_s, not more).
        ends = loop.time() + max(policy.total_s, self.options.timeout_s) + wait_s

        async def attempt() -> Any:
            timeout = max(0.001, min(self.options.timeout_s + wait_s, ends - loop.time()))
            try:
                return await method(request, timeout=timeout, metadata=self.options.metadata)
            except grpc.aio.AioRpcError as exc:
                raise errors.from_rpc_error(exc) from exc

        try:
            # The first attempt goes straight out: the retry machinery costs
            # more than the call itself on loopback, and most calls succeed.
            return await attempt()
        except _RETRYABLE:
            if policy.attempts <= 1:
                raise
        await asyncio.sleep(random.uniform(0, policy.initial_backoff_s))  # jittered, like every later wait
        async for retry in AsyncRetrying(
            stop=stop_after_attempt(policy.attempts - 1) | stop_after_delay(max(0.0, ends - loop.time())),
            # Full jitter: a random wait up to the exponential bound.
            wait=wait_random_exponential(multiplier=policy.initial_backoff_s, max=policy.max_backoff_s),
            retry=retry_if_exception_type(_RETRYABLE),
            reraise=True,
        ):
            with retry:
                return await attempt()
        raise AssertionError("unreachable: tenacity reraises")

    async def close(self) -> None:
        self._closed = True
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def __aenter__(self) -> AsyncClient:
        self._stub_for_this_loop()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- entities --------------------------------------------------------------------------

    async def spawn(
        self,
        ref: RefLike,
        *,
        grace_period: DurationLike | None = None,
        idle_timeout: DurationLike | None = None,
        idempotency_key: str | None = None,
        parent: RefLike | None = None,
    ) -> Entity:
        """Create an entity in `spawning`. Raises EntityExists if the id was ever used. ``parent``:
        the entity it works for (it must exist and not have ended); its SIGTERM and SIGKILL
        cascade to the child (docs/runtime.md, "Child entities")."""
        r = parse_ref(ref)
        profile = pb.Profile()
        try:
            if grace_period is not None:
                profile.grace_period.CopyFrom(to_duration(grace_period))
            if idle_timeout is not None:
                profile.idle_timeout.CopyFrom(to_duration(idle_timeout))
        except ValueError as exc:
            raise errors.InvalidArgument(str(exc), code="INVALID_DURATION") from exc
        request = api.SpawnEntityRequest(
            ref=r.to_pb(), profile=profile, idempotency_key=idempotency_key or new_idempotency_key()
        )
        if parent is not None:
            request.parent.CopyFrom(parse_ref(parent).to_pb())
        response: api.SpawnEntityResponse = await self._call("SpawnEntity", request)
        return Entity.from_pb(response.entity)

    async def get(self, ref: RefLike) -> Entity:
        response: api.GetEntityResponse = await self._call(
            "GetEntity", api.GetEntityRequest(ref=parse_ref(ref).to_pb())
        )
        return Entity.from_pb(response.entity)

    async def list(
        self,
        type: str | None = None,
        states: StateLike | Iterable[StateLike] | None = None,
        *,
        limit: int | None = None,
        page_size: int = 500,
        parent: RefLike | None = None,
    ) -> list[Entity]:
        """Entities ordered by type and id, all pages (or the first ``limit``); ``parent``: only
        its children."""
        out: list[Entity] = []
        token = ""
        wanted = [state_to_pb(s) for s in parse_states(states)]
        while True:
            size = page_size if limit is None else max(1, min(page_size, limit - len(out)))
            request = api.ListEntitiesRequest(
                type=type or "", states=wanted, page_size=size, page_token=token
            )
            if parent is not None:
                request.parent.CopyFrom(parse_ref(parent).to_pb())
            response: api.ListEntitiesResponse = await self._call("ListEntities", request)
            out.extend(Entity.from_pb(e) for e in response.entities)
            token = response.next_page_token
            if not token or (limit is not None and len(out) >= limit):
                return out

    async def workers(self) -> builtins.list[WorkerInfo]:
        """The worker sessions connected now, on every replica, by worker id."""
        response: api.ListWorkersResponse = await self._call("ListWorkers", api.ListWorkersRequest())
        return [WorkerInfo.from_pb(w) for w in response.workers]

    # -- messages and events --------------------------------------------------------------------

    async def fork(
        self,
        ref: RefLike,
        new_id: str,
        *,
        at: int | None = None,
        reason: str = "",
        idempotency_key: str | None = None,
    ) -> Entity:
        """A new entity ``TYPE/new_id`` whose stream holds ``ref``'s events before offset ``at``
        (None: all of them), then its fork record; `idle`, with ``ref``'s state as of ``at``."""
        request = api.ForkEntityRequest(
            origin=parse_ref(ref).to_pb(),
            id=new_id,
            reason=reason,
            idempotency_key=idempotency_key or new_idempotency_key(),
        )
        if at is not None:
            request.offset = parse_int64(at, "at")
        response: api.ForkEntityResponse = await self._call("ForkEntity", request)
        return Entity.from_pb(response.entity)

    async def retry(
        self,
        ref: RefLike,
        run: str,
        *,
        from_step: int = 0,
        reason: str = "",
        idempotency_key: str | None = None,
    ) -> MessageReceipt:
        """Run the failed or aborted run ``run`` (its message key) again: the steps before
        ``from_step`` answer from its records, the rest execute. The receipt is the retry's message."""
        r = parse_ref(ref)
        request = api.RetryRunRequest(
            ref=r.to_pb(),
            run=run,
            from_step=parse_int64(from_step, "from_step"),
            reason=reason,
            idempotency_key=idempotency_key or new_idempotency_key(),
        )
        return message_receipt(r, await self._call("RetryRun", request))

    async def events(self, ref: RefLike, from_offset: int = 0, limit: int = 100) -> EventPage:
        """One page of the entity's stream from an offset (inclusive)."""
        request = api.ReadEventsRequest(
            ref=parse_ref(ref).to_pb(), from_offset=parse_offset(from_offset), limit=limit
        )
        response: api.ReadEventsResponse = await self._call("ReadEvents", request)
        return EventPage(
            tuple(Event.from_pb(e) for e in response.events),
            response.next_offset,
            response.head_offset,
            response.end_of_stream,
        )

    async def state(self, ref: RefLike) -> dict[str, Any]:
        """The entity's durable state (``ctx.state``: named collections of JSON values), rebuilt as
        its worker does: the latest snapshot plus the events after it."""
        return (await self._load_state(ref)).state

    async def watch_state(self, ref: RefLike) -> AsyncIterator[dict[str, Any]]:
        """The entity's durable state now, then again after each change; ends when the stream closes."""
        loaded = await self._load_state(ref)
        state = loaded.state
        yield copy.deepcopy(state)
        async for event in self.watch(ref, loaded.head):
            if ops := ops_of(event.type, event.value.get("data")):
                apply_all(state, ops)
                yield copy.deepcopy(state)

    async def _load_state(self, ref: RefLike) -> Loaded:
        async def page(from_offset: int, limit: int) -> EventPage:
            return await self.events(ref, from_offset, limit)

        return await load_state(page, (await self.events(ref, 0, 1)).head_offset)

    async def watch(self, ref: RefLike, from_offset: int = 0) -> AsyncIterator[Event]:
        """The entity's events from an offset, then live; ends when the stream closes.

        Reconnects after a broken connection or a server restart and resumes
        after the last event seen: nothing missed, nothing repeated.
        """
        r = parse_ref(ref)
        offset = parse_offset(from_offset)
        async for item in self._resumable(
            # Late binding is the point: a reconnect resumes after the last event seen.
            lambda: api.WatchEventsRequest(ref=r.to_pb(), from_offset=offset, accepts_batches=True),  # noqa: B023
            "WatchEvents",
        ):
            kind = item.WhichOneof("item")
            if kind == "end_of_stream":
                return
            for message in item.events.events if kind == "events" else (item.event,):
                event = Event.from_pb(message)
                offset = event.offset + 1
                yield event

    async def watch_entities(
        self, type: str | None = None, states: StateLike | Iterable[StateLike] | None = None
    ) -> AsyncIterator[EntityChange]:
        """Snapshot rows (``snapshot=True``), then live state changes.

        After a reconnect the server sends a fresh snapshot, again marked
        ``snapshot=True``, so a consumer can rebuild its view.
        """
        wanted = [state_to_pb(s) for s in parse_states(states)]
        async for item in self._resumable(
            lambda: api.WatchEntitiesRequest(type=type or "", states=wanted, accepts_batches=True),
            "WatchEntities",
        ):
            kind = item.WhichOneof("item")
            if kind == "snapshot":
                for entity in item.snapshot.entities:
                    yield EntityChange(Entity.from_pb(entity), None, snapshot=True)
            elif kind == "change":
                yield _change(item.change)
            elif kind == "changes":
                for change in item.changes.changes:
                    yield _change(change)

    async def _resumable(
        self,
        request: Callable[[], Any],
        rpc: str,
        *,
        on_retry: Callable[[errors.ElectricError], None] | None = None,
        reconnect_s: float | None = None,
    ) -> AsyncIterator[Any]:
        """A server stream that reconnects with backoff on UNAVAILABLE/lagging.

        ``on_retry`` hears each failure it retries (a dashboard says the server is away meanwhile);
        ``reconnect_s`` overrides ``options.reconnect_s``, how long it tries before it gives up."""
        policy = self.options.retry
        give_up_after_s = self.options.reconnect_s if reconnect_s is None else reconnect_s
        backoff = policy.initial_backoff_s
        give_up_at: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            stub = self._stub_for_this_loop()
            call = getattr(stub, rpc)(request(), metadata=self.options.metadata)
            opened_at = loop.time()
            try:
                async for item in call:
                    backoff, give_up_at = policy.initial_backoff_s, None
                    yield item
                return
            except grpc.aio.AioRpcError as exc:
                error = errors.from_rpc_error(exc)
                if not isinstance(error, errors.Unavailable | errors.WatchLagging):
                    raise error from exc
                now = loop.time()
                if now - opened_at >= _CONNECTED_AFTER_S:
                    # A quiet stream (no item) that was up for a while broke: a new outage,
                    # with a fresh budget, not the tail of the previous one.
                    backoff, give_up_at = policy.initial_backoff_s, None
                give_up_at = give_up_at or now + give_up_after_s
                if now >= give_up_at:
                    raise error from exc
                if on_retry is not None:
                    on_retry(error)
                await asyncio.sleep(backoff * (0.5 + random.random()))  # jitter
                backoff = min(backoff * 2, policy.max_backoff_s)
            finally:
                call.cancel()

    async def wait_for_state(
        self,
        ref: RefLike,
        states: StateLike | Iterable[StateLike],
        timeout: float | None = None,  # noqa: ASYNC109 - the same signature as the sync Client's
    ) -> Entity:
        """Wait until the entity is in one of ``states``; returns it then.

        Raises DeadlineExceeded after ``timeout`` seconds, and
        FailedPrecondition if the entity ends (stopped/killed) elsewhere.
        """
        wanted = set(parse_states(states))
        r = parse_ref(ref)

        async def wait() -> Entity:
            entity = await self.get(r)
            if entity.state in wanted:
                return entity
            async for event in self.watch(r, entity.head_offset):
                if event.state in wanted:
                    return await self.get(r)
            entity = await self.get(r)
            if entity.state in wanted:
                return entity
            raise errors.FailedPrecondition(
                f"{r.url} ended {entity.state.value} without reaching {sorted(s.value for s in wanted)}",
                code="STATE_NOT_REACHED",
            )

        try:
            return await asyncio.wait_for(wait(), timeout)
        except TimeoutError:
            raise errors.DeadlineExceeded(
                f"{r.url} did not reach {sorted(s.value for s in wanted)} within {timeout} s",
                code="WAIT_TIMEOUT",
            ) from None


def _change(change: api.EntityChange) -> EntityChange:
    return EntityChange(Entity.from_pb(change.entity), state_from_pb(change.previous_state), snapshot=False)
