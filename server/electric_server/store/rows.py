"""Rows and records: the entity's and events' columns, and the mappings between them.

Everything here follows the records' fields (``EntityRecord._fields``,
``StoredEvent._fields``): a column per field, in the fields' order, so adding
a field adds its column to every statement and mapping at once. Nothing here
is particular to one database, so every SQL store (SQLite and PostgreSQL)
shares it; placeholders, types and statements are each store's own.

A column differs from its field in two ways only, each listed here:

- its name, where the column predates the field's ``_ms`` suffix
  (``_RENAMED``: renaming the columns would break the files already written);
- its type, where SQL has no such type: the state (an enum) is stored as its
  text value, the cancelled messages' offsets (a tuple) as their decimal
  numbers joined by commas, and the booleans come back as whatever the driver
  returns for them (SQLite: 0 or 1), so they are made ``bool`` again. A bool
  is an int, so it is written as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from electric_sdk.lifecycle import State

from .base import EntityRecord, StoredEvent, WriteContext

__all__ = [
    "ENTITY_COLUMNS",
    "ENTITY_KEY",
    "ENTITY_VALUE_INDEXES",
    "EVENT_COLUMNS",
    "advanced",
    "entity_from_row",
    "entity_row",
    "event_from_row",
]

# Fields whose column has another name (see the module docstring).
_RENAMED = {
    "created_at_ms": "created_at",
    "updated_at_ms": "updated_at",
    "stopping_deadline_ms": "stopping_deadline",
    "timestamp_ms": "ts",
}

ENTITY_COLUMNS: tuple[str, ...] = tuple(_RENAMED.get(name, name) for name in EntityRecord._fields)
# The primary key, which is the record's ``ref``.
ENTITY_KEY = ("type", "id")
# The positions of the other columns in a row: the ones a write may change.
ENTITY_VALUE_INDEXES = tuple(i for i, column in enumerate(ENTITY_COLUMNS) if column not in ENTITY_KEY)
# The events table's columns after its key's (type, id): a StoredEvent's fields, in order,
# so ``ref + stored_event`` is the event's row.
EVENT_COLUMNS: tuple[str, ...] = tuple(_RENAMED.get(name, name) for name in StoredEvent._fields)

_FIELDS = EntityRecord._fields
_STATE = _FIELDS.index("state")
# The booleans, which SQL drivers may return as integers.
_BOOLEANS = tuple(
    _FIELDS.index(name)
    for name in (
        "closed",
        "reload_pending",
        "grace_pending",
        "idle_timeout_pending",
        "process_running",
        "parent_told",
    )
)
_CANCELLED = _FIELDS.index("cancelled_messages")
# What a commit sets on the entity it writes (see ``advanced``).
_UPDATED_AT = _FIELDS.index("updated_at_ms")
_HEAD_OFFSET = _FIELDS.index("head_offset")
_TXID = _FIELDS.index("txid")

# Rows and records are built from lists rather than by naming each field: a
# write builds two rows and a record, and a list is faster on that path than
# sixteen attribute reads (and than NamedTuple._replace).
_record = EntityRecord._make


def entity_row(record: EntityRecord) -> tuple[Any, ...]:
    """The entity's row: its fields in ``ENTITY_COLUMNS`` order, the state as its value."""
    row: list[Any] = list(record)
    row[_STATE] = record.state.value
    row[_CANCELLED] = ",".join(map(str, record.cancelled_messages)) if record.cancelled_messages else ""
    return tuple(row)


def entity_from_row(row: Sequence[Any]) -> EntityRecord:
    """The record a row in ``ENTITY_COLUMNS`` order holds."""
    values = list(row)
    values[_STATE] = State(values[_STATE])
    for i in _BOOLEANS:
        values[i] = bool(values[i])
    cancelled = values[_CANCELLED]
    values[_CANCELLED] = tuple(int(o) for o in cancelled.split(",")) if cancelled else ()
    return _record(values)


def event_from_row(row: Sequence[Any]) -> StoredEvent:
    """The event a row in ``EVENT_COLUMNS`` order holds."""
    return StoredEvent._make(row)


def advanced(base: EntityRecord, head_offset: int, ctx: WriteContext) -> EntityRecord:
    """``base`` as a commit leaves it: its new head offset, the commit's time and txid.

    Every store sets these three on the record a mutation returns (see ``Mutation``).
    """
    values = list(base)
    values[_UPDATED_AT] = ctx.now_ms
    values[_HEAD_OFFSET] = head_offset
    values[_TXID] = ctx.txid
    return _record(values)
