"""Which workers are connected, and which entity types none of them hosts.

The connected workers are the store's session book (store/sessions.py): on
PostgreSQL every replica's rows, so ``ListWorkers`` answers cluster-wide; on
SQLite the one server's book, whose leases its runtime counts.

An entity whose type no connected worker hosts waits in ``spawning`` (or with
its messages undelivered) until one connects, and nothing else says why: the
server log says so once per type (not per entity) when a spawn or a message
arrives for such a type, and again only after a worker hosting it was seen.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable, Mapping, Sized
from typing import Protocol

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._wire.workers import worker_to_pb

from ..settings import LEASE_TTL
from ..store.base import EntityRecord, StorageFault, Store, VersionChoice
from ..store.sessions import LiveSession, SessionRow

__all__ = ["LocalRuntime", "LocalSession", "Presence"]

log = logging.getLogger(__name__)

# How long the hosted types read from the book answer arrivals: a burst of spawns of one type
# costs the store one read, and a worker that just connected is seen within this.
HOSTED_CACHE_S = 1.0


class LocalSession(Protocol):
    """A worker session connected to this replica, as presence reads it."""

    @property
    def id(self) -> str: ...
    @property
    def types(self) -> Collection[str]: ...
    @property
    def leases(self) -> Sized: ...


class LocalRuntime(Protocol):
    """What presence asks of this replica's runtime (``runtime.hosting.Runtime``): the core is
    below the runtime, so it names only what it reads."""

    @property
    def lease_ttl_ms(self) -> int: ...
    @property
    def sessions(self) -> Mapping[str, LocalSession]: ...
    def version_chosen(self, choice: VersionChoice) -> None: ...


class Presence:
    def __init__(self, store: Store, runtime: LocalRuntime | None) -> None:
        self.store = store
        self.runtime = runtime
        self._warned: set[str] = set()
        self._hosted: frozenset[str] = frozenset()
        self._hosted_at = -HOSTED_CACHE_S

    async def workers(self) -> list[api.Worker]:
        ttl_ms = self.runtime.lease_ttl_ms if self.runtime else LEASE_TTL.value
        return [self._to_pb(s) for s in await self.store.sessions.live(ttl_ms)]

    def _to_pb(self, live: LiveSession) -> api.Worker:
        row, leases = live.row, live.leases
        if leases is None:  # a book that is one server: its runtime holds every lease
            local = self.runtime.sessions.get(row.worker_id) if self.runtime else None
            leases = len(local.leases) if local is not None and local.id == row.id else 0
        return worker_to_pb(
            row.worker_id, row.replica, row.types, row.code_version, row.capacity, leases, live.heartbeat_ms
        )

    async def holders(self, records: Iterable[EntityRecord]) -> dict[str, SessionRow]:
        """The live worker sessions holding these entities' leases, by session id (a lease whose
        session ended or expired has no holder, whatever its row still names)."""
        held = {r.lease_session for r in records if r.lease_session}
        return await self.store.sessions.holders(held) if held else {}

    async def hosted_types(self) -> frozenset[str]:
        """The types some connected worker hosts, on any replica."""
        ttl_ms = self.runtime.lease_ttl_ms if self.runtime else LEASE_TTL.value
        return frozenset(t for s in await self.store.sessions.live(ttl_ms) for t in s.row.types)

    async def arrived(self, type_: str, what: str) -> None:
        """A spawn or a message (``what``) arrived for an entity of ``type_``: warn, once per
        type, when no connected worker hosts it."""
        runtime = self.runtime
        if runtime is not None and any(type_ in s.types for s in runtime.sessions.values()):
            self._warned.discard(type_)
            return
        if type_ in self._warned:
            return
        if time.monotonic() - self._hosted_at > HOSTED_CACHE_S:
            try:
                self._hosted = await self.hosted_types()
            except StorageFault:
                return  # the write went through; this note is not worth a failed call
            self._hosted_at = time.monotonic()
        if type_ not in self._hosted:
            self._warned.add(type_)
            log.warning(
                "%s for type %r, which no connected worker hosts: its entities wait until one does "
                "(`electric workers` lists them)",
                what,
                type_,
            )
