"""The EntityService: validation, then one store write or read per call.

Handlers validate first (nothing is written on bad input), then hand a pure
decide function from ``entity_writes`` to the store. Errors leave through
``errors.translate``; watches live in ``watch``.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.entities import entity_to_pb, entity_url, parent_key
from electric_sdk._wire.enums import STATE_TO_PB
from electric_sdk._wire.events import event_to_pb
from electric_sdk._wire.limits import PAGE_BYTES
from electric_sdk._wire.times import set_timestamp_ms, timestamp_from_ms
from electric_sdk.lifecycle import (
    MESSAGE_SCOPED_SIGNALS,
    OPT_IN_TIMING,
    PAYLOAD_SIGNALS,
    Outcome,
    Signal,
    SignalRejected,
)

from ..settings import LEASE_TTL
from ..store.base import Commit, Decide, EntityRecord, Idempotency, Mutation, Ref, Store, Write, WriteOutcome
from . import entity_writes, forks, message_cursor, signal_answers
from . import validation as v
from .auth import current_principal
from .caps import Caps
from .errors import ApiError, invalid_argument, not_found, translate, translate_stream
from .presence import LocalRuntime, Presence
from .versions import VersionDesk
from .watch import Watches

M = TypeVar("M", bound=Message)
Ctx = grpc.aio.ServicerContext[Any, Any]

# Bulk idempotency records live under this scope; it can never be a real
# entity because names must be non-empty.
BULK_SCOPE: Ref = ("", "")
# SignalEntities writes in chunks so other writers interleave between them.
BULK_CHUNK = 2000


# Fields that change only when the answer comes, so a retry with the same key may change them
# (the SDK's own fold after a waiting call was cut re-sends the signal without its wait).
_ANSWER_ONLY = {"SignalEntity": ("wait", "timeout")}


def _idempotency(method: str, request: Message) -> Idempotency | None:
    key = v.idempotency_key(getattr(request, "idempotency_key", ""))
    if key is None:
        return None
    body = type(request)()
    body.CopyFrom(request)
    body.ClearField("idempotency_key")
    for name in _ANSWER_ONLY.get(method, ()):  # how to answer, not what to write
        body.ClearField(name)
    digest = hashlib.sha256(method.encode() + b"\0" + body.SerializeToString(deterministic=True)).digest()
    return Idempotency(key, digest)


def _response(outcome: WriteOutcome, cls: type[M]) -> M:
    assert outcome.response is not None
    return cls.FromString(outcome.response)


async def _write(
    store: Store,
    ref: Ref,
    decide: Decide,
    idem: Idempotency | None,
    build: Callable[[Commit], M],
    cls: type[M],
    replayed: Callable[[bool], object] = bool,
) -> M:
    """One write; the response is built from its commit, or replayed for a retried key.

    Only idempotent writes store their encoded response; the others build it
    once, after the write, with no encode/decode round trip.
    """
    built: list[M] = []

    def encode(commit: Commit) -> bytes:
        # The last one built is the commit's: a store may decide a write again (a batch after a
        # deadlock, a lone write that raced), and each time encodes what that decision commits.
        built[:] = [build(commit)]
        return built[0].SerializeToString()

    outcome = await store.write(Write(ref, decide, idem, encode if idem is not None else None))
    replayed(outcome.replayed)
    if outcome.replayed:
        return _response(outcome, cls)
    assert outcome.commit is not None
    return built[0] if built else build(outcome.commit)


class EntityService(api_grpc.EntityServiceServicer):
    def __init__(
        self, store: Store, watches: Watches, runtime: LocalRuntime | None = None, caps: Caps | None = None
    ) -> None:
        self.store = store
        self.watches = watches
        self.runtime = runtime
        self.caps = caps or Caps()
        self.presence = Presence(store, runtime)
        self.versions = VersionDesk(store, runtime, runtime.lease_ttl_ms if runtime else LEASE_TTL.value)
        # Told of each signal refused (INVALID_SIGNAL: nothing written); the server's metrics.
        self.signal_rejected: Callable[[Signal], None] = lambda _signal: None

    # -- entities --------------------------------------------------------------

    @translate
    async def SpawnEntity(self, request: api.SpawnEntityRequest, context: Ctx) -> api.SpawnEntityResponse:
        ref = v.ref(request.ref)
        v.new_type(ref[0], "ref.type")
        # What the request leaves unset is the type's default, fixed at the first lease.
        grace, idle = v.profile_ms(request.profile, "profile")
        parent = await self._parent(request) if request.HasField("parent") else ""
        response = await _write(
            self.store,
            ref,
            entity_writes.spawn(ref, grace, idle, parent),
            _idempotency("SpawnEntity", request),
            lambda c: api.SpawnEntityResponse(entity=entity_to_pb(c.after)),  # type: ignore[arg-type]
            api.SpawnEntityResponse,
        )
        await self.presence.arrived(ref[0], "a spawn")
        return response

    async def _parent(self, request: api.SpawnEntityRequest) -> str:
        """The spawn's parent, which must exist and not have ended. Read before the spawn's own
        write: a parent that ends between the two still cascades to the child (core/cascade.py).
        No cycle can arise: the new entity has no children, and a parent is never changed."""
        ref = v.ref(request.parent, "parent")
        record = await self.store.get_entity(ref)
        url = entity_url(*ref)
        if record is None:
            raise ApiError(
                grpc.StatusCode.NOT_FOUND, "PARENT_NOT_FOUND", f"No parent entity {url}", {"parent": url}
            )
        if record.state.terminal:
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "PARENT_ENDED",
                f"Parent entity {url} has ended ({record.state.value})",
                {"parent": url, "state": record.state.value},
            )
        return parent_key(*ref)

    @translate
    async def GetEntity(self, request: api.GetEntityRequest, context: Ctx) -> api.GetEntityResponse:
        ref = v.ref(request.ref)
        record = await self.store.get_entity(ref)
        if record is None:
            raise not_found(*ref)
        [entity] = await self._with_holders([record])
        return api.GetEntityResponse(entity=entity)

    @translate
    async def ListEntities(self, request: api.ListEntitiesRequest, context: Ctx) -> api.ListEntitiesResponse:
        type_ = v.name(request.type, "type") if request.type else None
        states = v.states(request.states)
        limit = v.page_size(request.page_size)
        after = _decode_page_token(request.page_token)
        parent = parent_key(*v.ref(request.parent, "parent")) if request.HasField("parent") else ""
        records = await self.store.list_entities(type_, states, after, limit + 1, parent)
        page = records[:limit]
        token = _encode_page_token(page[-1].ref) if len(records) > limit else ""
        return api.ListEntitiesResponse(entities=await self._with_holders(page), next_page_token=token)

    async def _with_holders(self, records: list[EntityRecord]) -> list[pb.Entity]:
        """The entities as a reader gets them: each with the worker holding its lease, if live."""
        holders = await self.presence.holders(records)
        return [entity_to_pb(r, holders.get(r.lease_session)) for r in records]

    @translate
    async def ListWorkers(self, request: api.ListWorkersRequest, context: Ctx) -> api.ListWorkersResponse:
        return api.ListWorkersResponse(workers=await self.presence.workers())

    @translate
    async def ListVersions(self, request: api.ListVersionsRequest, context: Ctx) -> api.ListVersionsResponse:
        type_ = v.name(request.type, "type") if request.type else ""
        return api.ListVersionsResponse(types=await self.versions.list(type_))

    @translate
    async def SetVersion(self, request: api.SetVersionRequest, context: Ctx) -> api.SetVersionResponse:
        answer = await self.versions.choose(request, current_principal.get().name)
        return api.SetVersionResponse(versions=answer)

    # -- signals -----------------------------------------------------------------

    def _signal_spec(
        self, request: api.SignalEntityRequest | api.SignalEntitiesRequest
    ) -> entity_writes.SignalSpec:
        signal = v.signal(request.signal)
        payload = v.json_value(request.payload, request.HasField("payload"), "payload")
        if payload is not None and signal not in PAYLOAD_SIGNALS:
            raise invalid_argument("PAYLOAD_NOT_ALLOWED", "only SIGUSR carries a payload", field="payload")
        message_key = getattr(request, "message_key", "")
        if message_key:
            if signal not in MESSAGE_SCOPED_SIGNALS:
                raise invalid_argument(
                    "MESSAGE_KEY_NOT_ALLOWED", "only SIGINT can be scoped to a message", field="message_key"
                )
            v.name(message_key, "message_key")
        interrupt = getattr(request, "interrupt", False)
        if interrupt and signal not in OPT_IN_TIMING:
            raise invalid_argument(
                "INTERRUPT_NOT_ALLOWED", "only SIGTERM can interrupt the step in progress", field="interrupt"
            )
        return entity_writes.SignalSpec(
            signal, v.reason(request.reason), payload, current_principal.get().name, message_key, interrupt
        )

    @translate
    async def SignalEntity(self, request: api.SignalEntityRequest, context: Ctx) -> api.SignalEntityResponse:
        ref = v.ref(request.ref)
        spec = self._signal_spec(request)
        idem = _idempotency("SignalEntity", request)
        if (wait := signal_answers.requested(request)) is None:
            return await self._signal(ref, spec, idem)
        return await signal_answers.answer_at_stage(
            self.store, self.watches, ref, wait, spec.message_key, context.time_remaining(),
            lambda replayed: self._signal(ref, spec, idem, replayed),
        )  # fmt: skip

    async def _signal(
        self,
        ref: Ref,
        spec: entity_writes.SignalSpec,
        idem: Idempotency | None,
        replayed: Callable[[bool], object] = bool,
    ) -> api.SignalEntityResponse:
        # A scoped signal's message, looked up before the write (a decide function reads nothing).
        located = await message_cursor.locate(self.store, ref, spec.message_key) if spec.message_key else None
        in_flight: message_cursor.Located | None = None
        read = False
        while True:
            try:
                return await _write(
                    self.store,
                    ref,
                    entity_writes.signal(ref, spec, located, in_flight, in_flight_read=read),
                    idem,
                    lambda c: signal_answers.signal_response(ref, spec.signal, c),
                    api.SignalEntityResponse,
                    replayed,
                )
            except entity_writes.NeedsInFlight:
                # A SIGINT that aborts a run waiting for its code version, with no runtime to
                # record its end: the server records it, under its message's key, read now.
                in_flight, read = await message_cursor.at_cursor(self.store, ref), True
            except SignalRejected:
                self.signal_rejected(spec.signal)
                raise

    @translate
    async def DeleteEntity(self, request: api.DeleteEntityRequest, context: Ctx) -> api.DeleteEntityResponse:
        ref = v.ref(request.ref)
        spec = entity_writes.SignalSpec(Signal.SIGKILL, "legacy delete", None, current_principal.get().name)
        result = await self._signal(ref, spec, _idempotency("DeleteEntity", request))
        return api.DeleteEntityResponse(result=result)

    @translate
    async def SignalEntities(
        self, request: api.SignalEntitiesRequest, context: Ctx
    ) -> api.SignalEntitiesResponse:
        selector = request.selector
        if selector.refs and (selector.type or selector.states):
            raise invalid_argument(
                "INVALID_SELECTOR", "selector.refs cannot be combined with type or states", field="selector"
            )
        if not (selector.refs or selector.type or selector.states):
            raise invalid_argument(
                "INVALID_SELECTOR", "the selector needs a type, states or refs", field="selector"
            )
        refs = list(dict.fromkeys(v.ref(r, "selector.refs") for r in selector.refs))
        type_ = v.name(selector.type, "selector.type") if selector.type else None
        states = v.states(selector.states)
        spec = self._signal_spec(request)
        idem = _idempotency("SignalEntities", request)
        if idem is not None:
            stored = await self.store.idempotent_response(BULK_SCOPE, idem.key)
            if stored is not None:
                if stored[0] != idem.request_hash:
                    raise invalid_argument(
                        "IDEMPOTENCY_KEY_REUSED",
                        f"idempotency key {idem.key!r} was already used with a different request",
                    )
                return api.SignalEntitiesResponse.FromString(stored[1])

        counts = {"signalled": 0, "ignored": 0, "skipped": 0, "not_found": 0}
        targets: list[Ref] = []
        if refs:
            for ref in refs:
                record = await self.store.get_entity(ref)
                if record is None:
                    counts["not_found"] += 1
                elif record.state.terminal:
                    counts["skipped"] += 1
                else:
                    targets.append(ref)
        else:
            after: Ref | None = None
            while True:
                page = await self.store.list_entities(type_, states, after, 1000)
                for record in page:
                    if record.state.terminal:
                        counts["skipped"] += 1
                    else:
                        targets.append(record.ref)
                if len(page) < 1000:
                    break
                after = page[-1].ref

        if idem is not None:
            # A key another request used on one of the targets would refuse that entity's write
            # after the others committed: refuse the call before it writes anything instead.
            for ref in targets:
                used = await self.store.idempotent_response(ref, idem.key)
                if used is not None and used[0] != idem.request_hash:
                    raise invalid_argument(
                        "IDEMPOTENCY_KEY_REUSED",
                        f"idempotency key {idem.key!r} was already used on {entity_url(*ref)} "
                        "with a different request",
                        idempotency_key=idem.key,
                    )

        def category(result: entity_writes.Signalled) -> bytes:
            return b"i" if result.decision.outcome is Outcome.IGNORED else b"s"

        in_flight: dict[Ref, message_cursor.Located | None] = {}
        for start in range(0, len(targets), BULK_CHUNK):
            chunk = targets[start : start + BULK_CHUNK]
            while chunk:
                # As SignalEntity: a SIGINT's run waiting for its code version is read, then written again.
                writes = [
                    Write(
                        ref,
                        entity_writes.signal(
                            ref, spec, None, in_flight.get(ref), in_flight_read=ref in in_flight
                        ),
                        idem,
                        lambda c: category(c.result),
                    )
                    for ref in chunk
                ]
                outcomes = await self.store.write_many(writes)
                again = [
                    ref
                    for ref, o in zip(chunk, outcomes, strict=True)
                    if isinstance(o, entity_writes.NeedsInFlight)
                ]
                for ref in again:
                    in_flight[ref] = await message_cursor.at_cursor(self.store, ref)
                for outcome in outcomes:
                    if isinstance(outcome, entity_writes.NeedsInFlight):
                        continue  # written again next
                    if isinstance(outcome, ApiError) and outcome.code is grpc.StatusCode.NOT_FOUND:
                        counts["not_found"] += 1
                    elif isinstance(outcome, SignalRejected):
                        # Became terminal since it was listed: judged like any other terminal entity.
                        counts["skipped"] += 1
                    elif isinstance(outcome, BaseException):
                        raise outcome
                    else:
                        counts["ignored" if outcome.response == b"i" else "signalled"] += 1
                chunk = again

        response = api.SignalEntitiesResponse(
            signalled=counts["signalled"],
            ignored=counts["ignored"],
            skipped=counts["skipped"],
            not_found=counts["not_found"],
        )
        if idem is None:
            response.created_at.GetCurrentTime()
            return response

        def remember(c: Any) -> bytes:
            set_timestamp_ms(response.created_at, c.timestamp_ms)
            return response.SerializeToString()

        outcome = await self.store.write(Write(BULK_SCOPE, lambda _c, _x: Mutation(), idem, remember))
        return _response(outcome, api.SignalEntitiesResponse)

    # -- messages ----------------------------------------------------------------

    @translate
    async def SendMessage(self, request: api.SendMessageRequest, context: Ctx) -> api.SendMessageResponse:
        ref = v.ref(request.ref)
        text = v.text(request.text)
        data = v.json_value(request.data, request.HasField("data"), "data")
        if not text and data is None:
            raise invalid_argument("EMPTY_MESSAGE", "a message needs text or data", field="text")
        policy = v.busy_policy(request.policy)
        sender = current_principal.get().name

        def build(c: Commit) -> api.SendMessageResponse:
            assert c.after is not None
            sent: entity_writes.Sent = c.result
            return api.SendMessageResponse(
                key=sent.key,
                offset=c.events[-1].offset,
                txid=c.txid,
                created_at=timestamp_from_ms(c.timestamp_ms),
                state=STATE_TO_PB[c.after.state],
                policy=sent.policy.value,
                signal_key=sent.signal_key,
            )

        asked: tuple[str, pb.MessageValue] | None = None
        while True:
            try:
                response = await _write(
                    self.store,
                    ref,
                    entity_writes.send_message(ref, text, data, sender, policy, asked),
                    _idempotency("SendMessage", request),
                    build,
                    api.SendMessageResponse,
                )
                break
            except entity_writes.NeedsAsk as needs:
                # A reply to a run awaiting input: its message is read, then the write is judged again.
                asked = await entity_writes.asking_message(self.store, ref, needs.offset)
        await self.presence.arrived(ref[0], "a message")
        return response

    # -- fork and retry ---------------------------------------------------------------

    @translate
    async def ForkEntity(self, request: api.ForkEntityRequest, context: Ctx) -> api.ForkEntityResponse:
        origin = v.ref(request.origin, "origin")
        ref = (origin[0], v.name(request.id, "id"))
        offset = request.offset if request.HasField("offset") else None
        reason = v.reason(request.reason)
        idem = _idempotency("ForkEntity", request)
        # The origin's events are read before the write (a decide function reads nothing); a
        # retried key answers from its first result without reading them again.
        if idem is not None and (stored := await self._replayed(ref, idem)) is not None:
            return api.ForkEntityResponse.FromString(stored)
        record, events = await forks.origin_events(self.store, origin, offset)
        # A fork is a new entity of its origin's type: refused for a type made before "." was
        # reserved, once the origin is known to exist (an absent one is ENTITY_NOT_FOUND).
        v.new_type(ref[0], "origin.type")

        def build(c: Commit) -> api.ForkEntityResponse:
            response = api.ForkEntityResponse(
                entity=entity_to_pb(c.after),  # type: ignore[arg-type]
                offset=c.result.offset,
                txid=c.txid,
            )
            set_timestamp_ms(response.created_at, c.timestamp_ms)
            return response

        sender = current_principal.get().name
        response = await _write(
            self.store,
            ref,
            forks.fork(ref, record, events, sender, reason),
            idem,
            build,
            api.ForkEntityResponse,
        )
        await self.presence.arrived(ref[0], "a fork")
        return response

    @translate
    async def RetryRun(self, request: api.RetryRunRequest, context: Ctx) -> api.RetryRunResponse:
        ref = v.ref(request.ref)
        key = v.name(request.run, "run")
        reason = v.reason(request.reason)
        idem = _idempotency("RetryRun", request)
        if idem is not None and (stored := await self._replayed(ref, idem)) is not None:
            return api.RetryRunResponse.FromString(stored)
        run = await forks.find_run(self.store, ref, key)
        from_step = request.from_step

        def build(c: Commit) -> api.RetryRunResponse:
            assert c.after is not None
            return api.RetryRunResponse(
                key=c.result,
                offset=c.events[0].offset,
                txid=c.txid,
                created_at=timestamp_from_ms(c.timestamp_ms),
                state=STATE_TO_PB[c.after.state],
                from_step=from_step,
            )

        response = await _write(
            self.store,
            ref,
            forks.retry(ref, run, from_step, current_principal.get().name, reason),
            idem,
            build,
            api.RetryRunResponse,
        )
        await self.presence.arrived(ref[0], "a retry")
        return response

    async def _replayed(self, ref: Ref, idem: Idempotency) -> bytes | None:
        """The stored response of a retried idempotency key, before any read for the write."""
        stored = await self.store.idempotent_response(ref, idem.key)
        if stored is None:
            return None
        if stored[0] != idem.request_hash:
            raise invalid_argument(
                "IDEMPOTENCY_KEY_REUSED",
                f"idempotency key {idem.key!r} was already used with a different request",
                idempotency_key=idem.key,
            )
        return stored[1]

    # -- events --------------------------------------------------------------------

    @translate
    async def ReadEvents(self, request: api.ReadEventsRequest, context: Ctx) -> api.ReadEventsResponse:
        ref = v.ref(request.ref)
        v.int64(request.from_offset, "from_offset")
        limit = v.page_size(request.limit, "limit")
        record = await self.store.get_entity(ref)
        if record is None:
            raise not_found(*ref)
        events = _within_page_bytes(
            [event_to_pb(e) for e in await self.store.read_events(ref, request.from_offset, limit)]
        )
        next_offset = events[-1].offset + 1 if events else request.from_offset
        return api.ReadEventsResponse(
            events=events,
            next_offset=next_offset,
            head_offset=record.head_offset,
            end_of_stream=record.closed and next_offset >= record.head_offset,
        )

    @translate_stream
    async def WatchEvents(  # type: ignore[override]
        self, request: api.WatchEventsRequest, context: Ctx
    ) -> AsyncIterator[api.WatchEventsResponse | bytes]:
        # Bytes are messages encoded once for every watcher (event_feed), which the generated
        # base class cannot express; the response serializer passes them through (handlers.py).
        ref = v.ref(request.ref)
        v.int64(request.from_offset, "from_offset")
        with self.caps.stream(current_principal.get().name):
            async for item in self.watches.events(ref, request.from_offset, request.accepts_batches):
                yield item

    @translate_stream
    async def WatchEntities(  # type: ignore[override]
        self, request: api.WatchEntitiesRequest, context: Ctx
    ) -> AsyncIterator[api.WatchEntitiesResponse | bytes]:
        # Changes come encoded once for every watcher (watch.py), as WatchEvents' events do.
        type_ = v.name(request.type, "type") if request.type else None
        states = v.states(request.states)
        with self.caps.stream(current_principal.get().name):
            async for item in self.watches.entities(type_, states, request.accepts_batches):
                yield item


def _within_page_bytes(events: list[pb.Event]) -> list[pb.Event]:
    """The first events that fit in PAGE_BYTES (at least one): with 64 KiB events, 100 of them
    would be a response larger than gRPC clients take by default; `next_offset` continues."""
    size = 0
    for i, event in enumerate(events):
        size += event.ByteSize()
        if i and size > PAGE_BYTES:
            return events[:i]
    return events


def _encode_page_token(ref: Ref) -> str:
    return f"{ref[0]}/{ref[1]}"


def _decode_page_token(token: str) -> Ref | None:
    if not token:
        return None
    type_, _, id_ = token.partition("/")
    if not (v.NAME_RE.fullmatch(type_) and v.NAME_RE.fullmatch(id_)):
        raise invalid_argument(
            "INVALID_PAGE_TOKEN", "page_token is not one this server issued", field="page_token"
        )
    return (type_, id_)
