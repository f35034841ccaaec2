"""What the HTTP door reads from a request's path and query string (the body is ``http/body.py``'s).

Names and states are only read here; what they may be is the service's ``validation``, as for
gRPC. A query field given twice where one is meant is ``INVALID_FIELD``, refused before the
service is called, so nothing is written. The route table's builders (``http/routes.py``) and the
live reads (``http/streams.py``) both read requests with these.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.enums import STATE_TO_PB
from electric_sdk.durations import parse_ms
from electric_sdk.lifecycle import State

from ..core.errors import invalid_argument
from ..core.validation import NAME_RE, page_size
from . import body

Query = dict[str, list[str]]

# A duration in a query (``timeout=``): what the OpenAPI document's pattern says, exactly, so a
# value the document allows is one the door takes and the reverse (parse_ms reads more spellings,
# " 10S " among them, which JSON Schema's pattern would have to guess at).
DURATION_RE = re.compile(r"([0-9]{1,9}(\.[0-9]{1,3})?(ms|s|m|h)){1,4}|[0-9]{1,9}(\.[0-9]{1,3})?")
DURATION_SCHEMA: dict[str, Any] = {"type": "string", "pattern": f"^({DURATION_RE.pattern})$"}


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


def query_int(query: Query, name: str, maximum: int) -> int:
    """A whole number from 0 to ``maximum``; 0 when absent."""
    values = query.get(name)
    if not values:
        return 0
    if len(values) > 1 or not body.is_number(values[-1]) or int(values[-1]) > maximum:
        raise invalid_argument(
            "INVALID_FIELD", f"{name} must be one whole number from 0 to {maximum}", field=name
        )
    return int(values[-1])


def query_duration(query: Query, name: str, maximum_ms: int) -> int | None:
    """A duration in milliseconds, at most ``maximum_ms`` (a longer one is the maximum: the
    document can say "at most" only so); None when absent."""
    if name not in query:
        return None
    text = query_one(query, name)
    if not DURATION_RE.fullmatch(text):
        raise invalid_argument(
            "INVALID_DURATION",
            f"{name} must be a duration such as 500ms, 30s, 2m, 1h or 1m30s, got {text[:40]!r}",
            field=name,
        )
    return min(parse_ms(text), maximum_ms)


def page_form(query: Query) -> None:
    """Refuse a page_size or page_token a list would refuse for its form (the live form of
    ``GET /entities``, which pages nothing, takes them as the list does; the list's own check
    is the service's, ``ListEntities``, which this one follows)."""
    page_size(query_int(query, "page_size", 2**32 - 1))
    token = query_one(query, "page_token")
    type_, _, id_ = token.partition("/")
    if token and not (NAME_RE.fullmatch(type_) and NAME_RE.fullmatch(id_)):
        raise invalid_argument(
            "INVALID_PAGE_TOKEN", "page_token is not one this server issued", field="page_token"
        )
