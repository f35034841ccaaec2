"""Arguments as users give them → typed values, or ``errors.InvalidArgument``.

The client, the runtime's ``Context`` and the widgets take entity refs,
signals, states and JSON values as strings or as their types; each is parsed
here, once, into the SDK's error with the same reason the server would give
(``INVALID_NAME``, ``UNKNOWN_SIGNAL``, ``UNKNOWN_STATE``, ``INVALID_PAYLOAD``),
before anything is sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from google.protobuf import struct_pb2

from . import errors
from ._wire.json_values import json_to_value
from .lifecycle import Signal, State
from .models import EntityRef

__all__ = ["RefLike", "SignalLike", "StateLike", "json_argument", "parse_ref", "parse_signal", "parse_states"]

RefLike = EntityRef | str
SignalLike = Signal | str
StateLike = State | str


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


def json_argument(value: Any, field: str) -> struct_pb2.Value:
    """A payload or data argument as the wire's JSON value; ``field`` names it in the error."""
    try:
        return json_to_value(value)
    except ValueError as exc:
        raise errors.InvalidArgument(
            f"{field} is not JSON-serializable: {exc}", code="INVALID_PAYLOAD"
        ) from exc
