"""Where the replay check (replay.py) reads recorded runs: a server, or an ``electric export`` file.

From a server, through the client: the entities of each checked type
(``ListEntities``), then each one's stream, page by page. From a file: the
export's own format (the server's ``tools/export_file.py`` writes it and
documents it), read here without the server's package: a header line, the
entities, then each stream's events in (type, id, offset) order, each event's
value stored as its ``pb.Event`` bytes, and an end line with the counts. A
file that is not an export, or was cut short, is refused with the line that
shows it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import AsyncIterator, Collection, Iterator
from functools import partial
from pathlib import Path
from typing import IO, Any, NamedTuple

from .._proto.electric.v1 import types_pb2 as pb
from .._wire.enums import STATE_TO_PB
from .._wire.events import event_to_pb
from .._wire.times import timestamp_from_ms
from ..client import AsyncClient
from ..errors import InvalidArgument
from ..lifecycle import State
from ..models import Entity, Event
from ..state_read import read_range
from .app import App
from .replay import DEFAULT_RUN_TIMEOUT_S, ReplayResult, checked_types, replay_streams

__all__ = ["ExportFileError", "export_streams", "replay_check", "server_streams"]

# The export format this reader knows (the header's ``electric_export``).
EXPORT_FORMAT = 1

Stream = tuple[Entity, list[Event]]


class ExportFileError(ValueError):
    """A file that is not an ``electric export`` this version reads, or one cut short."""


async def server_streams(client: AsyncClient, types: Collection[str]) -> AsyncIterator[Stream]:
    """Each entity of ``types`` on the server, with its whole stream."""
    for type_name in types:
        for entity in await client.list(type_name):
            events = await read_range(partial(client.events, entity.ref), 0, entity.head_offset)
            yield entity, events


class _StoredEvent(NamedTuple):
    """An export's event line, as ``event_to_pb`` reads a stored event."""

    offset: int
    kind: str
    key: str
    operation: int
    timestamp_ms: int
    txid: int
    body: bytes


def _entity(fields: dict[str, Any]) -> Entity:
    m = pb.Entity(
        ref=pb.EntityRef(type=str(fields["type"]), id=str(fields["id"])),
        state=STATE_TO_PB[State(fields["state"])],
        created_at=timestamp_from_ms(int(fields["created_at_ms"])),
        updated_at=timestamp_from_ms(int(fields["updated_at_ms"])),
        head_offset=int(fields["head_offset"]),
        closed=bool(fields["closed"]),
        txid=int(fields["txid"]),
    )
    return Entity.from_pb(m)


class _Lines:
    """The file's records, one JSON object a line, with the line number for each refusal."""

    def __init__(self, path: Path, text: IO[str]) -> None:
        self.path, self._text, self.number = path, text, 0

    def refuse(self, why: str) -> ExportFileError:
        return ExportFileError(f"{self.path}: line {self.number}: {why}")

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for line in self._text:
            self.number += 1
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise self.refuse(f"not JSON ({exc}): not an electric export, or a damaged one") from None
            if not isinstance(record, dict) or not record:
                raise self.refuse("not a record of an electric export")
            yield record


def _records(path: Path, text: IO[str], types: Collection[str]) -> Iterator[Stream]:
    lines = _Lines(path, text)
    records = iter(lines)
    header = next(records, None)
    if header is None or "electric_export" not in header:
        raise ExportFileError(f"{path}: not an electric export (its first line is not an export's header)")
    if header["electric_export"] != EXPORT_FORMAT:
        raise lines.refuse(f"an export of format {header['electric_export']!r}; this reads {EXPORT_FORMAT}")
    entities: dict[tuple[str, str], Entity] = {}
    current: tuple[str, str] | None = None
    events: list[Event] = []
    for record in records:
        kind = next(iter(record))
        try:
            if kind == "end":
                if current is not None:
                    yield entities[current], events
                return
            if kind == "entity":
                fields = record["entity"]
                if fields["type"] in types:
                    entities[(fields["type"], fields["id"])] = _entity(fields)
            elif kind == "event":
                type_, id_, *values, body = record["event"]
                if type_ not in types:
                    continue
                if (type_, id_) != current:
                    if current is not None:
                        yield entities[current], events
                    current, events = (type_, id_), []
                offset, event_kind, key, operation, timestamp_ms, txid = values
                stored = _StoredEvent(
                    int(offset),
                    str(event_kind),
                    str(key),
                    int(operation),
                    int(timestamp_ms),
                    int(txid),
                    base64.b64decode(body, validate=True),
                )
                events.append(Event.from_pb(event_to_pb(stored)))
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise lines.refuse(f"a malformed {kind} record ({type(exc).__name__}: {exc})") from None
    raise ExportFileError(
        f"{path}: the export ends at line {lines.number} without its end line: it was cut short"
    )


async def export_streams(path: Path, types: Collection[str]) -> AsyncIterator[Stream]:
    """Each entity of ``types`` in the export file at ``path``, with its whole stream."""
    try:
        text = path.open(encoding="utf-8")
    except OSError as exc:
        raise ExportFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    with text:
        try:
            for stream in _records(path, text, types):
                yield stream
        except UnicodeDecodeError as exc:
            raise ExportFileError(f"{path}: not UTF-8 text ({exc.reason}): not an electric export") from None


async def replay_check(
    app: App,
    *,
    client: AsyncClient | None = None,
    file: Path | None = None,
    types: Collection[str] | None = None,
    all_runs: bool = False,
    run_timeout_s: float = DEFAULT_RUN_TIMEOUT_S,
) -> ReplayResult:
    """Replay ``app``'s code against the runs recorded on the server ``client`` reaches, or in the
    export ``file`` (one of them): the check of ``electric replay-check`` and ``testing.replay``."""
    if (client is None) == (file is None):
        raise InvalidArgument("replay against a server or an export file: name one", code="USAGE")
    hosted = checked_types(app, types)
    if file is not None:
        streams = export_streams(file, hosted)
    else:
        assert client is not None
        streams = server_streams(client, hosted)
    return await replay_streams(app, streams, types=hosted, all_runs=all_runs, run_timeout_s=run_timeout_s)
