"""Watch responses put together from pre-encoded events and changes.

A server that fans one entity's events out to thousands of watchers converts
and encodes each event once (``event_entry``) and builds every watcher's
message by joining those bytes (``single_event``, ``event_batch``): no
protobuf object per watcher. State changes for ``WatchEntities`` are encoded
once the same way (``single_change``, ``change_batch``). It works because protobuf's encoding of a
message is the concatenation of its fields' encodings, and a repeated
message field is one length-delimited entry per element. The field numbers
below are ``entity_service.proto``'s; ``tests/test_wire.py`` decodes what
these build with the generated classes, so a renumbering cannot go unseen.
"""

from __future__ import annotations

from collections.abc import Sequence

from .events import StoredEventFields, event_to_pb

__all__ = ["change_batch", "event_batch", "event_entry", "single_change", "single_event"]

_LENGTH_DELIMITED = 2
# WatchEventsResponse.event = 1 and EventBatch.events = 1 share one tag byte,
# so an event's entry is both a one-event response and a batch's element.
_EVENT_TAG = bytes([(1 << 3) | _LENGTH_DELIMITED])
_BATCH_TAG = bytes([(3 << 3) | _LENGTH_DELIMITED])  # WatchEventsResponse.events = 3
# WatchEntitiesResponse.change = 3 and .changes = 4; EntityChanges.changes = 1.
_CHANGE_TAG = bytes([(3 << 3) | _LENGTH_DELIMITED])
_CHANGES_TAG = bytes([(4 << 3) | _LENGTH_DELIMITED])
_CHANGES_ELEMENT_TAG = bytes([(1 << 3) | _LENGTH_DELIMITED])


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def event_entry(stored: StoredEventFields) -> bytes:
    """The event as field 1 of a message: ``WatchEventsResponse.event`` or one ``EventBatch.events``."""
    body = event_to_pb(stored).SerializeToString()
    return _EVENT_TAG + _varint(len(body)) + body


def single_event(entry: bytes) -> bytes:
    """A ``WatchEventsResponse`` holding one event (``item.event``)."""
    return entry


def event_batch(entries: Sequence[bytes]) -> bytes:
    """A ``WatchEventsResponse`` holding these events, in order, as ``item.events``."""
    inner = b"".join(entries)
    return _BATCH_TAG + _varint(len(inner)) + inner


def single_change(change: bytes) -> bytes:
    """A ``WatchEntitiesResponse`` holding one ``EntityChange`` (encoded as ``change``)."""
    return _CHANGE_TAG + _varint(len(change)) + change


def change_batch(changes: Sequence[bytes]) -> bytes:
    """A ``WatchEntitiesResponse`` holding these encoded ``EntityChange``s as ``item.changes``."""
    inner = b"".join(_CHANGES_ELEMENT_TAG + _varint(len(c)) + c for c in changes)
    return _CHANGES_TAG + _varint(len(inner)) + inner
