"""The HTTP door's routes as data: one table, read by the door and by the OpenAPI generator.

Each ``HttpRoute`` says what a route is (method, path, summary, the token scope
it needs, its query parameters, the schema of its body and of each response,
the error statuses it may answer) and who serves it:

- ``call``: an ``EntityService`` method (the function itself); ``http/door.py``
  builds the gRPC request with ``build`` and renders the response with
  ``render`` (the builders and renderers are below, beside the table that
  names them);
- ``handler``: any other handler, as a function that makes the route's
  endpoint from the door's parts (``http/handlers.py``): the door's own
  (probes, metrics, this document, an entity's state) or the live reads
  (``http/streams.py``: the Durable Streams read and SSE), which make none for
  a door without the live reads, and the door then leaves the route out.

``http/openapi.py`` turns the table into the OpenAPI 3.1 document (the schemas it
names live there); ``docs/openapi.json`` is that document, drift-tested. Every
route with ``aliased`` is also served under ``/_electric/entities``, as
ElectricSQL's server serves them; the fixed paths are matched first.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import Message
from starlette.requests import Request

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.entities import entity_url
from electric_sdk._wire.enums import SIGNAL_TO_PB
from electric_sdk._wire.rendering import (
    entity_json,
    event_json,
    message_receipt_json,
    signal_json,
    signal_many_json,
)
from electric_sdk._wire.run_outcome import WAIT_KINDS
from electric_sdk._wire.times import duration_from_ms
from electric_sdk._wire.versions import type_versions_json
from electric_sdk._wire.workers import worker_json
from electric_sdk.durations import format_ms
from electric_sdk.lifecycle import Signal, Stage, State

from ..core.auth import entity_scope
from ..core.errors import invalid_argument
from ..core.service import EntityService
from ..core.validation import MAX_INT64, MAX_PAGE, NAME_RE
from ..core.validation import name as valid_name
from . import body, forking, handlers, signal_waits, streams, waits
from .admission import Build
from .handlers import Handler
from .query import DURATION_SCHEMA, Query, query_duration, query_int
from .query import parse_states as _parse_states
from .query import query_one as _query_one
from .query import ref as _ref

PREFIX = "/_electric/entities"
MIGRATION_DOC = "docs/migration-delete.md"
MAX_UINT32 = 2**32 - 1
MAX_UINT64 = 2**64 - 1

# An EntityService method, unbound: EntityService.SignalEntity.
Rpc = Callable[[EntityService, Any, Any], Awaitable[Any]]
# The gRPC request and response → the JSON response body.
Render = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class Param:
    """A query parameter; ``schema`` is the JSON Schema of one value."""

    name: str
    description: str
    schema: Mapping[str, Any]
    repeated: bool = False
    # Given, the request goes to this handler's endpoint (``live=sse`` to the SSE stream); while
    # the handler makes none (a door without the live reads), the route refuses the parameter.
    handler: Handler | None = None


@dataclass(frozen=True)
class Answer:
    """A response: its status, and its body's schema (a component name) and media type."""

    status: int
    description: str
    schema: str | None = None
    media: str = "application/json"
    headers: tuple[str, ...] = ()  # names of components/headers
    also: tuple[tuple[str, str], ...] = ()  # more (media type, schema) of the same status


@dataclass(frozen=True)
class Call:
    """A route served by an ``EntityService`` method."""

    rpc: Rpc
    build: Build
    render: Render
    has_body: bool = True
    optional_body: bool = False  # an empty body is ``{}`` (a spawn needs no field)
    name: str = ""  # the method's name, for an ``rpc`` that is not the method itself

    @property
    def method(self) -> str:
        """The gRPC method's name: its token scope's, its refusals' in the log."""
        return self.name or self.rpc.__name__


@dataclass(frozen=True)
class HttpRoute:
    method: str
    path: str
    operation: str  # the OpenAPI operationId
    summary: str
    answers: tuple[Answer, ...]
    errors: tuple[int, ...]
    scope: str | None = None  # the token scope; None: open even with tokens
    call: Call | None = None
    handler: Handler | None = None  # when not ``call``: makes the route's endpoint
    body: str | None = None  # the request body's schema (a component name)
    body_required: bool = True
    query: tuple[Param, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)  # sent with every answer
    aliased: bool = True
    alias: str | None = None  # one more path under /_electric, served alike (not aliased)
    spawns: bool = False  # the path names a new entity (its type may not start with "_")
    deprecated: bool = False
    description: str = ""

    @property
    def served_by_door(self) -> bool:
        """Served by every door: by the service or the door's own handlers, without the live
        reads (http/streams.py), which a door serves only when given them."""
        return self.call is not None or self.handler in _DOOR_HANDLERS

    @property
    def status(self) -> int:
        return self.answers[0].status


# -- request builders: path, query and body → the gRPC request ---------------------------------------


# A signal as its canonical name ("SIGUSR") is looked up at once; Signal.parse takes the rest.
_SIGNAL_NAMES = {signal.value: wire for signal, wire in SIGNAL_TO_PB.items()}


def _parse_signal(text: str) -> pb.Signal.ValueType:
    found = _SIGNAL_NAMES.get(text)
    if found is not None:
        return found
    try:
        return SIGNAL_TO_PB[Signal.parse(text)]
    except ValueError as exc:
        raise invalid_argument("UNKNOWN_SIGNAL", str(exc), field="signal") from None


def _signal_fields(
    obj: body.JsonObject, message: api.SignalEntityRequest | api.SignalEntitiesRequest
) -> None:
    message.signal = _parse_signal(body.string(obj, "signal"))
    message.reason = body.reason(obj)
    if "payload" in obj:
        message.payload.CopyFrom(body.json_value(obj, "payload"))


def _spawn(request: Request, query: Query, obj: body.JsonObject) -> Message:
    """A spawn, or a fork with the Durable Streams fork headers (http/forking.py)."""
    body.fields(obj, {"profile", "parent"})
    ref = _ref(request)
    if ref.type.startswith("_"):
        raise invalid_argument(
            "RESERVED_NAME", "entity types starting with '_' are reserved over HTTP", field="ref.type"
        )
    message = api.SpawnEntityRequest(ref=ref)
    if "parent" in obj:
        parent_type, _, parent_id = body.string(obj, "parent").strip("/").partition("/")
        message.parent.CopyFrom(pb.EntityRef(type=parent_type, id=parent_id))  # validated by the service
    profile = body.mapping(obj, "profile")
    body.fields(profile, {"grace_period_ms", "idle_timeout_ms"}, "profile.")
    for name, wire in (("grace_period_ms", "grace_period"), ("idle_timeout_ms", "idle_timeout")):
        ms = body.integer(profile, name, body.MAX_DURATION_FIELD_MS)
        if ms is not None:
            getattr(message.profile, wire).CopyFrom(duration_from_ms(ms))
    return forking.create(request, message)


def _get(request: Request, query: Query, obj: body.JsonObject) -> Message:
    return api.GetEntityRequest(ref=_ref(request))


def _delete(request: Request, query: Query, obj: body.JsonObject) -> Message:
    return api.DeleteEntityRequest(ref=_ref(request))


def _list(request: Request, query: Query, obj: body.JsonObject) -> Message:
    query_duration(query, "timeout", waits.MAX_WAIT_MS)  # checked; a list holds no live read
    return api.ListEntitiesRequest(
        type=_query_one(query, "type"),
        states=_parse_states(query.get("state", []), "state"),
        page_size=query_int(query, "page_size", MAX_UINT32),
        page_token=_query_one(query, "page_token"),
    )


def _signal(request: Request, query: Query, obj: body.JsonObject) -> Message:
    body.fields(obj, {"signal", "reason", "payload", "message_key", "interrupt"})
    message_key = body.string(obj, "message_key")
    if "message_key" in obj:
        # Over gRPC an empty key is no key (proto3); here a key given is one (the document's
        # pattern), so an empty one is refused (the name rule's INVALID_NAME), not taken for a
        # signal to the whole entity.
        valid_name(message_key, "message_key")
    message = api.SignalEntityRequest(
        ref=_ref(request),
        message_key=message_key,
        interrupt=body.boolean(obj, "interrupt"),
    )
    _signal_fields(obj, message)
    return message


_SIGNAL_WAIT = signal_waits.signal_and_wait(_signal)


def _signal_many(request: Request, query: Query, obj: body.JsonObject) -> Message:
    body.fields(obj, {"selector", "signal", "reason", "payload"})
    selector = body.mapping(obj, "selector")
    body.fields(selector, {"type", "states", "refs"}, "selector.")
    refs = []
    for text in body.strings(selector, "refs"):
        type_, sep, id_ = text.removeprefix("/").partition("/")
        if not sep:
            raise invalid_argument(
                "INVALID_NAME", f"selector.refs: expected /TYPE/ID, got {text[:140]!r}", field="selector.refs"
            )
        refs.append(pb.EntityRef(type=type_, id=id_))
    message = api.SignalEntitiesRequest(
        selector=api.EntitySelector(
            type=body.string(selector, "type"),
            states=_parse_states(body.strings(selector, "states"), "selector.states"),
            refs=refs,
        )
    )
    _signal_fields(obj, message)
    return message


def _events(request: Request, query: Query, obj: body.JsonObject) -> Message:
    return api.ReadEventsRequest(
        ref=_ref(request),
        from_offset=query_int(query, "offset", MAX_UINT64),
        limit=query_int(query, "limit", MAX_UINT32),
    )


# -- responses: the gRPC response → the RFC's JSON --------------------------------------------------


def _events_page(_request: Any, m: Any) -> dict[str, Any]:
    return {
        "events": [event_json(e) for e in m.events],
        "next_offset": m.next_offset,
        "head_offset": m.head_offset,
        "end_of_stream": m.end_of_stream,
    }


def _entities_page(_request: Any, m: Any) -> dict[str, Any]:
    return {"entities": [entity_json(e) for e in m.entities], "next_page_token": m.next_page_token}


def _entity(_request: Any, m: Any) -> dict[str, Any]:
    return entity_json(m.entity)


def _signalled(_request: Any, m: Any) -> dict[str, Any]:
    return signal_json(m)


def _deleted(_request: Any, m: Any) -> dict[str, Any]:
    return signal_json(m.result)


def _signal_many_json(_request: Any, m: Any) -> dict[str, Any]:
    return signal_many_json(m)


def _workers(_request: Request, _query: Query, _obj: body.JsonObject) -> Message:
    return api.ListWorkersRequest()


def _workers_json(_request: Any, m: Any) -> dict[str, Any]:
    return {"workers": [worker_json(w) for w in m.workers]}


def _versions(request: Request, query: Query, _obj: body.JsonObject) -> Message:
    return api.ListVersionsRequest(type=_query_one(query, "type") or "")


def _versions_json(_request: Any, m: Any) -> dict[str, Any]:
    return {"types": [type_versions_json(t) for t in m.types]}


def _set_version(request: Request, query: Query, obj: body.JsonObject) -> Message:
    body.fields(obj, {"code_version", "ramp_version", "ramp_percent", "reason"})
    return api.SetVersionRequest(
        type=request.path_params["type"],
        code_version=body.string(obj, "code_version"),
        ramp_version=body.string(obj, "ramp_version"),
        ramp_percent=body.integer(obj, "ramp_percent", 100) or 0,
        reason=body.reason(obj),
    )


def _set_version_json(_request: Any, m: Any) -> dict[str, Any]:
    return type_versions_json(m.versions)


def _receipt(request: Any, m: Any) -> dict[str, Any]:
    return message_receipt_json(entity_url(request.ref.type, request.ref.id), m)


def _retried(request: Any, m: Any) -> dict[str, Any]:
    return _receipt(request, m) | {"retry_of": request.run, "from_step": m.from_step}


# -- the table --------------------------------------------------------------------------------------

DEPRECATED = {
    "Deprecation": "true",
    "Link": f'<{MIGRATION_DOC}>; rel="deprecation"; type="text/markdown"',
}
ONE = "/{type}/{id}"
# What every route that calls the service may answer besides its own: a refused token (401,
# 403), a bad query or body (400), the server draining or its store failing (503).
SERVICE_ERRORS = (400, 401, 403, 503)
WRITE_ERRORS = (*SERVICE_ERRORS, 409, 413, 415, 429)

_STATES = [s.value for s in State]
_PAGE = {"type": "integer", "minimum": 0, "maximum": MAX_PAGE}
_TYPE_FILTER = {"type": "string", "pattern": f"^({NAME_RE.pattern})?$"}
_OFFSET = Param(
    "offset",
    "the first offset to read (0, the default: the start)",
    {"type": "integer", "minimum": 0, "maximum": MAX_INT64},
)
_LIMIT = Param("limit", "at most this many events (0, the default: 100)", _PAGE)


def _service(
    method: str,
    path: str,
    operation: str,
    summary: str,
    call: Call,
    answer: Answer,
    errors: tuple[int, ...],
    **kw: Any,
) -> HttpRoute:
    return HttpRoute(
        method, path, operation, summary, (answer,), errors, entity_scope(call.method), call=call, **kw
    )


# fmt: off
ROUTES: tuple[HttpRoute, ...] = (
    HttpRoute(
        "GET", "/healthz", "healthz", "The process serves", (Answer(200, "alive", "Status"),), (),
        handler=handlers.healthz, aliased=False,
    ),
    HttpRoute(
        "GET", "/readyz", "readyz", "The store is writable and the server is not draining",
        (Answer(200, "ready", "Status"),), (503,), handler=handlers.readyz, aliased=False,
    ),
    HttpRoute(
        "GET", "/metrics", "metrics", "The server's metrics in Prometheus text format",
        (Answer(200, "docs/operations.md lists every metric", "Metrics", "text/plain"),), (401, 403),
        scope="read", handler=handlers.metrics, aliased=False,
    ),
    HttpRoute(
        "GET", "/openapi.json", "openapi", "This document",
        (Answer(200, "the OpenAPI 3.1 document of these routes", "OpenApi"),), (401, 403),
        scope="read", handler=handlers.openapi, aliased=False,
    ),
    _service(
        "GET", "/entities", "listEntities", "List entities (ListEntities)",
        Call(EntityService.ListEntities, _list, _entities_page, has_body=False),
        Answer(200, "a page of entities", "EntitiesPage", also=(("text/event-stream", "EntitiesSseEvent"),)),
        (*SERVICE_ERRORS, 429),
        query=(
            Param("type", "only entities of this type (empty: every type)", _TYPE_FILTER),
            Param("state", "only entities in these states (repeat it)", {"enum": _STATES}, repeated=True),
            Param(
                "page_size", "at most this many (0, the default: 100); with live=sse checked, and the "
                "snapshot sent whole", _PAGE,
            ),
            Param(
                "page_token", "an opaque token: the previous page's next_page_token (with live=sse "
                "checked, and the snapshot sent whole)",
                {"type": "string", "pattern": f"^({NAME_RE.pattern}/{NAME_RE.pattern})?$"},
            ),
            Param(
                "live", "sse: stream every entity's state changes as server-sent events",
                {"enum": ["sse"]}, handler=streams.watch_entities,
            ),
            Param(
                "timeout", f"with live=sse: end the response after this long, e.g. 30s (at most "
                f"{format_ms(waits.MAX_WAIT_MS)}; default: open until the server drains); without "
                "live, checked and unused", DURATION_SCHEMA,
            ),
        ),
        description="With live=sse the response is a text/event-stream: snapshot events, one "
        "snapshot-complete, then a change event per commit (docs/http.md, Live streams).",
    ),
    _service(
        "GET", "/workers", "listWorkers", "List the connected workers, on every replica (ListWorkers)",
        Call(EntityService.ListWorkers, _workers, _workers_json, has_body=False),
        Answer(200, "the connected workers, by worker id", "WorkersList"), SERVICE_ERRORS,
        aliased=False, alias="/_electric/workers",
    ),
    _service(
        "GET", "/_electric/versions", "listVersions",
        "List each entity type's code versions and the one new wakes get (ListVersions)",
        Call(EntityService.ListVersions, _versions, _versions_json, has_body=False),
        Answer(200, "the types, by name", "VersionsList"), SERVICE_ERRORS, aliased=False,
        query=(Param("type", "only this type (empty: every type)", _TYPE_FILTER),),
    ),
    _service(
        "PUT", "/_electric/versions/{type}", "setVersion",
        "Choose the code version new wakes of a type get, or ramp one (SetVersion; admin)",
        Call(EntityService.SetVersion, _set_version, _set_version_json),
        Answer(200, "the type's versions after the choice", "TypeVersions"), (*SERVICE_ERRORS, 404, 409),
        aliased=False, body="SetVersionRequest",
    ),
    _service(
        "POST", "/signal", "signalEntities", "Signal every entity a selector matches (SignalEntities)",
        Call(EntityService.SignalEntities, _signal_many, _signal_many_json),
        Answer(200, "how many were signalled, ignored, skipped, not found", "SignalManyResult"),
        WRITE_ERRORS, body="SignalManyRequest",
    ),
    _service(
        "PUT", ONE, "spawnEntity", "Spawn an entity (SpawnEntity)",
        Call(forking.created, _spawn, _entity, optional_body=True, name="SpawnEntity"),
        Answer(201, "the new entity", "Entity"), (*WRITE_ERRORS, 404), body="SpawnRequest", body_required=False,
        spawns=True,
        description="With the Durable Streams fork headers it is a fork (ForkEntity), as a Durable Streams "
        "create forks: Stream-Forked-From names the origin (/TYPE/ID or /TYPE/ID/stream, of the same "
        "type) and Stream-Fork-Offset an offset of its stream (its Stream-Next-Offset; default: its "
        "head); the new entity's stream holds the origin's events before it (docs/fork-and-retry.md).",
    ),
    _service(
        "GET", ONE, "getEntity", "Read an entity (GetEntity)",
        Call(EntityService.GetEntity, _get, _entity, has_body=False),
        Answer(200, "the entity", "Entity"), (*SERVICE_ERRORS, 404),
    ),
    _service(
        "DELETE", ONE, "deleteEntity", "SIGKILL with reason 'legacy delete' (DeleteEntity, deprecated)",
        Call(EntityService.DeleteEntity, _delete, _deleted, has_body=False),
        Answer(200, "the SIGKILL's result", "SignalResult", headers=("Deprecation", "Link")),
        (*WRITE_ERRORS, 404), headers=DEPRECATED, deprecated=True,
    ),
    _service(
        "POST", f"{ONE}/signal", "signalEntity", "Signal an entity (SignalEntity)",
        Call(EntityService.SignalEntity, _signal, _signalled),
        Answer(200, "the signal's result (with wait: and each of its stages)", "SignalResult"),
        (*WRITE_ERRORS, 404), body="SignalRequest",
        query=(
            Param(
                "wait",
                "a stage of the signal (docs/signals.md, stop receipts): answer once it, and each "
                "stage before it, is reached or cannot be; a stage the signal does not have is 400 "
                "STAGE_NOT_AVAILABLE and nothing is sent",
                {"enum": [stage.value for stage in Stage]}, handler=_SIGNAL_WAIT,
            ),
            Param(
                "timeout",
                f"with wait: how long to wait, e.g. 500ms or 30s (default and maximum "
                f"{format_ms(waits.MAX_WAIT_MS)}); the stages not reached by then say so and the "
                "signal stays sent; 0ms answers at once with what is reached. Without wait, checked "
                "and unused",
                DURATION_SCHEMA, handler=_SIGNAL_WAIT,
            ),
        ),
        description="With wait=STAGE the answer comes once that stage of the signal is settled (or the "
        "timeout passed): the result plus stages [{stage, reached, offset, at, detail}].",
    ),
    _service(
        "POST", f"{ONE}/messages", "sendMessage", "Send an entity a message (SendMessage)",
        Call(EntityService.SendMessage, waits.send_request, _receipt),
        Answer(200, "the message's receipt (with wait=run: and how its run ended)", "MessageReceipt"),
        (*WRITE_ERRORS, 404), body="MessageRequest",
        query=(
            Param(
                "wait", "run: answer once the run the message starts has ended, with its outcome",
                {"enum": list(WAIT_KINDS)}, handler=waits.send_and_wait,
            ),
            Param(
                "timeout",
                f"with wait: how long to wait, e.g. 500ms or 30s (default and maximum "
                f"{format_ms(waits.MAX_WAIT_MS)}: a longer one waits that long); then run.ended is "
                "false and the message stays delivered. Without wait, checked and unused",
                DURATION_SCHEMA, handler=waits.send_and_wait,
            ),
        ),
        description="With wait=run the answer comes once the message's run has ended (or the timeout "
        "passed): the receipt plus run {status, ended, output, error}. A wait cut off is resumed by "
        "the same request with the same Idempotency-Key.",
    ),
    _service(
        "POST", f"{ONE}/fork", "forkEntity", "Fork an entity into a new one, at an offset (ForkEntity)",
        Call(EntityService.ForkEntity, forking.fork, _entity),
        Answer(201, "the new entity", "Entity"), (*WRITE_ERRORS, 404), body="ForkRequest",
    ),
    _service(
        "POST", f"{ONE}/retry", "retryRun", "Run a failed or aborted run again, from a step (RetryRun)",
        Call(EntityService.RetryRun, forking.retry, _retried),
        Answer(200, "the retry's message receipt", "RetryReceipt"), (*WRITE_ERRORS, 404), body="RetryRequest",
    ),
    _service(
        "GET", f"{ONE}/events", "readEvents", "Read a page of an entity's stream (ReadEvents)",
        Call(EntityService.ReadEvents, _events, _events_page, has_body=False),
        Answer(200, "a page of events", "EventsPage"), (*SERVICE_ERRORS, 404), query=(_OFFSET, _LIMIT),
    ),
    HttpRoute(
        "GET", f"{ONE}/state", "readState", "Read an entity's durable state (ctx.state), as client.state does",
        (Answer(200, "its collections by name, rebuilt from the latest snapshot and the events after it",
                "State"),),
        (*SERVICE_ERRORS, 404), scope=entity_scope("ReadEvents"), handler=handlers.state,
    ),
    HttpRoute(
        "GET", f"{ONE}/stream", "readStream",
        "Read an entity's stream by the Durable Streams protocol (catch-up, long-poll, SSE)",
        (
            Answer(
                200, "the events after the offset, each a State Protocol change message", "StreamEvents",
                headers=("Stream-Next-Offset", "Stream-Up-To-Date", "Stream-Cursor", "ETag"),
                also=(("text/event-stream", "StreamSseEvent"),),
            ),
            Answer(
                204, "long-poll: nothing new before the timeout",
                headers=("Stream-Next-Offset", "Stream-Up-To-Date", "Stream-Cursor"),
            ),
            Answer(304, "catch-up: nothing new since the ETag given in If-None-Match", headers=("ETag",)),
        ),
        (*SERVICE_ERRORS, 404, 405, 409, 429), scope="read", handler=streams.read_stream,
        query=(
            Param(
                "offset", "an opaque token: a Stream-Next-Offset this server sent, -1 (the default) "
                "(or empty) for the start, now for the tail; one of another form is 400 INVALID_OFFSET, one "
                "past the stream's end 409 INVALID_OFFSET",
                {"type": "string", "pattern": f"^({streams.OFFSET_RE.pattern})?$"},
            ),
            Param("live", "wait for new events: long-poll or sse", {"enum": ["long-poll", "sse"]}),
            Param(
                "cursor", "an opaque token: the Stream-Cursor of the previous live response (any "
                "string is taken; it only keeps caches from replaying an empty answer)", {"type": "string"},
            ),
            Param(
                "timeout", f"how long a live read may hold, e.g. 5s: a long-poll answers 204 after it "
                f"(default and at most the server's long-poll, 20 s), an SSE response ends after it "
                f"as on a drain (at most {format_ms(waits.MAX_WAIT_MS)}; default: open until the "
                "stream closes or the server drains); without live, checked and unused", DURATION_SCHEMA,
            ),
        ),
        description="Writes (POST, PUT, DELETE) are refused with 405: an entity's stream changes "
        "only through the API.",
    ),
)
# fmt: on
# The handlers every door has (the live reads' are http/streams.py's, and a door may lack them).
_DOOR_HANDLERS: frozenset[Handler] = frozenset(
    {handlers.healthz, handlers.readyz, handlers.metrics, handlers.openapi, handlers.state}
)


def served_paths(route: HttpRoute) -> list[tuple[str, str]]:
    """(path, operationId) of the route, and of its alias under ``/_electric/entities``."""
    paths = [(route.path, route.operation)]
    if route.aliased:
        alias = PREFIX if route.path == "/entities" else f"{PREFIX}{route.path}"
        paths.append((alias, f"{route.operation}Electric"))
    if route.alias:
        paths.append((route.alias, f"{route.operation}Electric"))
    return paths
