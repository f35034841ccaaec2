"""JSON values between the wire (``google.protobuf.Value``) and plain Python.

A SIGUSR payload, a message's data and a custom event's data travel as
``Value``; users and the RFC's JSON see plain ``dict``/``list``/``str``/numbers.

They nest at most ``MAX_JSON_DEPTH`` arrays and objects deep: the server
refuses deeper ones (``PAYLOAD_TOO_DEEP``), and the SDK before sending them.
"""

from __future__ import annotations

import json
import math
from typing import Any

from google.protobuf import json_format, struct_pb2

__all__ = ["MAX_JSON_DEPTH", "json_to_value", "nests_too_deep", "through_text", "value_to_json"]

# Each level of JSON is two nested protobuf messages (a Value and its ListValue or Struct), and
# protobuf decodes at most 100: 32 levels leave room for the messages around a value, wherever
# it sits in a request, and are far more than any payload needs.
MAX_JSON_DEPTH = 32


def value_to_json(value: struct_pb2.Value) -> Any:
    """A protobuf Value as plain Python (walked directly: MessageToDict is slow)."""
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        n = value.number_value
        # JSON numbers travel as doubles; give back 1, not 1.0.
        return int(n) if n.is_integer() and abs(n) < 2**53 else n
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return {k: value_to_json(v) for k, v in value.struct_value.fields.items()}
    if kind == "list_value":
        return [value_to_json(v) for v in value.list_value.values]
    return None


def json_to_value(obj: Any) -> struct_pb2.Value:
    """Plain Python as a protobuf Value; ValueError (saying why) when it is not JSON."""
    message = struct_pb2.Value()
    try:
        _fill(message, obj, 0)
        return message
    except (_Unusual, ValueError, TypeError):
        return through_text(obj)  # takes it, or says why not, as it always has


def through_text(obj: Any) -> struct_pb2.Value:
    """``json_to_value``'s general path: through JSON text (what the direct one must equal)."""
    message = struct_pb2.Value()
    try:
        json_format.Parse(json.dumps(obj), message)
    except (TypeError, json_format.ParseError) as exc:
        raise ValueError(str(exc)) from exc
    return message


class _Unusual(Exception):
    """A value ``_fill`` leaves to the general path (through JSON text)."""


# Integers a double holds exactly: set directly, they are what JSON text would make of them.
_EXACT_INT = 2**53


def _fill(message: struct_pb2.Value, obj: Any, depth: int) -> None:
    """``obj`` into ``message`` directly, for the plain types JSON decoding gives (exact types
    only): a payload on every signal, ten times cheaper than through JSON text. Anything else
    (a subclass, a non-text key, a huge integer, a cycle) raises _Unusual."""
    kind = type(obj)
    if kind is dict:
        if depth > MAX_JSON_DEPTH:
            raise _Unusual
        struct = message.struct_value
        struct.SetInParent()  # {} too is a struct
        fields = struct.fields
        for key, value in obj.items():
            if type(key) is not str:
                raise _Unusual
            _fill(fields[key], value, depth + 1)
    elif kind is list:
        if depth > MAX_JSON_DEPTH:
            raise _Unusual
        values = message.list_value
        values.SetInParent()
        for item in obj:
            _fill(values.values.add(), item, depth + 1)
    elif kind is str:
        message.string_value = obj  # UnicodeEncodeError for a lone surrogate
    elif kind is bool:
        message.bool_value = obj
    elif obj is None:
        message.null_value = struct_pb2.NULL_VALUE
    elif (kind is int and -_EXACT_INT <= obj <= _EXACT_INT) or (kind is float and math.isfinite(obj)):
        message.number_value = obj
    else:
        raise _Unusual


def nests_too_deep(obj: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether plain Python nests more than ``limit`` lists and dicts deep (walked without
    recursion, so a value too deep for Python's own stack is answered too)."""
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth == limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
