"""The one place a task of the server starts: ``TaskGroup``, the tasks one component owns.

Every component of the server (watches, reaper, lease sweep, runtime, the HTTP door and its SSE
heartbeats, the gRPC door and its acceptors) is an async context manager that starts its tasks in
a group of its own and leaves the group when it is left: leaving cancels what still runs and
awaits every task, those they start meanwhile too, so nothing of a component outlives it.
``ElectricServer`` enters the components in one exit stack (app.py); ``Component`` makes a
start and a stop the entering and the leaving. A request that runs tasks of its own (an SSE
response, a worker's session) enters a group for as long as it runs. tests/test_lifetime_guard.py
fails on a task started anywhere else in the server (the store's own move here with its rewrite).

A task that crashes (ends with an exception, not cancelled) is logged at once with its traceback,
since a component may run for months before it is left, and raised again when the group is left
(``TasksCrashed``, an exception group of every crash), so neither a stop nor a failed start
hides it: `electric server` and `electric dev` then exit 70 (EX_SOFTWARE) after the drain. An
exception a component expects to end some of its tasks (the store's refusal of a write, which the
store reports itself) is no crash: the group is told so (``expected``), and such a task ends like
any other; one of a single task is better caught in its coroutine.

Why not ``asyncio.TaskGroup``, or anyio's, which the SDK uses: both belong to the task that
entered them (a child's crash cancels that task; anyio refuses to be left from another task),
while a server's components are entered by ``start()`` and left by ``stop()``, which callers
run as separate calls (``electric_sdk.testing`` runs each through its portal, as a task of its
own). Both also cancel every sibling when one task crashes, and a component's tasks serve
requests independent of one another (a worker's writes, accepted gRPC calls): one request's bug
would end them all. And those paths, run per call, need the task itself (a worker's requests on
one entity wait for the one ahead, runtime/requests.py), which anyio's ``start_soon`` does not
give; a plain task and a set cost a call nothing more than the loose tasks they replace.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Self, TypeVar

__all__ = ["Component", "TaskGroup", "TasksCrashed"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class TasksCrashed(ExceptionGroup[Exception]):
    """Tasks of a component crashed while it ran (a bug of the server's: each was logged with its
    traceback when it crashed); raised when the component is left, with every crash."""


class TaskGroup:
    """The tasks of one component (``owner`` names it in logs and errors); a task that ends with
    one of ``expected`` ends as it was meant to (see the module's docstring)."""

    __slots__ = ("_closed", "_crashes", "_tasks", "expected", "owner")

    def __init__(self, owner: str, expected: tuple[type[Exception], ...] = ()) -> None:
        self.owner = owner
        self.expected = expected
        self._tasks: set[asyncio.Task[Any]] = set()
        self._crashes: list[Exception] = []
        self._closed = False

    def __len__(self) -> int:
        """The tasks still running."""
        return len(self._tasks)

    @property
    def closed(self) -> bool:
        """Whether the group was left: no task starts in it any more."""
        return self._closed

    def start_soon(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T]:
        """Run ``coro`` as a task of this group; RuntimeError once the group was left."""
        if self._closed:
            coro.close()  # never to run: not reported as never awaited
            raise RuntimeError(f"{self.owner} has stopped: no task starts in it")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)  # the loop holds tasks weakly: the group keeps each until it ends
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        crash = task.exception()
        # (KeyboardInterrupt and SystemExit leave the loop by themselves: asyncio re-raises them.)
        if isinstance(crash, Exception) and not isinstance(crash, self.expected):
            log.error("%s: task %s crashed", self.owner, task.get_name(), exc_info=crash)
            self._crashes.append(crash)

    def cancel(self) -> None:
        """Cancel every task running now (they end at their next await); awaits nothing."""
        for task in tuple(self._tasks):
            task.cancel()

    async def wait(self) -> None:
        """Until every task has ended by itself, those they start meanwhile too. Cancels
        nothing: for a component whose tasks end on a word of their own (a loop that must not
        be cancelled inside a query), before it is left; bound it with ``asyncio.timeout``."""
        while self._tasks:
            await asyncio.wait(tuple(self._tasks))

    async def aclose(self) -> None:
        """Cancel the tasks left and await them all; raise the crashes of any task."""
        await self._end()
        self._raise_crashes()

    async def _end(self) -> None:
        # A task being cancelled may start another (a worker's session ending): until none is left.
        while self._tasks:
            running = tuple(self._tasks)
            for task in running:
                task.cancel()
            await asyncio.wait(running)
        self._closed = True

    def _raise_crashes(self) -> None:
        crashes, self._crashes = self._crashes, []
        if crashes:
            raise TasksCrashed(f"{self.owner}: {len(crashes)} task(s) crashed", crashes)

    async def __aenter__(self) -> TaskGroup:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._end()
        if exc is None:  # else that exception goes on; the crashes were logged as they happened
            self._raise_crashes()


class Component(abc.ABC):
    """A component whose entering is its ``start`` and whose leaving is its ``stop``. A start
    that fails is stopped before its error goes on, so ``stop`` undoes any part of a start."""

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def stop(self) -> None: ...

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
