"""Input limits (ARCHITECTURE §7), checked before anything is written.

| what | limit |
|---|---|
| entity type, instance id | ``[A-Za-z0-9_.-]``, 1-128 characters |
| reason | at most 1 KiB (UTF-8) |
| SIGUSR payload, message data | any JSON value, at most 64 KiB encoded, 32 levels deep |
| a runtime's custom event data | any JSON value, 32 levels deep |
| message text | at most 64 KiB (UTF-8) |
| idempotency key | 1-128 printable ASCII characters |
| a worker's code version | at most 128 characters, no control character |
| a custom event's type | 1-128 characters, no control character, not a built-in type |
| the entity types one worker hosts | at most 1,000 |
| grace period, idle timeout | 1 ms to 24 h |
| page size, read limit | 1-1000 (0 means 100) |
| offsets, lease epochs | 0 to 2^63-1 (SQLite's integers are signed 64-bit) |

Every violation is INVALID_ARGUMENT with a specific ErrorInfo reason. The
other integer fields of the requests are safe at any value of their wire type
(a worker's capacity, request ids, run attempts, an exec receipt's numbers).
"""

from __future__ import annotations

import collections
import json
import math
import re
from collections.abc import Iterable

from google.protobuf import json_format, struct_pb2

from electric_sdk import busy
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.enums import PB_TO_SIGNAL, PB_TO_STATE
from electric_sdk._wire.json_values import MAX_JSON_DEPTH
from electric_sdk.event_types import MAX_LABEL_CHARS, is_label
from electric_sdk.lifecycle import Signal, State

from ..store.base import Ref, Store
from .errors import invalid_argument

NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")
IDEMPOTENCY_KEY_RE = re.compile(r"[\x21-\x7e]{1,128}")
# A runtime's write requests are kept as idempotency keys too (runtime/answers.py), in a namespace
# of their own: with spaces, which no client's key may hold (IDEMPOTENCY_KEY_RE), so a client's
# key and a runtime's request never meet in the entity's keys.
REQUEST_KEY_PREFIX = "runtime write "
# A worker retries a write whose answer it lost once it has reconnected (seconds later), so its
# request keys are kept an hour, not the clients' day: a runtime writes far more than clients do.
REQUEST_KEY_RETENTION_MS = 3600 * 1000
# Free-form names a worker gives (its code version, its custom event types) become keys of
# the store's rows: PostgreSQL's text holds no NUL and its indexes no long value, so both
# stores take only short lines of printable characters (``is_label``, electric_sdk/event_types.py).
MAX_HOSTED_TYPES = 1000
MAX_REASON_BYTES = 1024
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_TEXT_BYTES = 64 * 1024
MAX_DURATION_MS = 24 * 3600 * 1000
MAX_PAGE = 1000
DEFAULT_PAGE = 100
MAX_INT64 = 2**63 - 1


def name(value: str, field: str) -> str:
    if not NAME_RE.fullmatch(value):
        raise invalid_argument(
            "INVALID_NAME",
            f"{field} must be 1-128 characters of [A-Za-z0-9_.-], got {value[:140]!r}",
            field=field,
        )
    return value


# A new entity type may not start with "." (RESERVED_NAME, both doors): the HTTP door's paths are
# /{type}/{id}, and /.well-known/... is A2A's agent card (docs/a2a.md), among other registered
# well-known paths. Types created before this rule still serve; the server names them at start.
RESERVED_TYPE_PREFIX = "."


def new_type(value: str, field: str) -> str:
    """A type a spawn creates: a name, not starting with ``RESERVED_TYPE_PREFIX``."""
    if value.startswith(RESERVED_TYPE_PREFIX):
        raise invalid_argument(
            "RESERVED_NAME",
            f"entity types starting with {RESERVED_TYPE_PREFIX!r} are reserved (/.well-known/ paths), "
            f"got {value[:140]!r}",
            field=field,
        )
    return value


async def reserved_types(store: Store, most: int = 20) -> list[str]:
    """The entity types of stored entities that start with ``RESERVED_TYPE_PREFIX`` (made before
    the rule), at most ``most``: the server warns of them at start. Entities are ordered by
    (type, id), so each type costs one read; "~" sorts after every character of a name."""
    found: list[str] = []
    after: Ref = (RESERVED_TYPE_PREFIX, "")
    while len(found) < most:
        page = await store.list_entities(None, [], after, 1)
        if not page or not page[0].type.startswith(RESERVED_TYPE_PREFIX):
            break
        found.append(page[0].type)
        after = (page[0].type, "~" * 129)
    return found


def code_version(value: str, field: str) -> str:
    if value and not is_label(value):
        raise invalid_argument(
            "INVALID_CODE_VERSION",
            f"{field} must be at most {MAX_LABEL_CHARS} characters, none a control character, "
            f"got {value[:140]!r}",
            field=field,
        )
    return value


def hosted_types(types: list[str], field: str) -> None:
    """A hello's types: at most MAX_HOSTED_TYPES, each once (a type named twice, with two
    profiles, would leave which one holds to chance)."""
    if len(types) > MAX_HOSTED_TYPES:
        raise invalid_argument(
            "TOO_MANY_TYPES",
            f"a worker hosts at most {MAX_HOSTED_TYPES} entity types, not {len(types)}",
            field=field,
        )
    twice = sorted(t for t, n in collections.Counter(types).items() if n > 1)
    if twice:
        raise invalid_argument(
            "DUPLICATE_TYPE", f"the hello names the entity type(s) {twice} more than once", field=field
        )


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


def _check_json(value: struct_pb2.Value, field: str, depth: int = 0) -> None:
    """Every node set, every number finite (JSON can encode it), nested at most MAX_JSON_DEPTH deep."""
    kind = value.WhichOneof("kind")
    if kind in {"struct_value", "list_value"}:
        if depth == MAX_JSON_DEPTH:
            raise invalid_argument(
                "PAYLOAD_TOO_DEEP",
                f"{field} nests more than {MAX_JSON_DEPTH} arrays and objects deep",
                field=field,
            )
        children = value.struct_value.fields.values() if kind == "struct_value" else value.list_value.values
        for child in children:
            _check_json(child, field, depth + 1)
    elif kind is None or (kind == "number_value" and not math.isfinite(value.number_value)):
        raise invalid_argument(
            "INVALID_PAYLOAD", f"{field} is not a JSON value (empty, NaN or infinite)", field=field
        )


# JSON is at most ~6x the protobuf encoding (a control character in a string
# becomes a 6-byte \u escape); below this the limit cannot be reached, so the
# exact size needs no JSON encoding on the hot path.
_SURELY_SMALL = MAX_PAYLOAD_BYTES // 8


def json_value(value: struct_pb2.Value, present: bool, field: str) -> struct_pb2.Value | None:
    """A JSON value within the size limit (compact UTF-8 JSON), or None when absent."""
    if not present:
        return None
    _check_json(value, field)
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


def json_data(value: struct_pb2.Value, present: bool, field: str) -> None:
    """A runtime's custom event data: JSON, at most MAX_JSON_DEPTH deep (no size limit of its own)."""
    if present:
        _check_json(value, field)


def busy_policy(value: str, field: str = "policy") -> busy.BusyPolicy | None:
    """A message's double-texting policy ("" None: its type's; electric_sdk/busy.py)."""
    try:
        return busy.parse(value)
    except ValueError as exc:
        raise invalid_argument("INVALID_BUSY_POLICY", str(exc), field=field) from None


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


def duration_ms(
    seconds: int, nanos: int, present: bool, default_ms: int, field: str, minimum_ms: int = 1
) -> int:
    """Whole milliseconds from ``minimum_ms`` to 24 h (0 only where it means "now", as a wait's
    bound does: answer with what is reached already)."""
    if not present:
        return default_ms
    ms = seconds * 1000 + nanos // 1_000_000
    if (
        seconds < 0
        or not 0 <= nanos < 1_000_000_000
        or nanos % 1_000_000
        or ms < minimum_ms
        or ms > MAX_DURATION_MS
    ):
        raise invalid_argument(
            "INVALID_DURATION",
            f"{field} must be whole milliseconds between {minimum_ms} ms and 24 h",
            field=field,
        )
    return ms


def profile_ms(profile: pb.Profile, where: str) -> tuple[int | None, int | None]:
    """A profile's grace period and idle timeout in milliseconds; None for a value it leaves unset."""
    found: list[int | None] = []
    for name in ("grace_period", "idle_timeout"):
        d = getattr(profile, name)
        found.append(
            duration_ms(d.seconds, d.nanos, True, 0, f"{where}.{name}") if profile.HasField(name) else None
        )
    return found[0], found[1]


def page_size(value: int, field: str = "page_size") -> int:
    if value > MAX_PAGE:
        raise invalid_argument("PAGE_TOO_LARGE", f"{field} must be at most {MAX_PAGE}", field=field)
    return value or DEFAULT_PAGE


def int64(value: int, field: str) -> int:
    """An offset or an epoch: SQLite stores it as a signed 64-bit integer."""
    if value > MAX_INT64:
        raise invalid_argument(
            "VALUE_OUT_OF_RANGE", f"{field} must be at most 2^63-1, got {value}", field=field
        )
    return value
