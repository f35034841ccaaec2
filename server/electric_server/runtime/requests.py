"""A worker's requests on its session: fenced writes, releases and drains, applied as they come.

Requests are not awaited one by one: a fan-out (a SIGHUP to thousands of entities) has thousands
of writes in flight at once, and the store commits them together instead of one fsync each. Per
entity, a worker's requests still apply in the order it sent them: one waits for the session's
previous request on that entity (``WorkerSession.tails``). Each runs as a task of the runtime's
group (hosting.py), so a drain cancels them all and the runtime's stop awaits them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt

from ..core import validation as v
from ..core.errors import invalid_argument
from ..store.base import Ref, Write, WriteOutcome
from .announcements import check_hosting
from .answers import check_write, fill, replayed, request_key, result_bytes
from .local_leases import WorkerSession
from .writes import marked, runtime_write

if TYPE_CHECKING:
    from .hosting import Runtime


class WorkerRequests:
    """What this replica's workers ask on their sessions, applied for the ``runtime``."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def read(self, session: WorkerSession, requests: AsyncIterator[rt.ConnectRequest]) -> None:
        try:
            async for request in requests:
                session.last_seen = self.runtime.clock.monotonic()
                if request.WhichOneof("msg") == "batch":
                    self.handle(session, request.batch.requests)
                else:
                    self.handle(session, (request,))
        finally:
            session.outbox.put_nowait(None)  # the worker hung up: end the response stream too

    def handle(self, session: WorkerSession, requests: Iterable[rt.ConnectRequest]) -> None:
        """Start applying a worker's requests, without waiting for them (see the module's docstring)."""
        together: list[rt.RuntimeWrite] = []  # writes with nothing ahead of them: one store call
        together_refs: list[Ref] = []
        task: asyncio.Task[None] | None = None
        for request in requests:
            kind = request.WhichOneof("msg")
            if kind == "drain":
                session.draining = True
            elif kind == "release":
                ref = v.ref(request.release.ref)
                epoch = v.int64(request.release.epoch, "release.epoch")
                self.after_tail(session, ref, self.release(session, ref, epoch))
            elif kind == "announce":
                check_hosting(
                    request.announce.types, request.announce.code_version, session.principal, "announce"
                )
                self._track(session, self.runtime.announce(session, request.announce), [])
            elif kind in ("hello", "batch"):
                # The reader task's error ends the session with this status (see Connect).
                raise invalid_argument(
                    "UNEXPECTED_REQUEST",
                    "hello comes once, first; a batch holds no hello and no batch",
                    request=kind,
                )
            elif kind == "write":
                write = request.write
                check_write(write)
                ref = (write.ref.type, write.ref.id)
                if ref in session.tails:
                    self.after_tail(session, ref, self._answer(session, [write]))
                    continue
                if task is None:
                    task = self._track(session, self._answer(session, together), together_refs)
                together.append(write)
                together_refs.append(ref)
                session.tails[ref] = task

    def after_tail(self, session: WorkerSession, ref: Ref, step: Coroutine[Any, Any, None]) -> None:
        """Run ``step`` once the session's request ahead of it on ``ref`` is done."""
        before = session.tails.get(ref)

        async def chained() -> None:
            if before is not None and not before.done():
                await asyncio.wait([before])
            await step

        task = self._track(session, chained(), [ref])
        # A task cancelled before its step's turn (the server drains, even before the task first
        # ran) never awaits the step: close it, or it is reported as never awaited. Once the task
        # is done, the step has finished or never started, so closing it is always safe.
        task.add_done_callback(lambda _: step.close())
        session.tails[ref] = task

    def _track(
        self, session: WorkerSession, coro: Coroutine[Any, Any, None], refs: list[Ref]
    ) -> asyncio.Task[None]:
        """A task applying requests on ``refs`` (filled in until it first runs), the tail of each."""
        task = self.runtime.spawn(coro)

        def untrack(done: asyncio.Task[None]) -> None:
            for ref in refs:
                if session.tails.get(ref) is done:
                    del session.tails[ref]

        task.add_done_callback(untrack)
        return task

    async def release(self, session: WorkerSession, ref: Ref, epoch: int) -> None:
        lease = session.leases.get(ref)
        if lease is not None and lease.epoch == epoch:
            await self.runtime.end(lease, "released")

    async def _answer(self, session: WorkerSession, writes: list[rt.RuntimeWrite]) -> None:
        """Apply fenced writes (each its own commit, all in one store call) and answer each."""
        store = self.runtime.store
        results = [rt.WriteResult(request_id=write.request_id) for write in writes]
        staged: list[tuple[rt.WriteResult, Write]] = []
        for write, result in zip(writes, results, strict=True):
            ref = (write.ref.type, write.ref.id)
            idem = request_key(write)
            lease = session.leases.get(ref)
            if lease is None or lease.epoch != write.epoch:
                # A retry of a write whose answer was lost (its session with it) gets that answer.
                if idem is None or not await replayed(store, ref, idem, result):
                    result.reason, result.message = "STALE_EPOCH", "this worker does not hold that lease"
                continue
            unsettled = dict(lease.unsettled) if write.release else None
            decide = runtime_write(ref, write, lease.inserts((write,)), unsettled)
            staged.append((result, Write(ref, marked(decide), idem, result_bytes if idem else None)))
        if staged:
            outcomes: list[WriteOutcome | BaseException]
            try:
                if len(staged) == 1:  # alone: committed in this task when the store is idle
                    outcomes = [await store.write(staged[0][1])]
                else:
                    outcomes = await store.write_many([w for _, w in staged])
            except Exception as exc:  # e.g. the store is closing: every write says so
                outcomes = [exc] * len(staged)
            for (result, _), outcome in zip(staged, outcomes, strict=True):
                fill(result, outcome)
        for result in results:
            session.send(rt.ConnectResponse(write_result=result))
