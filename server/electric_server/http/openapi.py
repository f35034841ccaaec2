"""The OpenAPI 3.1 document of the HTTP door, generated from its one route table.

``document()`` reads ``routes.ROUTES`` (every route, its aliases under
``/_electric/entities``, its query, body, answers and error statuses) and the
schemas below, which say what the one renderer (``_wire.rendering``) writes (the
event streams event by event), and ``http/request_schemas.py``'s, what the door
accepts; enumerations are read from ``lifecycle`` and the
wire's enums, never copied. The door serves it at ``GET /openapi.json``;
``docs/openapi.json`` is the same document, and a test fails when they differ.
Regenerate it with ``make openapi`` (``scripts/genopenapi.py``).
"""

from __future__ import annotations

import json
from importlib.metadata import version

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._wire.enums import OPERATION_NAMES
from electric_sdk._wire.run_outcome import RUN_ENDS
from electric_sdk.busy import BusyPolicy
from electric_sdk.lifecycle import (
    Outcome,
    Signal,
    Stage,
    State,
)

from ..core.errors import HTTP_STATUS
from .request_schemas import NEW_TYPE, PATH_NAME, PATH_TYPE, Schema, obj, request_schemas
from .routes import ROUTES, HttpRoute, served_paths

# The error codes (gRPC ErrorInfo reasons) each HTTP status carries; errors.HTTP_STATUS maps
# the gRPC status and reason to the HTTP status, docs/http.md tabulates both (a test holds the
# three together).
ERROR_CODES: dict[int, tuple[str, ...]] = {
    400: (
        "MALFORMED_REQUEST", "PAYLOAD_TOO_DEEP", "UNKNOWN_FIELD", "INVALID_FIELD", "INVALID_NAME",
        "RESERVED_NAME", "UNKNOWN_SIGNAL", "UNKNOWN_STATE", "INVALID_PAYLOAD", "PAYLOAD_NOT_ALLOWED",
        "EMPTY_MESSAGE", "INVALID_DURATION", "INVALID_IDEMPOTENCY_KEY", "IDEMPOTENCY_KEY_REUSED",
        "INVALID_SELECTOR", "PAGE_TOO_LARGE", "INVALID_PAGE_TOKEN", "VALUE_OUT_OF_RANGE",
        "REASON_TOO_LONG", "MESSAGE_KEY_NOT_ALLOWED", "CORS_REFUSED", "INVALID_OFFSET",
        "INVALID_FORK_ORIGIN", "INVALID_STEP", "INTERRUPT_NOT_ALLOWED", "UNKNOWN_WAIT",
        "INVALID_CODE_VERSION", "INVALID_RAMP", "INVALID_BUSY_POLICY",
    ),
    401: ("UNAUTHENTICATED", "DUPLICATE_AUTHORIZATION"),
    403: ("MISSING_SCOPE", "TYPE_NOT_ALLOWED"),
    404: ("ENTITY_NOT_FOUND", "ROUTE_NOT_FOUND", "RUN_NOT_FOUND", "TYPE_NOT_ANNOUNCED"),
    405: ("METHOD_NOT_ALLOWED",),
    409: (
        "ENTITY_EXISTS", "INVALID_SIGNAL", "ENTITY_TERMINAL", "INVALID_TRANSITION", "RUN_NOT_RETRYABLE",
        "INVALID_OFFSET", "INVALID_STEP", "VERSION_NOT_ANNOUNCED", "ENTITY_BUSY", "BUSY_POLICY_NOT_ALLOWED",
    ),
    413: ("BODY_TOO_LARGE", "PAYLOAD_TOO_LARGE", "MESSAGE_TOO_LARGE"),
    415: ("UNSUPPORTED_MEDIA_TYPE",),
    429: ("TOO_MANY_STREAMS",),
    500: ("DATA_DAMAGED", "INTERNAL"),
    503: ("SERVER_DRAINING", "DISK_FULL", "STORAGE_FAILED", "STORAGE_BUSY", "DATABASE_UNAVAILABLE"),
    504: (),
}  # fmt: skip
ERROR_MEANINGS = {
    400: "the request is invalid; nothing was written",
    401: "no bearer token, or an unknown one (with WWW-Authenticate: Bearer)",
    403: "the token lacks the route's scope, or may not touch this type",
    404: "no such entity, or no such route",
    405: "the path has no such method",
    409: "the entity's state refuses the call (or it exists already, or an offset or step is past its end)",
    413: "the body, a payload or a message is too large",
    415: "the body is not application/json",
    429: "a cap on what one principal may hold open is reached",
    500: "the server's data is damaged, or a bug (logged with its traceback)",
    503: "the server is draining or its store cannot write; retry elsewhere or later",
    504: "the call's deadline passed",
}


def _ref(kind: str, name: str) -> Schema:
    return {"$ref": f"#/components/{kind}/{name}"}


def _nullable_enum(values: list[str]) -> Schema:
    return {"enum": [*values, None]}


def _schemas() -> dict[str, Schema]:
    states = [s.value for s in State]
    signals = [s.value for s in Signal]
    txid = {"type": "string", "pattern": "^[0-9]+$", "description": "a string: JSON numbers lose 64 bits"}
    instant = {"type": "string", "format": "date-time"}
    epoch_ms = {"type": "integer", "description": "epoch milliseconds, as the RFC writes created_at"}
    count = {"type": "integer", "minimum": 0}
    offset = {"type": "string", "pattern": "^[0-9]{20}$", "description": "an opaque token"}
    event_props = {
        "type": {"type": "string"},
        "key": {"type": "string"},
        "value": {"type": "object"},
        "headers": obj(
            ["operation", "timestamp", "txid"],
            {
                "operation": {"enum": [*sorted(set(OPERATION_NAMES.values())), "unspecified"]},
                "timestamp": instant,
                "txid": txid,
            },
        ),
    }
    return {
        "Error": obj(
            ["error"],
            {
                "error": obj(
                    ["code", "message", "details"],
                    {
                        "code": {"type": "string", "description": "the gRPC ErrorInfo reason"},
                        "message": {"type": "string"},
                        "details": {"type": "object", "additionalProperties": {"type": "string"}},
                    },
                )
            },
        ),
        "Status": obj(["status"], {"status": {"enum": ["alive", "ready"]}}),
        "Metrics": {"type": "string", "description": "Prometheus text format"},
        "OpenApi": {"type": "object"},
        "Entity": obj(
            [
                "url",
                "type",
                "id",
                "state",
                "profile",
                "created_at",
                "updated_at",
                "head_offset",
                "closed",
                "stopping_deadline",
                "txid",
                "holder",
                "bound_code_version",
                "waiting_since",
                "parent",
                "awaiting_input",
            ],
            {
                "url": {"type": "string"},
                "type": {"type": "string"},
                "id": {"type": "string"},
                "state": _nullable_enum(states),
                "profile": obj(
                    ["grace_period_ms", "idle_timeout_ms", "pending"],
                    {
                        "grace_period_ms": {"type": ["integer", "null"]},
                        "idle_timeout_ms": {"type": ["integer", "null"]},
                        "pending": {"type": "array", "items": {"enum": ["grace_period", "idle_timeout"]}},
                    },
                ),
                "created_at": instant,
                "updated_at": instant,
                "head_offset": count,
                "closed": {"type": "boolean"},
                "stopping_deadline": {"type": ["string", "null"], "format": "date-time"},
                "txid": txid,
                "bound_code_version": {
                    "type": ["string", "null"],
                    "description": "the code version its run in flight is bound to (it started on it)",
                },
                "waiting_since": {
                    "type": ["string", "null"],
                    "format": "date-time",
                    "description": "since when that run waits for a worker of its version (no lease)",
                },
                "parent": {
                    "type": ["string", "null"],
                    "description": "the entity it was spawned as a child of (/{type}/{id}); null for a root",
                },
                "awaiting_input": {
                    "description": "its last run asked for input (ctx.ask): that run's message key and "
                    "question; the next message sent is the reply. null: nothing is asked",
                    "anyOf": [
                        obj(["run", "question"], {"run": {"type": "string"}, "question": {"type": "string"}}),
                        {"type": "null"},
                    ],
                },
                "holder": {
                    "description": "the worker holding the entity's lease while it is live (GetEntity, "
                    "ListEntities); null when none does, and in a watch's changes",
                    "anyOf": [
                        obj(
                            ["worker_id", "session", "replica", "epoch"],
                            {
                                "worker_id": {"type": "string"},
                                "session": {"type": "string", "description": "the worker session"},
                                "replica": {"type": "string", "description": "the replica it is on"},
                                "epoch": {"type": "integer", "minimum": 0, "description": "the lease's"},
                            },
                        ),
                        {"type": "null"},
                    ],
                },
            },
        ),
        "EntitiesPage": obj(
            ["entities", "next_page_token"],
            {
                "entities": {"type": "array", "items": _ref("schemas", "Entity")},
                "next_page_token": {"type": "string", "description": "empty on the last page"},
            },
        ),
        "Worker": obj(
            ["worker_id", "replica", "types", "code_version", "capacity", "leases_held", "last_heartbeat"],
            {
                "worker_id": {"type": "string"},
                "replica": {"type": "string", "description": "the server replica its session is on"},
                "types": {"type": "array", "items": {"type": "string"}},
                "code_version": {"type": "string"},
                "capacity": {"type": "integer", "minimum": 0},
                "leases_held": {"type": "integer", "minimum": 0},
                "last_heartbeat": instant,
            },
        ),
        "WorkersList": obj(["workers"], {"workers": {"type": "array", "items": _ref("schemas", "Worker")}}),
        "CodeVersion": obj(
            [
                "code_version",
                "workers",
                "runs_in_flight",
                "runs_waiting",
                "versioning",
                "upgrade_after_ms",
                "announced_seq",
            ],
            {
                "code_version": {"type": "string"},
                "workers": {"type": "array", "items": {"type": "string"}},
                "runs_in_flight": count,
                "runs_waiting": count,
                "versioning": {"enum": ["", "pinned", "auto_upgrade"]},
                "upgrade_after_ms": {"type": ["integer", "null"], "minimum": 0},
                "announced_seq": count,
            },
        ),
        "TypeVersions": obj(
            ["type", "versions", "selected", "current", "ramp_version", "ramp_percent"],
            {
                "type": {"type": "string"},
                "versions": {"type": "array", "items": _ref("schemas", "CodeVersion")},
                "selected": {"type": "string", "description": "an operator's choice; empty: the newest"},
                "current": {"type": "string", "description": "the version new wakes get now"},
                "ramp_version": {"type": "string"},
                "ramp_percent": {"type": "integer", "minimum": 0, "maximum": 100},
            },
        ),
        "VersionsList": obj(
            ["types"], {"types": {"type": "array", "items": _ref("schemas", "TypeVersions")}}
        ),
        "SignalResult": obj(
            ["url", "signal", "previous_state", "new_state", "created_at", "txid", "key", "outcome"],
            {
                "url": {"type": "string"},
                "signal": {"enum": signals},
                "previous_state": _nullable_enum(states),
                "new_state": _nullable_enum(states),
                "created_at": epoch_ms,
                "txid": txid,
                "key": {"type": "string"},
                "outcome": _nullable_enum([o.value for o in Outcome]),
                "stages": {
                    "type": "array",
                    "items": _ref("schemas", "StageReport"),
                    "description": "with wait: each stage the signal has, reached or not",
                },
            },
        ),
        "StageReport": obj(
            ["stage", "reached", "offset", "at", "detail"],
            {
                "stage": {"enum": [stage.value for stage in Stage]},
                "reached": {"type": "boolean"},
                "offset": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "description": "the record that shows it",
                },
                "at": {"type": ["string", "null"], "description": "that record's time, RFC 3339"},
                "detail": {"type": "string", "description": "why not reached; or a note on how it was"},
            },
        ),
        "SignalManyResult": obj(
            ["signalled", "ignored", "skipped", "not_found", "created_at"],
            {
                "signalled": count,
                "ignored": count,
                "skipped": count,
                "not_found": count,
                "created_at": epoch_ms,
            },
        ),
        "MessageReceipt": obj(
            ["url", "key", "offset", "txid", "created_at", "state"],
            {
                "url": {"type": "string"},
                "key": {"type": "string"},
                "offset": count,
                "txid": txid,
                "created_at": epoch_ms,
                "state": _nullable_enum(states),
                "policy": {
                    "enum": [p.value for p in BusyPolicy],
                    "description": "the double-texting policy applied",
                },
                "signal_key": {
                    "type": "string",
                    "description": "interrupt, rollback: the SIGINT it appended",
                },
                "run": {"$ref": "#/components/schemas/RunOutcome"},
            },
        ),
        "RunOutcome": {
            **obj(
                ["message_key", "status", "ended", "started", "attempt", "output", "error", "entity_state"],
                {
                    "message_key": {"type": "string"},
                    "status": {"enum": ["queued", "started", *RUN_ENDS]},
                    "ended": {"type": "boolean"},
                    "started": {"type": "boolean"},
                    "attempt": count,
                    "output": {"type": ["string", "null"]},
                    "error": {"type": ["string", "null"]},
                    "entity_state": _nullable_enum(states),
                },
            ),
            "description": "with wait=run: how the message's run ended (ended false: the timeout "
            "passed first, and the message stays delivered)",
        },
        "RetryReceipt": {
            **obj(
                ["url", "key", "offset", "txid", "created_at", "state", "retry_of", "from_step"],
                {
                    "url": {"type": "string"},
                    "key": {"type": "string"},
                    "offset": count,
                    "txid": txid,
                    "created_at": epoch_ms,
                    "state": _nullable_enum(states),
                    "retry_of": {"type": "string", "description": "the retried run's message key"},
                    "from_step": count,
                },
            ),
            "description": "the retry's message: its key is the new run's",
        },
        "Event": obj([*event_props, "offset"], {**event_props, "offset": count}),
        "EventsPage": obj(
            ["events", "next_offset", "head_offset", "end_of_stream"],
            {
                "events": {"type": "array", "items": _ref("schemas", "Event")},
                "next_offset": count,
                "head_offset": count,
                "end_of_stream": {"type": "boolean"},
            },
        ),
        "State": {
            "type": "object",
            "additionalProperties": {"type": ["array", "object"]},
            "description": "ctx.state: each collection by name, a list or a keyed map of JSON values",
        },
        "StreamEvent": {**obj(list(event_props), event_props), "description": "a State Protocol change"},
        "StreamEvents": {"type": "array", "items": _ref("schemas", "StreamEvent")},
        "StreamSseEvent": _sse_events(
            "one event of the stream's text/event-stream (live=sse): data events, each followed by "
            "a control event; comment lines (: heartbeat) are no events",
            data=_ref("schemas", "StreamEvents"),
            control={
                **obj(
                    ["streamNextOffset"],
                    {
                        "streamNextOffset": offset,
                        "streamCursor": {"type": "string"},
                        "upToDate": {"const": True},
                        "streamClosed": {"const": True},
                    },
                ),
                "description": "where the reader is: its next offset (also the SSE id), the "
                "cursor, whether it is up to date or the stream closed (the last event then)",
            },
        ),
        "EntityChange": obj(
            ["entity", "previous_state", "changed_at"],
            {
                "entity": _ref("schemas", "Entity"),
                "previous_state": _nullable_enum(states),
                "changed_at": instant,
            },
        ),
        "EntitiesSseEvent": _sse_events(
            "one event of GET /entities?live=sse: snapshot events, one snapshot-complete, then "
            "a change event per commit; comment lines (: heartbeat) are no events",
            snapshot={"type": "array", "items": _ref("schemas", "Entity")},
            **{"snapshot-complete": obj(["txid"], {"txid": txid})},
            change={"type": "array", "items": _ref("schemas", "EntityChange")},
        ),
        **request_schemas(),
    }


def _sse_events(description: str, **events: Schema) -> Schema:
    """One server-sent event, as OpenAPI 3.1 describes a text/event-stream (each event an object
    of its fields): an event named as in ``events``, its ``data`` JSON of that schema."""
    return {
        "oneOf": [
            obj(
                ["event", "data"],
                {
                    "event": {"const": name},
                    "data": {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": schema,
                    },
                    "id": {"type": "string"},
                },
            )
            for name, schema in events.items()
        ],
        "description": description,
    }


HEADERS: dict[str, Schema] = {
    "Stream-Next-Offset": {"description": "the offset to read from next", "schema": {"type": "string"}},
    "Stream-Up-To-Date": {
        "description": "present when the read reached the head",
        "schema": {"type": "string"},
    },
    "Stream-Cursor": {
        "description": "live reads: send it back as cursor on the next one",
        "schema": {"type": "string"},
    },
    "ETag": {"description": "names this catch-up response (If-None-Match)", "schema": {"type": "string"}},
    "Deprecation": {"description": "true: DELETE is deprecated", "schema": {"type": "string"}},
    "Link": {"description": "the migration doc, rel=deprecation", "schema": {"type": "string"}},
}


def _takes_idempotency_key(method: str) -> bool:
    """Whether the EntityService method's request has an ``idempotency_key`` (SetVersion, a
    choice that is the same when made twice, has none)."""
    request = api.DESCRIPTOR.services_by_name["EntityService"].methods_by_name[method].input_type
    return "idempotency_key" in request.fields_by_name


def _operation(route: HttpRoute, operation_id: str) -> Schema:
    op: Schema = {"operationId": operation_id, "summary": route.summary}
    if route.description:
        op["description"] = route.description
    if route.deprecated:
        op["deprecated"] = True
    params: list[Schema] = []
    if "{type}" in route.path:
        params.append(_ref("parameters", "newType" if route.spawns else "type"))
    if "{id}" in route.path:
        params.append(_ref("parameters", "id"))
    if route.call is not None and route.method != "GET" and _takes_idempotency_key(route.call.method):
        params.append(_ref("parameters", "idempotencyKey"))
    for p in route.query:
        schema = {"type": "array", "items": dict(p.schema)} if p.repeated else dict(p.schema)
        params.append({"name": p.name, "in": "query", "description": p.description, "schema": schema})
    if params:
        op["parameters"] = params
    if route.body:
        op["requestBody"] = {
            "required": route.body_required,
            "content": {"application/json": {"schema": _ref("schemas", route.body)}},
        }
    responses: Schema = {}
    for answer in route.answers:
        out: Schema = {"description": answer.description}
        content = ([(answer.media, answer.schema)] if answer.schema else []) + list(answer.also)
        if content:
            out["content"] = {media: {"schema": _ref("schemas", name)} for media, name in content}
        headers = {**{n: _ref("headers", n) for n in answer.headers}}
        if headers:
            out["headers"] = headers
        responses[str(answer.status)] = out
    for status in sorted(route.errors):
        responses[str(status)] = _ref("responses", f"Error{status}")
    op["responses"] = responses
    if route.scope is not None:  # with --tokens; without them every caller is let in
        op["security"] = [{"bearer": [route.scope]}, {}]
    return op


def _error_response(status: int) -> Schema:
    codes = ", ".join(ERROR_CODES[status])
    return {
        "description": f"{ERROR_MEANINGS[status]}: {codes}",
        "content": {"application/json": {"schema": _ref("schemas", "Error")}},
    }


def document() -> Schema:
    """The OpenAPI 3.1 document of every route in ``routes.ROUTES``."""

    paths: dict[str, Schema] = {}
    for route in ROUTES:
        for path, operation_id in served_paths(route):
            paths.setdefault(path, {})[route.method.lower()] = _operation(route, operation_id)

    def path_name(name: str, pattern: str, description: str) -> Schema:
        schema = {"type": "string", "pattern": f"^{pattern}$"}
        return {"name": name, "in": "path", "required": True, "schema": schema, "description": description}

    statuses = sorted({status for (_code, _reason), status in HTTP_STATUS.items()} & set(ERROR_CODES))
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "electric",
            "version": version("electric-sdk"),
            "description": "The HTTP/JSON door of the electric server (docs/http.md). Every error is "
            '{"error": {"code", "message", "details"}}: code is the gRPC ErrorInfo reason, details '
            "its metadata. Every route under /{type}/{id}, /entities and /signal is also served "
            "under /_electric/entities.",
        },
        "paths": paths,
        "components": {
            "schemas": _schemas(),
            "parameters": {
                "type": path_name("type", PATH_TYPE, "the entity's type"),
                "newType": path_name("type", NEW_TYPE, "the new entity's type (not starting with _ or .)"),
                "id": path_name("id", PATH_NAME, "the entity's id"),
                "idempotencyKey": {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string", "pattern": "^[!-~]{1,128}$"},
                    "description": "a retry with the same key returns the first response and "
                    "writes nothing (through either door)",
                },
            },
            "headers": HEADERS,
            "responses": {f"Error{status}": _error_response(status) for status in statuses},
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "electric server --tokens"}
            },
        },
    }


def error_table() -> str:
    """docs/http.md's error table: each HTTP status, the gRPC statuses mapped to it, its codes."""
    lines = ["| HTTP | gRPC status | codes | meaning |", "|---|---|---|---|"]
    for status, codes in ERROR_CODES.items():
        grpc_codes = sorted({code.name for (code, _reason), http in HTTP_STATUS.items() if http == status})
        lines.append(
            f"| {status} | {', '.join(f'`{c}`' for c in grpc_codes)} | "
            f"{', '.join(f'`{c}`' for c in codes) or '—'} | {ERROR_MEANINGS[status]} |"
        )
    return "\n".join(lines) + "\n"


def render() -> str:
    return json.dumps(document(), indent=2, ensure_ascii=False) + "\n"
