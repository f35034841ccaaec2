"""Fork and retry over HTTP: the requests the routes (``http/routes.py``) build for them.

A fork is a create, as the Durable Streams protocol has it (``PROTOCOL.md`` of
durable-streams/durable-streams): ``PUT /{type}/{new_id}`` with
``Stream-Forked-From`` (the origin's path, ``/{type}/{id}`` or its stream's
``/{type}/{id}/stream``, under ``/_electric/entities`` too, or a full URL of
one) and optionally ``Stream-Fork-Offset`` (an offset of the origin's stream,
as ``Stream-Next-Offset`` gives it, or a whole number; absent: its head). A
fork keeps its origin's type. ``POST /{type}/{id}/fork`` and
``POST /{type}/{id}/retry`` are the JSON forms. Every check beyond the shape
of a header is the service's (core/forks.py).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from google.protobuf.message import Message
from starlette.requests import Request

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import types_pb2 as pb

from ..core.errors import invalid_argument
from ..core.service import EntityService
from ..core.validation import MAX_INT64
from . import body
from .query import Query
from .query import ref as _ref

__all__ = ["FORKED_FROM", "FORK_OFFSET", "create", "fork", "forks", "retry"]

FORKED_FROM = "stream-forked-from"
FORK_OFFSET = "stream-fork-offset"
_PREFIX = "/_electric/entities"


def forks(request: Request) -> bool:
    """Whether a PUT is a fork: it names its origin."""
    return FORKED_FROM in request.headers


def _origin(text: str, type_: str) -> pb.EntityRef:
    path = urlsplit(text).path if "://" in text else text
    path = path.removeprefix(_PREFIX).removesuffix("/stream")
    parts = [unquote(p) for p in path.split("/")]
    if len(parts) != 3 or parts[0] or not parts[1] or not parts[2]:
        raise invalid_argument(
            "INVALID_FORK_ORIGIN",
            f"Stream-Forked-From must be an entity's path, /TYPE/ID or /TYPE/ID/stream; got {text[:140]!r}",
            field="Stream-Forked-From",
        )
    if parts[1] != type_:
        raise invalid_argument(
            "INVALID_FORK_ORIGIN",
            f"a fork keeps its origin's type: /{type_}/… cannot fork /{parts[1]}/{parts[2]}",
            field="Stream-Forked-From",
        )
    return pb.EntityRef(type=parts[1], id=parts[2])


def _offset(text: str) -> int:
    if not body.is_number(text) or int(text) > MAX_INT64:
        raise invalid_argument(
            "INVALID_OFFSET",
            "Stream-Fork-Offset must be an offset of the origin's stream (its Stream-Next-Offset) or a "
            f"whole number from 0 to its head; got {text[:40]!r}",
            field="Stream-Fork-Offset",
        )
    return int(text)


def create(request: Request, spawn: api.SpawnEntityRequest) -> Message:
    """``spawn`` (the PUT's spawn request), or the fork its headers ask for (with no reason: the
    JSON form, ``POST /{type}/{id}/fork``, carries one)."""
    if not forks(request):
        return spawn
    if spawn.HasField("profile"):
        raise invalid_argument(
            "UNKNOWN_FIELD",
            "a fork takes its origin's profile: no profile with Stream-Forked-From",
            field="profile",
        )
    message = api.ForkEntityRequest(
        origin=_origin(request.headers[FORKED_FROM], spawn.ref.type),
        id=spawn.ref.id,
    )
    if (offset := request.headers.get(FORK_OFFSET)) is not None:
        message.offset = _offset(offset)
    return message


async def created(service: EntityService, request: Any, context: Any) -> Any:
    """A PUT: a spawn, or a fork."""
    if isinstance(request, api.ForkEntityRequest):
        return await service.ForkEntity(request, context)
    return await service.SpawnEntity(request, context)


def fork(request: Request, query: Query, obj: body.JsonObject) -> Message:
    body.fields(obj, {"id", "offset", "reason"})
    message = api.ForkEntityRequest(origin=_ref(request), id=body.string(obj, "id"), reason=body.reason(obj))
    offset = body.integer(obj, "offset", MAX_INT64)
    if offset is not None:
        message.offset = offset
    return message


def retry(request: Request, query: Query, obj: body.JsonObject) -> Message:
    body.fields(obj, {"run", "from_step", "reason"})
    return api.RetryRunRequest(
        ref=_ref(request),
        run=body.string(obj, "run"),
        from_step=body.integer(obj, "from_step", MAX_INT64) or 0,
        reason=body.reason(obj),
    )
