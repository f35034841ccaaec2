"""Times and durations between the wire, milliseconds, ``datetime`` and the RFC's JSON text.

The server counts in integer milliseconds (its store's columns); the SDK shows
timezone-aware UTC ``datetime`` and ``timedelta``; the RFC's JSON writes
instants as ISO 8601 text with milliseconds and a ``Z``, or as epoch milliseconds.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from google.protobuf import duration_pb2, timestamp_pb2

__all__ = [
    "datetime_to_ms",
    "duration_from_ms",
    "epoch_to_iso",
    "from_iso",
    "timedelta_to_ms",
    "timestamp_from_datetime",
    "timestamp_from_ms",
    "timestamp_to_datetime",
    "timestamp_to_ms",
    "to_iso",
]

_MS = timedelta(milliseconds=1)


def timestamp_from_ms(ms: int) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    set_timestamp_ms(ts, ms)
    return ts


def set_timestamp_ms(field: timestamp_pb2.Timestamp, ms: int) -> None:
    """``field`` (a message's own Timestamp) set to ``ms`` in place, with no Timestamp to copy."""
    field.seconds = ms // 1000
    field.nanos = (ms % 1000) * 1_000_000


def duration_from_ms(ms: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def timestamp_to_ms(ts: timestamp_pb2.Timestamp) -> int:
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


def timestamp_to_datetime(ts: timestamp_pb2.Timestamp) -> datetime:
    """Through a float of seconds (fast, on every event a watch delivers): exact to the
    millisecond for instants before the year 2200."""
    return datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, UTC)


def timestamp_from_datetime(dt: datetime) -> timestamp_pb2.Timestamp:
    """To the microsecond (a naive ``dt`` is taken as UTC)."""
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(dt)
    return ts


def datetime_to_ms(dt: datetime) -> int:
    """Epoch milliseconds, as the RFC's responses write ``created_at``."""
    return round(dt.timestamp() * 1000)


def timedelta_to_ms(td: timedelta) -> int:
    """Whole milliseconds (a fraction is dropped), as the RFC's JSON writes a profile's durations."""
    return int(td / _MS)


def to_iso(dt: datetime) -> str:
    """``2026-03-07T10:00:00.123Z``: the RFC's JSON text of an instant."""
    return dt.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch_to_iso(seconds: float) -> str:
    """``to_iso`` of a POSIX time in seconds (e.g. a log record's ``created``)."""
    return to_iso(datetime.fromtimestamp(seconds, UTC))


def from_iso(text: str) -> datetime:
    """An instant ``to_iso`` wrote, back as a ``datetime``."""
    return datetime.fromisoformat(text)
