"""What the HTTP door accepts as a request body: strict JSON, read within a limit.

A body is read chunk by chunk and refused as soon as it passes ``MAX_BODY_BYTES``
(``BODY_TOO_LARGE``, 413), whatever its ``Content-Length`` says. It must be
``application/json`` (``UNSUPPORTED_MEDIA_TYPE``, 415) and one JSON object;
``NaN``/``Infinity``, a key given twice, or nesting past ``MAX_BODY_DEPTH`` are
refused (``MALFORMED_REQUEST``, ``PAYLOAD_TOO_DEEP``), never guessed at. A
field the route does not know is ``UNKNOWN_FIELD``; a field of the wrong JSON
type is ``INVALID_FIELD``. Everything here is refused before the service is
called, so nothing is written. What a value means (a name, a signal, a payload's
size) is the service's ``validation``, as for gRPC: this module only reads JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import Receive

from electric_sdk._wire.json_values import MAX_JSON_DEPTH, json_to_value, nests_too_deep

from ..core.errors import ApiError, invalid_argument
from ..core.validation import MAX_REASON_BYTES, MAX_TEXT_BYTES

# gRPC's own limit on a request (app.py, grpc.max_receive_message_length).
MAX_BODY_BYTES = 4 * 1024 * 1024
# A JSON value may nest MAX_JSON_DEPTH deep; the body around it adds two levels at most
# (the body, a selector).
MAX_BODY_DEPTH = MAX_JSON_DEPTH + 2

# What a profile's milliseconds may be here: the wire's Duration holds it; the service says
# what a duration may be (INVALID_DURATION).
MAX_DURATION_FIELD_MS = 2**63 - 1

JsonObject = dict[str, Any]

# The service bounds a reason and a message's text in bytes of UTF-8; JSON Schema (the OpenAPI
# document) can bound a string only in characters. A character is at most 4 bytes, so at most a
# quarter as many characters is always within the bytes: the document says that, and the door
# holds callers to it (with the service's own reasons), so the two agree both ways.
MAX_REASON_CHARS = MAX_REASON_BYTES // 4
MAX_TEXT_CHARS = MAX_TEXT_BYTES // 4


def _no_constant(name: str) -> Any:
    raise invalid_argument("MALFORMED_REQUEST", f"the body is not JSON: {name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: JSON text, but no number a double holds
        raise invalid_argument("MALFORMED_REQUEST", f"the body's number {text[:40]} is out of range")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> JsonObject:
    obj: JsonObject = {}
    for key, value in pairs:
        if key in obj:
            raise invalid_argument("MALFORMED_REQUEST", f"the body gives the key {key[:100]!r} twice")
        obj[key] = value
    return obj


# One decoder for every body (json.loads with hooks builds a new one per call).
_DECODER = json.JSONDecoder(
    parse_constant=_no_constant, parse_float=_finite, object_pairs_hook=_no_duplicates
)


def is_number(text: str) -> bool:
    """ASCII digits, few enough to convert (``"²".isdigit()`` is true, and int() refuses both)."""
    return text.isascii() and text.isdigit() and len(text) <= 20


def too_large(size: int) -> ApiError:
    return invalid_argument(
        "BODY_TOO_LARGE",
        f"the body exceeds {MAX_BODY_BYTES} bytes (at least {size})",
        limit=str(MAX_BODY_BYTES),
    )


async def read_limited(receive: Receive, content_length: str | None) -> bytes:
    """The body, refused once it passes ``MAX_BODY_BYTES`` (before it is all read).

    Read from the ASGI messages as Starlette's ``Request.stream`` reads them (a disconnect is
    its ``ClientDisconnect``), without the async generator: a body is one message nearly always."""
    if content_length is not None and is_number(content_length) and int(content_length) > MAX_BODY_BYTES:
        raise too_large(int(content_length))
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        if message["type"] == "http.request":
            chunk: bytes = message.get("body", b"")
            more = message.get("more_body", False)
            if not more and not body and len(chunk) <= MAX_BODY_BYTES:
                return chunk  # the whole body in one message: no copy
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise too_large(len(body))
            if not more:
                return bytes(body)


def parse(body: bytes, content_type: str | None, *, required: bool = True) -> JsonObject:
    """One JSON object; an empty body is ``{}`` where the route needs no field."""
    if not body and not required:
        return {}
    media = (content_type or "").partition(";")[0].strip().lower()
    if media != "application/json":
        raise invalid_argument(
            "UNSUPPORTED_MEDIA_TYPE",
            f"the body must be application/json, not {media or 'unnamed'!r}",
            content_type=media,
        )
    try:
        text = body.decode("utf-8")
        obj = _DECODER.decode(text)
        if "\\u" in text:
            # A lone surrogate ("\ud800") is valid JSON text but no UTF-8 string: protobuf refuses
            # it. Only an escape makes one (UTF-8 text holds none), so without one there is none.
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeError as exc:
        raise invalid_argument("MALFORMED_REQUEST", f"the body is not UTF-8 text: {exc}") from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more digits than Python converts
        raise invalid_argument("MALFORMED_REQUEST", f"the body is not JSON: {exc}") from None
    except RecursionError:
        obj = None
        too_deep = True
    else:
        # Each level opens a bracket: with no more brackets than levels allowed, none is too deep.
        too_deep = body.count(b"{") + body.count(b"[") > MAX_BODY_DEPTH and nests_too_deep(
            obj, MAX_BODY_DEPTH
        )
    if too_deep:
        raise invalid_argument(
            "PAYLOAD_TOO_DEEP",
            f"the body nests deeper than {MAX_BODY_DEPTH} levels; JSON values nest at most {MAX_JSON_DEPTH}",
        )
    if not isinstance(obj, dict):
        raise invalid_argument("MALFORMED_REQUEST", "the body must be a JSON object")
    return obj


def fields(obj: Mapping[str, Any], allowed: set[str], where: str = "") -> None:
    """Refuse a field the route does not know (a typo must not be quietly ignored)."""
    if obj.keys() <= allowed:
        return
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise invalid_argument(
            "UNKNOWN_FIELD",
            f"unknown field {where}{unknown[0][:100]!r}; expected {', '.join(sorted(allowed))}",
            field=f"{where}{unknown[0][:100]}",
        )


def _wrong(field: str, expected: str) -> ApiError:
    return invalid_argument("INVALID_FIELD", f"{field} must be {expected}", field=field)


def string(obj: Mapping[str, Any], field: str, default: str = "") -> str:
    value = obj.get(field, default)
    if not isinstance(value, str):
        raise _wrong(field, "a string")
    return value


def reason(obj: Mapping[str, Any]) -> str:
    """``reason``: at most ``MAX_REASON_CHARS`` characters (REASON_TOO_LONG)."""
    value = string(obj, "reason")
    if len(value) > MAX_REASON_CHARS:
        raise invalid_argument(
            "REASON_TOO_LONG", f"reason exceeds {MAX_REASON_CHARS} characters over HTTP", field="reason"
        )
    return value


def text(obj: Mapping[str, Any]) -> str:
    """A message's ``text``: at most ``MAX_TEXT_CHARS`` characters (MESSAGE_TOO_LARGE)."""
    value = string(obj, "text")
    if len(value) > MAX_TEXT_CHARS:
        raise invalid_argument(
            "MESSAGE_TOO_LARGE", f"text exceeds {MAX_TEXT_CHARS} characters over HTTP", field="text"
        )
    return value


def boolean(obj: Mapping[str, Any], field: str) -> bool:
    value = obj.get(field, False)
    if not isinstance(value, bool):
        raise _wrong(field, "true or false")
    return value


def integer(obj: Mapping[str, Any], field: str, maximum: int) -> int | None:
    """A whole number from 0 to ``maximum`` (what the wire's field holds), or None when absent.

    ``5000.0`` is 5000: JSON has one number type, and JSON Schema's ``integer`` (the OpenAPI
    document's) takes any number without a fraction, as many encoders write them."""
    value = obj.get(field)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise _wrong(field, f"a whole number from 0 to {maximum}")
    return value


def mapping(obj: Mapping[str, Any], field: str) -> JsonObject:
    value = obj.get(field, {})
    if not isinstance(value, dict):
        raise _wrong(field, "an object")
    return value


def strings(obj: Mapping[str, Any], field: str) -> list[str]:
    value = obj.get(field, [])
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _wrong(field, "a string or a list of strings")
    return value


def json_value(obj: Mapping[str, Any], field: str) -> Any:
    """A JSON value as the wire's ``Value`` (its limits are the service's to check); not null,
    which would be a value that says "none" (leave the field out for none)."""
    if obj[field] is None:
        raise _wrong(field, "a JSON value other than null (leave it out for none)")
    try:
        return json_to_value(obj[field])
    except ValueError as exc:
        raise _wrong(field, f"a JSON value ({exc})") from None
