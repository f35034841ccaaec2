"""Input limits (ARCHITECTURE §7), checked before anything is written.

| what | limit |
|---|---|
| entity type, instance id | ``[A-Za-z0-9_.-]``, 1-128 characters |
| reason | at most 1 KiB (UTF-8) |
| SIGUSR payload, message data | any JSON value, at most 64 KiB encoded |
| message text | at most 64 KiB (UTF-8) |
| idempotency key | 1-128 printable ASCII characters |
| grace period, idle timeout | 1 ms to 24 h |
| page size, read limit | 1-1000 (0 means 100) |

Every violation is INVALID_ARGUMENT with a specific ErrorInfo reason.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable

from google.protobuf import json_format, struct_pb2

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.enums import PB_TO_SIGNAL, PB_TO_STATE
from electric_sdk.lifecycle import Signal, State

from .errors import invalid_argument
from .store.base import Ref

NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")
IDEMPOTENCY_KEY_RE = re.compile(r"[\x21-\x7e]{1,128}")
MAX_REASON_BYTES = 1024
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_TEXT_BYTES = 64 * 1024
MAX_DURATION_MS = 24 * 3600 * 1000
MAX_PAGE = 1000
DEFAULT_PAGE = 100


def name(value: str, field: str) -> str:
    if not NAME_RE.fullmatch(value):
        raise invalid_argument(
            "INVALID_NAME",
            f"{field} must be 1-128 characters of [A-Za-z0-9_.-], got {value[:140]!r}",
            field=field,
        )
    return value


def ref(message: pb.EntityRef, field: str = "ref") -> Ref:
    return (name(message.type, f"{field}.type"), name(message.id, f"{field}.id"))


def signal(value: int) -> Signal:
    found = PB_TO_SIGNAL.get(value)
    if found is None:
        raise invalid_argument("UNKNOWN_SIGNAL", f"unknown signal {value}", field="signal")
    return found


def state(value: int, field: str = "states") -> State:
    found = PB_TO_STATE.get(value)
    if found is None:
        raise invalid_argument("UNKNOWN_STATE", f"unknown state {value}", field=field)
    return found


def states(values: Iterable[int]) -> list[State]:
    return list(dict.fromkeys(state(v) for v in values))


def reason(value: str) -> str:
    if len(value.encode()) > MAX_REASON_BYTES:
        raise invalid_argument("REASON_TOO_LONG", f"reason exceeds {MAX_REASON_BYTES} bytes", field="reason")
    return value


def _is_json(value: struct_pb2.Value) -> bool:
    """Every node set, every number finite: JSON can encode it."""
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        return math.isfinite(value.number_value)
    if kind == "struct_value":
        return all(_is_json(v) for v in value.struct_value.fields.values())
    if kind == "list_value":
        return all(_is_json(v) for v in value.list_value.values)
    return kind is not None


# JSON is at most ~6x the protobuf encoding (a control character in a string
# becomes a 6-byte \u escape); below this the limit cannot be reached, so the
# exact size needs no JSON encoding on the hot path.
_SURELY_SMALL = MAX_PAYLOAD_BYTES // 8


def json_value(value: struct_pb2.Value, present: bool, field: str) -> struct_pb2.Value | None:
    """A JSON value within the size limit (compact UTF-8 JSON), or None when absent."""
    if not present:
        return None
    if not _is_json(value):
        raise invalid_argument(
            "INVALID_PAYLOAD", f"{field} is not a JSON value (empty, NaN or infinite)", field=field
        )
    if value.ByteSize() >= _SURELY_SMALL:
        # Compact UTF-8 JSON, as a client would send it ("é" is 2 bytes, not "\u00e9").
        encoded = json.dumps(json_format.MessageToDict(value), separators=(",", ":"), ensure_ascii=False)
        size = len(encoded.encode())
        if size > MAX_PAYLOAD_BYTES:
            raise invalid_argument(
                "PAYLOAD_TOO_LARGE",
                f"{field} is {size} bytes of JSON; the limit is {MAX_PAYLOAD_BYTES}",
                field=field,
            )
    return value


def text(value: str) -> str:
    if len(value.encode()) > MAX_TEXT_BYTES:
        raise invalid_argument("MESSAGE_TOO_LARGE", f"text exceeds {MAX_TEXT_BYTES} bytes", field="text")
    return value


def idempotency_key(value: str) -> str | None:
    if not value:
        return None
    if not IDEMPOTENCY_KEY_RE.fullmatch(value):
        raise invalid_argument(
            "INVALID_IDEMPOTENCY_KEY",
            "idempotency_key must be 1-128 printable ASCII characters",
            field="idempotency_key",
        )
    return value


def duration_ms(seconds: int, nanos: int, present: bool, default_ms: int, field: str) -> int:
    if not present:
        return default_ms
    ms = seconds * 1000 + nanos // 1_000_000
    if seconds < 0 or not 0 <= nanos < 1_000_000_000 or nanos % 1_000_000 or ms < 1 or ms > MAX_DURATION_MS:
        raise invalid_argument(
            "INVALID_DURATION", f"{field} must be whole milliseconds between 1 ms and 24 h", field=field
        )
    return ms


def page_size(value: int, field: str = "page_size") -> int:
    if value > MAX_PAGE:
        raise invalid_argument("PAGE_TOO_LARGE", f"{field} must be at most {MAX_PAGE}", field=field)
    return value or DEFAULT_PAGE
