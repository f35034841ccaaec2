"""What the HTTP door reads from a request's path and query string (the body is ``http/body.py``'s).

Names and states are only read here; what they may be is the service's ``validation``, as for
gRPC. A query field given twice where one is meant is ``INVALID_FIELD``, refused before the
service is called, so nothing is written. The route table's builders (``http/routes.py``) and the
live reads (``http/streams.py``) both read requests with these.
"""

from __future__ import annotations

from starlette.requests import Request

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.enums import STATE_TO_PB
from electric_sdk.lifecycle import State

from ..core.errors import invalid_argument

Query = dict[str, list[str]]


def ref(request: Request) -> pb.EntityRef:
    """The path's entity; ``.`` and ``..`` are no names over HTTP (clients resolve them away)."""
    type_, id_ = request.path_params["type"], request.path_params["id"]
    for name, value in (("ref.type", type_), ("ref.id", id_)):
        if value in {".", ".."}:
            raise invalid_argument("INVALID_NAME", f"{name} cannot be {value!r} over HTTP", field=name)
    return pb.EntityRef(type=type_, id=id_)


def parse_states(texts: list[str], name: str) -> list[pb.State.ValueType]:
    try:
        return [STATE_TO_PB[State.parse(t)] for t in texts]
    except ValueError as exc:
        raise invalid_argument("UNKNOWN_STATE", str(exc), field=name) from None


def query_one(query: Query, name: str) -> str:
    values = query.get(name, [""])
    if len(values) > 1:
        raise invalid_argument("INVALID_FIELD", f"{name} may be given once", field=name)
    return values[0]
