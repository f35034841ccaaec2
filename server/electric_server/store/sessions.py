"""Worker sessions and lease holders: what "is this entity leased" means, on every store.

A lease is two columns of the entity's row: ``lease_epoch`` (the fencing
token) and ``lease_session`` (the holder: a worker session's id, "" for none).
A holder is live while its session is: a row in the store's ``SessionBook``,
renewed by its replica's heartbeats and not expired, judged by the store's
clock (PostgreSQL's, on PostgreSQL). So the question is answered inside each
write's transaction (``WriteContext.live``, ``holds_lease``), never from one
replica's memory: a grant takes an entity only if nobody live holds it, and a
stream closes at the end only if no live runtime may still append to it.

On PostgreSQL the book is two tables (``sessions``, ``replicas``) that every
replica reads. SQLite is one server, whose sessions die with it: its book is
``MemorySessions``, the same interface in memory, and its holders are
forgotten when the file is opened (a restarted server leases anew).
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Iterable, Iterator
from typing import NamedTuple

from ..clock import SYSTEM_CLOCK, Clock
from .base import EntityRecord, WriteContext

__all__ = ["LiveSession", "MemorySessions", "SessionBook", "SessionRow", "holds_lease"]


class SessionRow(NamedTuple):
    """A worker session as the book keeps it."""

    id: str
    worker_id: str
    replica: str
    types: tuple[str, ...]
    code_version: str
    capacity: int


class LiveSession(NamedTuple):
    """A live session as ``electric workers`` shows it."""

    row: SessionRow
    heartbeat_ms: int  # wall clock, epoch ms: when its replica last renewed it
    # The entities whose holder it is; None where the book does not count them (one server:
    # its runtime's own leases are the whole count).
    leases: int | None


def holds_lease(record: EntityRecord, ctx: WriteContext) -> bool:
    """Whether a live runtime holds ``record``'s lease, as the write's transaction sees it."""
    return bool(record.lease_session) and record.lease_session in ctx.live


class SessionBook(abc.ABC):
    """The live worker sessions of every replica on one store."""

    # Whether other replicas share this book (PostgreSQL): a draining replica then hands its
    # leases over at once; alone (SQLite), its entities keep their leases' state for its restart.
    shared: bool = False

    @abc.abstractmethod
    async def open(self, session: SessionRow, ttl_ms: int) -> list[str]:
        """Start ``session``, live for ``ttl_ms``; any other session of its worker id, on any
        replica, ends at once (its leases' holder is no longer live). Returns the ids it ended."""

    @abc.abstractmethod
    async def announce(self, session_id: str, types: tuple[str, ...], code_version: str) -> None:
        """The session's worker now hosts ``types`` at ``code_version`` (its code changed)."""

    @abc.abstractmethod
    async def renew(self, replica: str, session_ids: Collection[str], ttl_ms: int) -> set[str]:
        """The replica's heartbeat: it and its sessions live ``ttl_ms`` more. Returns the ids
        still in the book (a session missing was ended elsewhere: a hello of its worker)."""

    @abc.abstractmethod
    async def end(self, session_ids: Iterable[str]) -> None:
        """These sessions ended: their leases' holders are no longer live."""

    @abc.abstractmethod
    async def end_replica(self, replica: str) -> None:
        """The replica stops: it and every session it had end."""

    @abc.abstractmethod
    async def live(self, ttl_ms: int) -> list[LiveSession]:
        """Every live session of every replica, by worker id (``ttl_ms``: the renewal's span)."""

    @abc.abstractmethod
    async def holders(self, session_ids: Collection[str]) -> dict[str, SessionRow]:
        """Of these lease holders (``EntityRecord.lease_session``), the live ones, by id: who
        holds an entity's lease, for a reader (a write judges it in its transaction instead)."""


class MemorySessions(SessionBook, Collection[str]):
    """The book of a store that is one server (SQLite): in memory, by the monotonic clock.

    A ``Collection`` of the live session ids, so it is a write's ``WriteContext.live``
    itself (read from the store's writer thread: one dict lookup, atomic under the GIL).
    """

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._expiry: dict[str, float] = {}
        self._rows: dict[str, SessionRow] = {}
        self._renewed_ms: dict[str, int] = {}

    def __contains__(self, session_id: object) -> bool:
        expiry = self._expiry.get(session_id) if isinstance(session_id, str) else None
        return expiry is not None and expiry > self._clock.monotonic()

    def __iter__(self) -> Iterator[str]:
        now = self._clock.monotonic()
        return iter([s for s, expiry in list(self._expiry.items()) if expiry > now])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    async def open(self, session: SessionRow, ttl_ms: int) -> list[str]:
        ended = [s.id for s in self._rows.values() if s.worker_id == session.worker_id]
        for session_id in ended:
            self._forget(session_id)
        self._rows[session.id] = session
        self._expiry[session.id] = self._clock.monotonic() + ttl_ms / 1000
        self._renewed_ms[session.id] = self._clock.now_ms()
        return ended

    async def announce(self, session_id: str, types: tuple[str, ...], code_version: str) -> None:
        row = self._rows.get(session_id)
        if row is not None:
            self._rows[session_id] = row._replace(types=types, code_version=code_version)

    async def renew(self, replica: str, session_ids: Collection[str], ttl_ms: int) -> set[str]:
        expiry = self._clock.monotonic() + ttl_ms / 1000
        kept = {s for s in session_ids if s in self._rows}
        renewed_ms = self._clock.now_ms()
        for session_id in kept:
            self._expiry[session_id] = expiry
            self._renewed_ms[session_id] = renewed_ms
        return kept

    async def end(self, session_ids: Iterable[str]) -> None:
        for session_id in session_ids:
            self._forget(session_id)

    async def end_replica(self, replica: str) -> None:
        await self.end([s.id for s in self._rows.values() if s.replica == replica])

    async def live(self, ttl_ms: int) -> list[LiveSession]:
        rows = sorted((self._rows[s] for s in self if s in self._rows), key=lambda r: r.worker_id)
        return [LiveSession(r, self._renewed_ms[r.id], None) for r in rows]

    async def holders(self, session_ids: Collection[str]) -> dict[str, SessionRow]:
        return {s: self._rows[s] for s in session_ids if s in self and s in self._rows}

    def _forget(self, session_id: str) -> None:
        self._rows.pop(session_id, None)
        self._expiry.pop(session_id, None)
        self._renewed_ms.pop(session_id, None)
