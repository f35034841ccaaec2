"""Deadlines that survive restarts: the SIGTERM grace reaper, and key expiry.

Every `stopping` entity carries its grace deadline in the store (and in its
`stopping` state event). The reaper keeps them in a heap, loaded from the
store at start (so a restart re-arms them), fed by commits while running,
and by a poll of the store (``due_deadlines``, at least every 500 ms, by the
store's clock) for the deadlines of entities stopped through other replicas
or left by a replica that died; when one passes it writes stopping → stopped
with cause ``grace_expired``. The write re-checks state and deadline inside
the entity's serialized write (a compare-and-set), so an entity killed or
cleaned up meanwhile is left alone, and two replicas write the expiry once.

An exec entity whose process is still running at its deadline is being
forced by its runtime at that moment: `stopped` waits for the process's
``exit`` receipt, or at most ``EXIT_SETTLE_MS`` past the deadline, so that a
watcher never sees `stopped` while the process lives (until then the entity
is `stopping` past its deadline, and its receipts say the process is
exiting). The expiry's own transaction judges it (``expire_grace``: the
entity's ``process_running`` and its lease holder's liveness), so whichever
replica's reaper writes it waits alike. ``killed`` needs no such wait: SIGKILL's own transaction writes it.

It also forgets idempotency keys older than the retention (at least 24 h),
and runtime writes' request keys after an hour (runtime/answers.py).

A write the store refuses (a full disk: the store has said so) or that fails
is tried again a second later, for the same deadline; nothing ends the
reaper but ``stop``. The reaper is a component of the server (app.py): entered,
it arms the stored deadlines and runs its loop in a task group of its own; left,
its loop ends between two writes and the group is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Callable

from electric_sdk.lifecycle import STATE_RULES

from ..clock import SYSTEM_CLOCK, Clock, wake_on_advance
from ..lifetime import Component, TaskGroup
from ..settings import POLL, SETTLE
from ..store.base import Commit, Ref, StorageFault, Store, Write, WriteOutcome
from . import entity_writes
from .validation import REQUEST_KEY_PREFIX, REQUEST_KEY_RETENTION_MS

log = logging.getLogger(__name__)

PURGE_INTERVAL_S = 3600.0
RETRY_MS = 1000
POLL_PAGE = 256  # due deadlines asked of the store at once (every `electric server --poll`)
# How long past its grace deadline a stopping entity's `stopped` waits for its process's exit
# receipt, by default: the server's one settle (ServerConfig.settle_ms, `electric server --settle`),
# which also bounds the closing records a runtime may write after the end.
EXIT_SETTLE_MS = SETTLE.value


class Reaper(Component):
    def __init__(
        self,
        store: Store,
        idempotency_retention_ms: int,
        settle_ms: int = EXIT_SETTLE_MS,
        poll_ms: int = POLL.value,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        # Deadlines are judged by it (clock.py); a test's manual clock wakes the reaper when it jumps.
        self.clock = clock
        self._unadvance: Callable[[], None] = lambda: None
        self.poll_s = poll_ms / 1000
        self.retention_ms = idempotency_retention_ms
        self.settle_ms = settle_ms
        self._heap: list[tuple[int, Ref, int]] = []  # (when due, entity, its grace deadline)
        self._armed: set[tuple[Ref, int]] = set()  # the (entity, deadline) pairs in the heap
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._tasks = TaskGroup("the reaper")
        self._unsubscribe: Callable[[], None] = lambda: None
        self.expired = 0  # grace expiries written, for tests and status
        # Told, for each expiry written, how many seconds past its deadline it was (the metrics).
        self.expired_late: Callable[[float], None] = lambda _seconds: None
        # Entities past their deadline whose `stopped` waits for their process: ref → grace deadline.
        self._waiting: dict[Ref, int] = {}

    def _on_commit(self, commit: Commit) -> None:
        after = commit.after
        if (
            after is not None
            and STATE_RULES[after.state].cleanup
            and after.stopping_deadline_ms is not None
            and (commit.before is None or commit.before.stopping_deadline_ms != after.stopping_deadline_ms)
        ):
            self._push(after.stopping_deadline_ms, after.ref)
        if (deadline := self._waiting.get(commit.ref)) is not None:
            self._push(
                deadline, commit.ref, self.clock.now_ms()
            )  # perhaps its exit receipt, or its lease's end

    @property
    def pending_deadlines(self) -> int:
        """Entities with a grace deadline armed (one killed meanwhile counts until it is due)."""
        return len({ref for _, ref, _ in self._heap})

    def _push(self, deadline_ms: int, ref: Ref, due_ms: int | None = None) -> None:
        due = deadline_ms if due_ms is None else due_ms
        heapq.heappush(self._heap, (due, ref, deadline_ms))
        self._armed.add((ref, deadline_ms))
        if self._heap[0][0] == due:
            self._wakeup.set()

    async def start(self) -> None:
        # Commits are heard from before the deadlines are read: none lands between unheard.
        self._unsubscribe = self.store.hub.subscribe_all(self._on_commit)
        for ref, deadline in await self.store.stopping_deadlines():
            self._push(deadline, ref)
        log.info("reaper armed with %d grace deadline(s)", len(self._heap))
        self._unadvance = wake_on_advance(self.clock, self._wakeup.set)
        self._tasks.start_soon(self._run(), name="electric-reaper")

    async def stop(self) -> None:
        self._unsubscribe()
        self._unadvance()
        # Between its writes and polls (cancelled in a query, it would hand the PostgreSQL
        # pool a connection still busy with it).
        self._stopping = True
        self._wakeup.set()
        await self._tasks.wait()
        await self._tasks.aclose()

    async def _run(self) -> None:
        # The polls and purges keep real time: they are work to do, not deadlines to judge.
        next_purge = time.monotonic()
        next_poll = time.monotonic()
        while not self._stopping:
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + self.poll_s
                await self._poll()
            now = self.clock.now_ms()
            due: list[tuple[int, Ref, int]] = []
            while self._heap and self._heap[0][0] <= now:
                entry = heapq.heappop(self._heap)
                self._armed.discard((entry[1], entry[2]))
                due.append(entry)
            if due:
                await self._expire([(ref, deadline) for _, ref, deadline in due])
            if time.monotonic() >= next_purge:
                next_purge = time.monotonic() + PURGE_INTERVAL_S
                try:
                    purged = await self.store.purge_idempotency(self.retention_ms)
                    purged += await self.store.purge_idempotency(REQUEST_KEY_RETENTION_MS, REQUEST_KEY_PREFIX)
                except StorageFault:
                    purged = 0  # the store has said why; the next purge will do
                except Exception:  # a bug must not end the reaper (nor its server's stop)
                    log.exception("the purge of old idempotency keys failed")
                    purged = 0
                if purged:
                    log.info("forgot %d idempotency key(s) older than the retention", purged)
            timeout = max(0.0, next_poll - time.monotonic())
            if self._heap:
                timeout = min(timeout, max(0.0, (self._heap[0][0] - self.clock.now_ms()) / 1000))
            if self._stopping:
                return
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout)

    async def _poll(self) -> None:
        """Arm the deadlines the store finds due that this reaper does not hold already."""
        try:
            found = await self.store.due_deadlines(POLL_PAGE)
        except StorageFault:
            return  # the store has said why; the next poll will do
        except Exception:  # a bug must not end the reaper
            log.exception("the poll for due grace deadlines failed")
            return
        for ref, deadline in found:
            if (ref, deadline) not in self._armed:
                self._push(deadline, ref, self.clock.now_ms())

    async def _expire(self, due: list[tuple[Ref, int]]) -> None:
        writes = [
            Write(ref, entity_writes.expire_grace(ref, deadline, self.settle_ms)) for ref, deadline in due
        ]
        outcomes: list[WriteOutcome | BaseException]
        try:
            outcomes = await self.store.write_many(writes)
        except Exception as exc:  # refused at once, e.g. while the disk is full
            outcomes = [exc] * len(writes)
        for (ref, deadline), outcome in zip(due, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, StorageFault):  # a storage fault: the store has logged it
                    log.error("grace expiry of %s/%s failed: %s", *ref, outcome)
                self._push(deadline, ref, self.clock.now_ms() + RETRY_MS)  # the same deadline, a second later
            elif outcome.commit is not None:
                self._waiting.pop(ref, None)
                self.expired += 1
                self.expired_late(max(0, outcome.commit.timestamp_ms - deadline) / 1000)
            elif await self._waits_for_exit(ref, deadline):
                # Any commit of it is looked at again (its exit receipt?), and the settle's end.
                if ref not in self._waiting:
                    self._waiting[ref] = deadline
                    self._push(deadline, ref, deadline + self.settle_ms)
            else:
                self._waiting.pop(ref, None)

    async def _waits_for_exit(self, ref: Ref, deadline: int) -> bool:
        """Whether an expiry that wrote nothing waits for the exec process's exit
        (``expire_grace``), rather than finding the entity moved on."""
        if self.clock.now_ms() >= deadline + self.settle_ms:
            return False
        try:
            record = await self.store.get_entity(ref)
        except StorageFault:
            return True  # looked at again at the settle's end at the latest
        return record is not None and record.stopping_deadline_ms == deadline and record.process_running
