"""The file `electric export` writes and `electric import` reads: one JSON object per line.

The first line is the header, the last the end; between them, each record on
a line of its own, named by its one key, in this order:

```
{"electric_export": 1, "source": "sqlite", "exported_at_ms": 1764590000000, "head_txid": 4821}
{"type_profile": ["chat", "3f2a", 1, 5000, null, "", null, ""]}  every TypeProfile field, in order:
                                                                   type, code_version, seq, grace_ms,
                                                                   idle_timeout_ms, versioning,
                                                                   upgrade_after_ms, children
{"entity": {"type": "chat", "id": "c1", "state": "idle", ...}}     every EntityRecord field, by name
{"event": ["chat", "c1", 0, "state", "", 1, 1764..., 17, "CgR..."]} type, id, then StoredEvent's fields; body in base64
{"idempotency": ["chat", "c1", "key", "aGFz...", "cmVz...", 1764...]} type, id, key, request hash, response, created_at_ms
{"end": {"type_profiles": 1, "entities": 1, "events": 1, "idempotency": 1}}
```

Entities come in (type, id) order and events in (type, id, offset) order, so
each stream is written, and read back, in order; nothing needs the whole file
in memory on either side. ``electric_export`` is the format's version: a
reader refuses one it does not know. The end line carries the counts, so a
file cut short (a full disk, a copy interrupted) is refused, not half
imported. Entities keep their epochs, cursors and deadlines (every field of
the record); idempotency keys older than the retention were expired and are
left out.
"""

from __future__ import annotations

import base64
import json
import types
import typing
from collections.abc import Iterator, Sequence
from typing import IO, Any, NamedTuple, TypeVar

from electric_sdk.lifecycle import State

from ..core.validation import MAX_INT64, NAME_RE
from ..store.base import EntityRecord, StoredEvent, TypeProfile

__all__ = [
    "FORMAT_VERSION",
    "KINDS",
    "EventRow",
    "ExportFormatError",
    "Header",
    "IdempotencyRow",
    "Reader",
    "Writer",
]

FORMAT_VERSION = 1
# The records' keys, in the order they appear in a file.
KINDS = ("type_profile", "entity", "event", "idempotency")
# Each kind's count on the end line. Files written before 2026-12-03 said "entitys": read too.
PLURALS = {
    "type_profile": "type_profiles",
    "entity": "entities",
    "event": "events",
    "idempotency": "idempotency",
}
_OLD_PLURALS = {"entitys": "entities"}


class ExportFormatError(ValueError):
    """A file that is not an export this electric can read, or is cut short; nothing was imported."""


class Header(NamedTuple):
    source: str  # "sqlite" or "postgresql"
    exported_at_ms: int
    head_txid: int  # the highest txid in the export (0: none)


class EventRow(NamedTuple):
    type: str
    id: str
    event: StoredEvent


class IdempotencyRow(NamedTuple):
    type: str
    id: str
    key: str
    request_hash: bytes
    response: bytes
    created_at_ms: int


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _entity_json(record: EntityRecord) -> dict[str, Any]:
    fields = record._asdict()
    fields["state"] = record.state.value
    fields["cancelled_messages"] = list(record.cancelled_messages)
    return fields


# Fields added since the export format's first release: an older export lacks them.
_ADDED_FIELDS = {"run_key": ""}


def _entity_from_json(given: dict[str, Any]) -> EntityRecord:
    fields = {**_ADDED_FIELDS, **given}
    if set(fields) != set(EntityRecord._fields):
        # Named as the line has them: a field filled in for an older export is not the line's.
        missing = sorted(set(EntityRecord._fields) - set(fields))
        unknown = sorted(set(given) - set(EntityRecord._fields))
        said = [f"it lacks {', '.join(missing)}"] if missing else []
        said += [f"an entity has no field {', '.join(map(repr, unknown))}"] if unknown else []
        raise ValueError("; ".join(said))
    values = dict(fields)
    values["state"] = State(values["state"])
    if isinstance(values["cancelled_messages"], list):
        values["cancelled_messages"] = tuple(values["cancelled_messages"])
    return _typed(EntityRecord, [values[name] for name in EntityRecord._fields])


_Row = TypeVar("_Row", bound=tuple[Any, ...])


def _typed(cls: type[_Row], values: Sequence[Any]) -> _Row:
    """``cls`` (a store's record) from a file's values, each of its field's type. A hand-edited or
    damaged file is refused here, on both stores alike, rather than written into a store that
    could not read it back: a string where a number goes (SQLite would keep it), a NUL in a text
    (PostgreSQL's text holds none), an entity's name the API could not address."""
    hints = typing.get_type_hints(cls)
    fields: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]  # every record is a NamedTuple
    if len(values) != len(fields):
        raise ValueError(f"{len(values)} values, not the {len(fields)} of {', '.join(fields)}")
    for name, value in zip(fields, values, strict=True):
        if not _fits(hints[name], value):
            raise ValueError(f"its {name} is {value!r:.80}, not {_said(hints[name])}")
        if name in ("type", "id") and not NAME_RE.fullmatch(value):
            raise ValueError(f"its {name} {value!r:.80} is not a name (1-128 characters of [A-Za-z0-9_.-])")
    return cls._make(values)  # type: ignore[attr-defined, no-any-return]


def _fits(hint: Any, value: Any) -> bool:
    if isinstance(hint, types.UnionType):
        return any(_fits(arg, value) for arg in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        return isinstance(value, tuple) and all(_fits(typing.get_args(hint)[0], v) for v in value)
    if hint is int:  # JSON's true is not a number here, nor one past a 64-bit column
        return type(value) is int and -MAX_INT64 - 1 <= value <= MAX_INT64
    if hint is str:
        return isinstance(value, str) and "\x00" not in value
    if hint is type(None):
        return value is None
    return isinstance(value, hint)  # bool, bytes, State


def _said(hint: Any) -> str:
    if isinstance(hint, types.UnionType):
        return " or ".join(_said(arg) for arg in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        return "a list of whole numbers"
    words = {
        int: "a 64-bit whole number",
        str: "a text without NUL",
        bool: "true or false",
        type(None): "null",
    }
    return words.get(hint, getattr(hint, "__name__", str(hint)))


class Writer:
    """Writes an export to ``out`` (a text file), record by record, counting them."""

    def __init__(self, out: IO[str], header: Header) -> None:
        self._out = out
        self.counts = dict.fromkeys(KINDS, 0)
        self._line(
            {
                "electric_export": FORMAT_VERSION,
                "source": header.source,
                "exported_at_ms": header.exported_at_ms,
                "head_txid": header.head_txid,
            }
        )

    def _line(self, obj: dict[str, Any]) -> None:
        self._out.write(json.dumps(obj, separators=(",", ":")))
        self._out.write("\n")

    def type_profile(self, profile: TypeProfile) -> None:
        self._add("type_profile", list(profile))

    def entity(self, record: EntityRecord) -> None:
        self._add("entity", _entity_json(record))

    def event(self, type: str, id: str, event: StoredEvent) -> None:
        self._add("event", [type, id, *event[:-1], _b64(event.body)])

    def idempotency(self, row: IdempotencyRow) -> None:
        self._add("idempotency", [*row[:3], _b64(row.request_hash), _b64(row.response), row.created_at_ms])

    def _add(self, kind: str, value: Any) -> None:
        self._line({kind: value})
        self.counts[kind] += 1

    def end(self) -> None:
        self._line({"end": _tally(self.counts)})


def _tally(counts: dict[str, int]) -> dict[str, int]:
    """The end line's counts: each kind's, in the plural."""
    return {PLURALS[kind]: n for kind, n in counts.items()}


Record = TypeProfile | EntityRecord | EventRow | IdempotencyRow


class Reader:
    """Reads an export from ``lines`` (a text file): ``header``, then ``records()`` in file order."""

    def __init__(self, lines: IO[str]) -> None:
        self._lines = lines
        self._number = 0
        first = self._next()
        if first is None or "electric_export" not in first:
            raise ExportFormatError("not an electric export: its first line is not the export's header")
        if first["electric_export"] != FORMAT_VERSION:
            raise ExportFormatError(
                f"an export of format {first['electric_export']!r}; this electric reads format {FORMAT_VERSION}"
            )
        missing = [name for name in ("source", "exported_at_ms", "head_txid") if name not in first]
        if missing:
            raise ExportFormatError(f"line 1: the header lacks {', '.join(missing)}")
        try:
            self.header = _typed(Header, [first["source"], first["exported_at_ms"], first["head_txid"]])
        except ValueError as exc:
            raise ExportFormatError(f"line 1: a malformed header: {exc}") from exc
        self.counts = dict.fromkeys(KINDS, 0)

    def _next(self) -> dict[str, Any] | None:
        try:
            line = self._lines.readline()
        except UnicodeDecodeError as exc:  # a binary file, or a damaged one
            raise ExportFormatError(
                f"line {self._number + 1} is not UTF-8 text ({exc.reason}): not an electric export, or a "
                "damaged one"
            ) from exc
        if not line:
            return None
        self._number += 1
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ExportFormatError(f"line {self._number} is not JSON: {exc}") from exc
        if not isinstance(obj, dict) or len(obj) < 1:
            raise ExportFormatError(f"line {self._number} is not a record")
        return obj

    def records(self) -> Iterator[tuple[str, Record]]:
        """(kind, record) for each record; raises ExportFormatError on a malformed or short file."""
        order = 0
        while (obj := self._next()) is not None:
            kind = next(iter(obj)) if len(obj) == 1 else None
            if kind == "end":
                self._check_end(obj["end"])
                return
            if kind not in KINDS:
                raise ExportFormatError(f"line {self._number}: an unknown record {sorted(obj)}")
            if KINDS.index(kind) < order:
                raise ExportFormatError(f"line {self._number}: a {kind} after the {PLURALS[KINDS[order]]}")
            order = KINDS.index(kind)
            try:
                record = self._parse(kind, obj[kind])
            except (TypeError, ValueError, KeyError) as exc:
                raise ExportFormatError(f"line {self._number}: a malformed {kind}: {exc}") from exc
            self.counts[kind] += 1
            yield kind, record
        raise ExportFormatError(
            f"the export ends at line {self._number} without its end line: it was cut short"
        )

    @staticmethod
    def _parse(kind: str, value: Any) -> Record:
        if kind == "entity":
            if not isinstance(value, dict):
                raise ValueError(f"it is {type(value).__name__} {value!r:.40}, not an object of its fields")
            return _entity_from_json(value)
        if not isinstance(value, list):
            raise ValueError(f"it is {type(value).__name__} {value!r:.40}, not an array of its values")
        if kind == "type_profile":
            return _typed(TypeProfile, value)
        if kind == "event":
            type_, id_, *fields, body = value
            event = _typed(StoredEvent, [*fields, base64.b64decode(body, validate=True)])
            return _typed(EventRow, [type_, id_, event])
        type_, id_, key, request_hash, response, created_at = value
        hashed, answer = (
            base64.b64decode(request_hash, validate=True),
            base64.b64decode(response, validate=True),
        )
        return _typed(IdempotencyRow, [type_, id_, key, hashed, answer, created_at])

    def _check_end(self, end: Any) -> None:
        expected = _tally(self.counts)
        if isinstance(end, dict):
            end = {_OLD_PLURALS.get(kind, kind): n for kind, n in end.items()}
        if end != expected:
            raise ExportFormatError(f"the end line counts {end}, but the file holds {expected}")
        if self._lines.readline():
            raise ExportFormatError(f"line {self._number + 1}: more after the end line")
