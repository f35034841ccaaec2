"""The lease sweep: one replica's heartbeat, and the lease deadlines any live replica may fire.

Every ``poll`` (500 ms by default; ``electric server --poll``), each replica:

1. ends its own sessions whose worker missed its heartbeats (runtime_lost);
2. renews its row and its sessions' rows in the session book (one statement,
   however many leases they hold); a session missing from the book was ended
   elsewhere (its worker said hello to another replica) and is closed here
   (that hello ended the session's leases already: ``end_lost``);
3. ends the leases whose holder is no longer live (its session or replica
   expired: e.g. a replica killed with its workers' sessions), as runtime_lost;
4. closes the streams of ended entities that no live runtime may append to,
   or whose settle is over (the terminal settle of a replica that died);
5. offers its workers the entities of their types that no live runtime holds
   (changes made through other replicas, found without waiting for a commit).

What 3 to 5 act on is found by one read (``Store.sweep_finds``), before any of them writes.
The runtime enters the sweep (hosting.py): entering sweeps once, then polls in a task group of
the sweep's own; leaving ends the polls between two sweeps.

Each is found by the store's clock and claimed with ``FOR UPDATE SKIP LOCKED``
on PostgreSQL, and each write is a compare-and-set decided again inside its
transaction (``end_lease`` on the epoch, ``close_ended`` on the holder's
liveness), so two replicas firing the same deadline write it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType
from typing import TYPE_CHECKING

from electric_sdk.lifecycle import HOSTED_STATES

from ..lifetime import TaskGroup
from ..log_throttle import LogThrottle
from ..store.base import EntityRecord, Ref, StorageFault, Write
from .writes import close_ended, end_lease

if TYPE_CHECKING:
    from .hosting import Runtime

log = logging.getLogger(__name__)

# A sweep failing for the store's fault (a database away or read-only) says so at most this often;
# the store's own log says why.
FAULT_LOG_INTERVAL_S = 10.0
_PAGE = 256  # deadlines fired per kind and poll


class LeaseSweep:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        # Set to end ``run`` between polls: cancelling it in a query would hand the pool a
        # connection still busy with it.
        self.stopping = asyncio.Event()
        # Rung to sweep before the next poll: the end, or a test's clock jumped (clock.py).
        self._bell = asyncio.Event()
        self._faults = LogThrottle(FAULT_LOG_INTERVAL_S)
        self.polls = 0  # sweeps run, done or failed
        self.swept = asyncio.Event()  # set at the end of the next sweep (then a new one: tests wait)
        self._tasks = TaskGroup("the lease sweep")

    async def __aenter__(self) -> LeaseSweep:
        await self.once()
        self._tasks.start_soon(self.run(), name="electric-lease-sweep")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        await self._tasks.wait()  # between two sweeps (see ``stopping``)
        await self._tasks.aclose()

    def stop(self) -> None:
        self.stopping.set()
        self._bell.set()

    def wake(self) -> None:
        self._bell.set()

    async def run(self) -> None:
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._bell.wait(), self.runtime.poll_s)
            self._bell.clear()
            if self.stopping.is_set():
                return
            try:
                await self.once()
            except StorageFault as exc:  # the database is away: the next poll tries again
                left_out = self._faults.admit(type(exc).__name__)
                if left_out is not None:  # (a poll twice a second would say it twice a second)
                    more = f" ({left_out} more since the last such line)" if left_out else ""
                    log.warning("the lease sweep failed: %s%s", exc, more)
            except Exception:  # a bug must not end the sweep for good
                log.exception("the lease sweep failed")
            self.polls += 1
            swept, self.swept = self.swept, asyncio.Event()
            swept.set()

    async def once(self) -> None:
        await self._own_sessions()
        runtime = self.runtime
        await runtime.versions.refresh()  # an operator's choice made on another replica
        types = sorted(
            {t for s in runtime.sessions.values() if not (s.closed or s.draining) for t in s.types}
        )
        # Found by one read (one statement on PostgreSQL, not three): every replica polls twice a
        # second, so each statement saved is two per second per replica on the shared database.
        found = await runtime.store.sweep_finds(runtime.settle_ms, types, HOSTED_STATES, _PAGE)
        await self._lost_leases(found.lost)
        await self._settled_streams(found.settled)
        await self._offers(found.unleased)

    async def end_lost(self) -> None:
        """End now the leases whose holder is no longer live (a hello ended its worker's session on
        another replica), a page of them; what is left, or what the store refused, the poll ends."""
        try:
            lost = await self.runtime.store.lost_leases(_PAGE)
            await self._lost_leases(lost)
        except StorageFault as exc:
            log.warning("the leases of a worker's ended session are left to the sweep: %s", exc)
            self.wake()
            return
        if len(lost) >= _PAGE:
            self.wake()

    async def _own_sessions(self) -> None:
        runtime = self.runtime
        quiet_since = runtime.clock.monotonic() - runtime.lease_ttl_s
        for session in list(runtime.sessions.values()):
            if session.last_seen < quiet_since:
                log.warning("worker %s missed its heartbeats: its leases expire", session.worker_id)
                await runtime.close(session, "runtime_lost")
        live = [s for s in runtime.sessions.values() if not s.closed]
        kept = await runtime.store.sessions.renew(runtime.replica, [s.id for s in live], runtime.lease_ttl_ms)
        for session in live:
            if session.id not in kept and not session.closed:
                log.info("worker %s's session ended on another replica", session.worker_id)
                await runtime.close(session, "runtime_lost")

    async def _lost_leases(self, lost: list[tuple[Ref, int]]) -> None:
        store = self.runtime.store
        writes = []
        for ref, epoch in lost:
            # An ended entity's signals still pending get `ignored` with its stream's close.
            given = {e.key: e.signal for e in await self.runtime.pending_signals(ref)}
            writes.append(Write(ref, end_lease(ref, epoch, "runtime_lost", None, given)))
        if writes:
            log.info("%d lease(s) whose holder is no longer live end", len(writes))
            await store.write_many(writes)

    async def _settled_streams(self, settled: list[Ref]) -> None:
        runtime = self.runtime
        writes = []
        for ref in settled:
            if ref in runtime.leases:
                continue  # this replica's own: its settle ends the lease (Runtime._settle)
            pending = {e.key: e.signal for e in await runtime.pending_signals(ref)}
            writes.append(Write(ref, close_ended(pending, runtime.settle_ms)))
        if writes:
            await runtime.store.write_many(writes)

    async def _offers(self, unleased: list[EntityRecord]) -> None:
        runtime = self.runtime
        for record in unleased:
            if record.ref not in runtime.leases:
                await runtime.offer(record)
