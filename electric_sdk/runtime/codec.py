"""Step result codecs: how a recorded step's result becomes JSON in its record, and comes back.

A step's result is written in its ``electric.step`` record as a JSON value
(``result``), plus a type tag (``type``) when the value is not plain JSON, so
that a replay returns an equal object of the same type. The codec is the
app's (``App(codec=...)``); the default, ``JSONCodec``, keeps plain JSON as it
is (no tag: the record is what it always was) and also carries:

- dataclasses: their fields as a JSON object, tagged ``module:QualName``;
- pydantic models (anything with ``model_dump`` and ``model_validate``):
  ``model_dump(mode="json")``, tagged the same way.

A tag is resolved by importing its module, or from ``JSONCodec(types=[...])``
first (a class defined in a function, or in ``__main__``, cannot be imported
by name: register it). The tag is checked when the result is recorded, so a
result a replay could not rebuild fails its step at once rather than on the
next delivery. Another codec implements ``encode``/``decode``: ``encode`` gives
a JSON value and a tag (None: plain JSON), ``decode`` gets them back; a
record it cannot decode raises, and the step names itself in the error.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Iterable
from typing import Any, Protocol

from .._wire.json_values import nests_too_deep
from ..durable_state import MAX_VALUE_DEPTH
from ..errors import InvalidStepResult

__all__ = ["MAX_RESULT_BYTES", "Codec", "JSONCodec", "decode_result", "encode_result"]

# A step's result, as JSON, is at most this many bytes: a step event must stay far below the
# transport's message bound (4 MiB), and a replay reads every result of its run.
MAX_RESULT_BYTES = 256 * 1024


class Codec(Protocol):
    """What a step's result goes through on its way into a record and back."""

    def encode(self, value: Any) -> tuple[Any, str | None]:
        """``value`` as (a JSON value, its type tag or None for plain JSON)."""
        ...

    def decode(self, data: Any, tag: str | None) -> Any:
        """The value ``encode`` gave (``data``, ``tag``) for; raises if it cannot."""
        ...


def _tag(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _is_model(cls: type) -> bool:
    return callable(getattr(cls, "model_dump", None)) and callable(getattr(cls, "model_validate", None))


class JSONCodec:
    """Plain JSON as it is; dataclasses and pydantic models as JSON plus their type's tag."""

    __slots__ = ("_types",)

    def __init__(self, types: Iterable[type] = ()) -> None:
        self._types = {_tag(cls): cls for cls in types}

    def encode(self, value: Any) -> tuple[Any, str | None]:
        cls = type(value)
        if _is_model(cls):
            data = value.model_dump(mode="json")
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            data = dataclasses.asdict(value)
        else:
            return value, None
        tag = _tag(cls)
        if self._resolve(tag) is not cls:
            raise TypeError(
                f"{tag} cannot be found again by that name (a class defined in a function or in "
                "__main__): register it with JSONCodec(types=[...])"
            )
        return data, tag

    def decode(self, data: Any, tag: str | None) -> Any:
        if tag is None:
            return data
        cls = self._resolve(tag)
        if cls is None:
            raise TypeError(f"no type {tag} here (not importable, not registered)")
        if _is_model(cls):
            return cls.model_validate(data)  # type: ignore[attr-defined]
        if dataclasses.is_dataclass(cls):
            return _dataclass(cls, data)
        raise TypeError(f"{tag} is neither a dataclass nor a pydantic model")

    def _resolve(self, tag: str) -> type | None:
        if (cls := self._types.get(tag)) is not None:
            return cls
        module_name, _, qualname = tag.partition(":")
        try:
            found: Any = importlib.import_module(module_name)
            for part in qualname.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            return None
        return found if isinstance(found, type) else None


def _dataclass(cls: type, data: Any) -> Any:
    """A dataclass rebuilt from its fields, nested dataclasses included (pydantic's adapter when
    it is installed, which also converts field types; else the fields as they are)."""
    try:
        from pydantic import TypeAdapter
    except ImportError:
        if not isinstance(data, dict):
            raise TypeError(f"{_tag(cls)}: recorded as {type(data).__name__}, not an object") from None
        return cls(**data)
    return TypeAdapter(cls).validate_python(data)


# -- a step result through the codec -------------------------------------------------------


def encode_result(codec: Codec, name: str, result: Any) -> tuple[Any, str | None]:
    """``result`` as its record holds it: (a JSON copy of what the codec made, its type tag)."""
    try:
        value, tag = codec.encode(result)
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidStepResult(
            f"step {name!r}: its result must be JSON or a type the codec carries: {exc}"
        ) from None
    if len(text.encode()) > MAX_RESULT_BYTES:
        raise InvalidStepResult(
            f"step {name!r}: its result is {len(text.encode())} bytes as JSON; at most {MAX_RESULT_BYTES}"
        )
    copied = json.loads(text)
    if nests_too_deep(copied, MAX_VALUE_DEPTH):
        raise InvalidStepResult(f"step {name!r}: its result nests more than {MAX_VALUE_DEPTH} deep")
    return copied, tag


def decode_result(codec: Codec, name: str, data: dict[str, Any], where: str) -> Any:
    """The value of a recorded (or just encoded) result; a clear error naming the step if the
    codec cannot rebuild it (a type renamed or removed, another codec)."""
    tag = data.get("type")
    try:
        return codec.decode(data.get("result"), None if tag is None else str(tag))
    except Exception as exc:
        kind = f" of type {tag}" if tag is not None else ""
        raise InvalidStepResult(
            f"step {name!r} ({where}): its recorded result{kind} cannot be decoded: {type(exc).__name__}: {exc}"
        ) from exc
