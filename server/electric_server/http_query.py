"""What the HTTP door reads from a request's path and query string (the body is ``http_body``'s).

Names and states are only read here; what they may be is the service's ``validation``, as for
gRPC. A query field the route does not know is ``UNKNOWN_FIELD``, one given twice where one is
meant is ``INVALID_FIELD``: refused before the service is called, so nothing is written.
"""

from __future__ import annotations

from starlette.requests import Request

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.enums import STATE_TO_PB
from electric_sdk.lifecycle import State

from . import http_body as body
from .errors import invalid_argument


def ref(request: Request) -> pb.EntityRef:
    """The path's entity; ``.`` and ``..`` are no names over HTTP (clients resolve them away)."""
    type_, id_ = request.path_params["type"], request.path_params["id"]
    for field, value in (("ref.type", type_), ("ref.id", id_)):
        if value in {".", ".."}:
            raise invalid_argument("INVALID_NAME", f"{field} cannot be {value!r} over HTTP", field=field)
    return pb.EntityRef(type=type_, id=id_)


def parse_states(texts: list[str], field: str) -> list[pb.State.ValueType]:
    try:
        return [STATE_TO_PB[State.parse(t)] for t in texts]
    except ValueError as exc:
        raise invalid_argument("UNKNOWN_STATE", str(exc), field=field) from None


def query(request: Request, allowed: set[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for key, value in request.query_params.multi_items():
        found.setdefault(key, []).append(value)
    body.fields(found, allowed, "query ")
    return found


def query_one(query: dict[str, list[str]], field: str) -> str:
    values = query.get(field, [""])
    if len(values) > 1:
        raise invalid_argument("INVALID_FIELD", f"{field} may be given once", field=field)
    return values[0]
