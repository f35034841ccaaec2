"""The PostgreSQL store's session book: every replica's worker sessions, in two tables.

A session row lives until its ``expires_at``; its replica's row likewise.
Both are renewed by the replica's heartbeat (one statement for the replica
and all its sessions, however many leases they hold), and judged by
PostgreSQL's clock, so replicas whose clocks differ agree on who is live.
A holder whose session or replica expired is not live: any replica may then
end its leases (``lost_leases``) and grant them anew. The rows of a replica
killed (and of its sessions) stay behind expired; a hello deletes those
expired more than an hour ago (``FORGET_AFTER_MS``), so a replica that
crashes again and again leaves no growing table.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

from ..sessions import LiveSession, SessionBook, SessionRow
from .statements import (
    ANNOUNCE_SESSION,
    END_REPLICA,
    END_REPLICA_SESSIONS,
    END_SESSIONS,
    END_WORKER_SESSIONS,
    FORGET_REPLICAS,
    FORGET_SESSIONS,
    INSERT_SESSION,
    RENEW_REPLICA,
    RENEW_REPLICA_AND_SESSIONS,
)

__all__ = ["PostgresSessions"]

# Live as a holder is (postgres/statements.py's _HOLDER_LIVE): the session and its replica unexpired.
# Its last heartbeat is its expiry less the renewal's span ($1 ms); its leases are counted
# from the holder index, so the listing costs one index probe per session.
LIVE_SESSIONS = (
    "SELECT s.id, s.worker_id, s.replica, s.types, s.code_version, s.capacity, "
    "(extract(epoch FROM s.expires_at) * 1000)::bigint - $1::bigint, "
    "(SELECT count(*) FROM entities e WHERE e.lease_session = s.id) "
    "FROM sessions s JOIN replicas r ON r.id = s.replica "
    "WHERE s.expires_at > clock_timestamp() AND r.expires_at > clock_timestamp() "
    "ORDER BY s.worker_id, s.id"
)
# The live ones of some holders: the same test of liveness, on their ids.
LIVE_HOLDERS = (
    "SELECT s.id, s.worker_id, s.replica, s.types, s.code_version, s.capacity "
    "FROM sessions s JOIN replicas r ON r.id = s.replica "
    "WHERE s.id = ANY($1::text[]) AND s.expires_at > clock_timestamp() AND r.expires_at > clock_timestamp()"
)

Connect = Callable[[str], AbstractAsyncContextManager[Any]]
# How long the rows of an expired session or replica are kept (a hello forgets older ones).
FORGET_AFTER_MS = 3_600_000


class PostgresSessions(SessionBook):
    shared = True

    def __init__(self, connection: Connect, wrote: Callable[[], None] = lambda: None) -> None:
        self._connection = connection  # the store's pooled connection (faults → DatabaseUnavailable)
        self._wrote = wrote  # told when a heartbeat commits: the database takes writes
        self.forget_after_ms = FORGET_AFTER_MS

    async def open(self, session: SessionRow, ttl_ms: int) -> list[str]:
        async with self._connection("a worker session's start") as conn, conn.transaction():
            await conn.execute(RENEW_REPLICA, session.replica, ttl_ms)
            ended = await conn.fetch(END_WORKER_SESSIONS, session.worker_id)
            await conn.execute(INSERT_SESSION, *session[:3], list(session.types), *session[4:], ttl_ms)
            await conn.execute(FORGET_SESSIONS, self.forget_after_ms)
            await conn.execute(FORGET_REPLICAS, self.forget_after_ms)
        return [str(row[0]) for row in ended]

    async def announce(self, session_id: str, types: tuple[str, ...], code_version: str) -> None:
        async with self._connection("a worker's new code version") as conn:
            await conn.execute(ANNOUNCE_SESSION, session_id, list(types), code_version)

    async def renew(self, replica: str, session_ids: Collection[str], ttl_ms: int) -> set[str]:
        async with self._connection("a replica's heartbeat") as conn:
            rows = await conn.fetch(RENEW_REPLICA_AND_SESSIONS, replica, list(session_ids), ttl_ms)
        self._wrote()
        return {str(row[0]) for row in rows}

    async def end(self, session_ids: Iterable[str]) -> None:
        ids = list(session_ids)
        if ids:
            async with self._connection("the end of worker sessions") as conn:
                await conn.execute(END_SESSIONS, ids)

    async def end_replica(self, replica: str) -> None:
        async with self._connection("a replica's end") as conn, conn.transaction():
            await conn.execute(END_REPLICA_SESSIONS, replica)
            await conn.execute(END_REPLICA, replica)

    async def live(self, ttl_ms: int) -> list[LiveSession]:
        async with self._connection("the list of workers") as conn:
            rows = await conn.fetch(LIVE_SESSIONS, ttl_ms)
        return [LiveSession(_row(r), int(r[6]), int(r[7])) for r in rows]

    async def holders(self, session_ids: Collection[str]) -> dict[str, SessionRow]:
        ids = sorted(set(session_ids))
        if not ids:
            return {}
        async with self._connection("the holders of leases") as conn:
            rows = await conn.fetch(LIVE_HOLDERS, ids)
        return {str(r[0]): _row(r) for r in rows}


def _row(r: Any) -> SessionRow:
    return SessionRow(r[0], r[1], r[2], tuple(r[3]), r[4], r[5])
