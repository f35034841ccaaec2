"""Arguments as users give them → typed values, or ``errors.InvalidArgument``.

The client, the runtime's ``Context`` and the widgets take entity refs,
signals, states, offsets and JSON values as strings or as their types; each is parsed
here, once, into the SDK's error with the same reason the server would give
(``INVALID_NAME``, ``UNKNOWN_SIGNAL``, ``UNKNOWN_STATE``, ``INVALID_PAYLOAD``,
``PAYLOAD_TOO_DEEP``, ``VALUE_OUT_OF_RANGE``), before anything is sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from google.protobuf import struct_pb2

from . import errors
from ._wire.json_values import MAX_JSON_DEPTH, json_to_value, nests_too_deep
from .lifecycle import Signal, State
from .models import EntityRef

__all__ = [
    "MAX_OFFSET",
    "RefLike",
    "SignalLike",
    "StateLike",
    "json_argument",
    "parse_int64",
    "parse_offset",
    "parse_ref",
    "parse_signal",
    "parse_states",
]

RefLike = EntityRef | str
SignalLike = Signal | str
StateLike = State | str
# The server stores offsets as SQLite's signed 64-bit integers.
MAX_OFFSET = 2**63 - 1


def parse_ref(value: RefLike) -> EntityRef:
    try:
        return EntityRef.parse(value)
    except ValueError as exc:
        raise errors.InvalidArgument(str(exc), code="INVALID_NAME") from exc


def parse_signal(value: SignalLike) -> Signal:
    try:
        return Signal.parse(value)
    except ValueError as exc:
        raise errors.InvalidArgument(str(exc), code="UNKNOWN_SIGNAL") from exc


def parse_states(values: StateLike | Iterable[StateLike] | None) -> list[State]:
    """One state, several, or None (no filter: an empty list)."""
    if values is None:
        return []
    items = [values] if isinstance(values, State | str) else list(values)
    try:
        return [State.parse(v) for v in items]
    except ValueError as exc:
        raise errors.InvalidArgument(str(exc), code="UNKNOWN_STATE") from exc


def parse_offset(value: int, field: str = "from_offset") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_OFFSET:
        raise errors.InvalidArgument(
            f"{field} must be a whole number from 0 to 2^63-1, got {value!r}", code="VALUE_OUT_OF_RANGE"
        )
    return value


def parse_int64(value: int, field: str) -> int:
    """An int as the wire's int64; the server judges its range (a negative offset is refused there)."""
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_OFFSET:
        raise errors.InvalidArgument(
            f"{field} must be a whole number, got {value!r}", code="VALUE_OUT_OF_RANGE"
        )
    return value


def json_argument(value: Any, field: str) -> struct_pb2.Value:
    """A payload or data argument as the wire's JSON value; ``field`` names it in the error."""
    if nests_too_deep(value):
        raise errors.InvalidArgument(
            f"{field} nests more than {MAX_JSON_DEPTH} arrays and objects deep", code="PAYLOAD_TOO_DEEP"
        )
    try:
        return json_to_value(value)
    except ValueError as exc:
        raise errors.InvalidArgument(
            f"{field} is not JSON-serializable: {exc}", code="INVALID_PAYLOAD"
        ) from exc
