"""What a write becomes once its entity is current: the decision, its rows and its outcome.

Every store runs a write the same way once it holds the entity's current
record (SQLite: its only writer; PostgreSQL: the row locked ``FOR UPDATE``):
an idempotency key already stored answers with its response (``replay``);
otherwise ``decide`` runs, and ``apply_write`` turns its ``Mutation`` into the
commit, the event rows, the entity's new record and the idempotency row to
write. Nothing here does I/O: the stores write the rows their own way.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from .base import (
    Commit,
    EntityRecord,
    Idempotency,
    IdempotencyKeyReused,
    Mutation,
    StoredEvent,
    Write,
    WriteContext,
    WriteOutcome,
)
from .rows import advanced

__all__ = ["Applied", "Refused", "apply_write", "now_ms", "replay"]


def now_ms() -> int:
    """A write's clock: the wall clock in milliseconds (``WriteContext.now_ms``)."""
    return time.time_ns() // 1_000_000


class Refused(Exception):
    """``decide`` refused the write (``error`` is what it raised): nothing of it is written."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class Applied(NamedTuple):
    outcome: WriteOutcome
    # The entity's record after the write (None: the row is not written).
    after: EntityRecord | None
    # The event rows: the ref, then a StoredEvent's fields (the events table's columns, in order).
    event_rows: list[tuple[object, ...]]
    # (type, id, key, request hash, response, created at), or None.
    idempotency_row: tuple[str, str, str, bytes, bytes, int] | None


def replay(idem: Idempotency, remembered: tuple[bytes, bytes]) -> WriteOutcome:
    """The answer to a write whose idempotency key is stored: (request hash, response)."""
    if remembered[0] != idem.request_hash:
        raise Refused(IdempotencyKeyReused(idem.key))
    return WriteOutcome(None, remembered[1], True)


def apply_write(write: Write, before: EntityRecord | None, ctx: WriteContext) -> Applied:
    """Run ``write.decide`` on ``before``; raises ``Refused`` when it (or the closed stream) refuses."""
    ref = write.ref
    try:
        mutation: Mutation = write.decide(before, ctx)
        if mutation.events and before is not None and before.closed:
            raise RuntimeError(f"append to the closed stream {ref[0]}/{ref[1]}")
    except Exception as exc:
        raise Refused(exc) from exc
    event_rows: list[tuple[object, ...]]
    after: EntityRecord | None
    if not mutation.events and mutation.entity is None:
        commit = None
        after = None
        event_rows = []
        response = None
        if write.encode is not None:
            response = write.encode(Commit(ref, 0, ctx.now_ms, (), before, before, mutation.result))
    else:
        head = before.head_offset if before else 0
        if len(mutation.events) == 1:  # the common case, without the comprehensions
            ev = mutation.events[0]
            stored: tuple[StoredEvent, ...] = (
                StoredEvent(head, ev.kind, ev.key, ev.operation, ctx.now_ms, ctx.txid, ev.body),
            )
            event_rows = [ref + stored[0]]
        else:
            stored = tuple(
                [
                    StoredEvent(offset, ev.kind, ev.key, ev.operation, ctx.now_ms, ctx.txid, ev.body)
                    for offset, ev in enumerate(mutation.events, start=head)
                ]
            )
            event_rows = [ref + e for e in stored]
        base = mutation.entity or before
        assert base is not None, "a mutation that creates an entity must return its record"
        after = advanced(base, head + len(stored), ctx)
        commit = Commit(ref, ctx.txid, ctx.now_ms, stored, before, after, mutation.result)
        response = write.encode(commit) if write.encode is not None else None
    idem = write.idempotency
    idempotency_row = None
    if idem is not None and response is not None:
        idempotency_row = (ref[0], ref[1], idem.key, idem.request_hash, response, ctx.now_ms)
    return Applied(WriteOutcome(commit, response, False), after, event_rows, idempotency_row)
