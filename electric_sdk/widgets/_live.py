"""Live updates: streams on the client's event loop, changes applied on the widgets' thread.

Two threads are involved, and widget state is only touched from one of them:

- The client's loop runs every call and watch stream: the sync ``Client``'s
  portal thread, or the ``AsyncClient``'s own loop (grpc.aio binds a channel
  to its loop, so nothing else may use it).
- The widgets' thread is the one that created the widget. In Jupyter and
  Voilà it runs the kernel's event loop, and the front end's comm messages
  (button clicks) arrive on it; changes are handed to it with
  ``call_soon_threadsafe``. Where no loop runs there (a script, a sync test),
  changes are applied at once, under a lock that click handlers hold too.

Throttling: a stream only updates the facts and marks the widget changed; a
flusher on the client's loop hands the widgets at most one refresh per
interval, built from the latest facts, so a burst of events costs one redraw.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import anyio

from ..client import AsyncClient, Client
from ..errors import WrongEventLoop

T = TypeVar("T")
Source = Callable[[], Awaitable[None]]


class ClientLoop:
    """Where a client's coroutines run: the ``Client``'s portal thread or the ``AsyncClient``'s loop."""

    def __init__(self, client: Client | AsyncClient) -> None:
        if isinstance(client, Client):
            self.aio = client.aio
            self.loop: asyncio.AbstractEventLoop = client._portal.call(asyncio.get_running_loop)
        elif isinstance(client, AsyncClient):
            self.aio = client
            loop = client._loop
            if loop is None:  # not used yet: it will belong to the loop running here
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    raise WrongEventLoop(
                        "this AsyncClient has no event loop yet: create the widget where its loop runs "
                        "(a notebook cell, or a coroutine), or pass a sync Client"
                    ) from None
            self.loop = loop
        else:
            raise TypeError(f"expected a Client or an AsyncClient, got {type(client).__name__}")

    def submit(self, func: Callable[[], Awaitable[T]]) -> concurrent.futures.Future[T]:
        """Run ``func()`` on the client's loop from any thread; cancelling the future cancels it."""

        async def call() -> T:
            return await func()

        coroutine: Coroutine[Any, Any, T] = call()
        try:
            return asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        except RuntimeError:  # the loop is closed: the client was closed
            coroutine.close()
            raise

    def is_current(self) -> bool:
        """Whether the calling thread is the one running the client's loop."""
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False


class UiThread:
    """Applies changes to widgets on the thread that created them (see the module's docstring)."""

    def __init__(self) -> None:
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._lock = threading.RLock()

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the widgets' thread: soon, from any thread; or now, where no loop runs there."""
        if self._loop is None:
            self.run(fn)
            return
        # A closed loop: the kernel that showed the widget is gone, and nobody looks any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self.run, fn)

    def run(self, fn: Callable[[], None]) -> None:
        with self._lock:
            fn()

    def handler(self, fn: Callable[[], None]) -> Callable[[Any], None]:
        """A click handler (``on_click`` passes the button) that holds the lock the updates hold."""
        return lambda _button: self.run(fn)


class Feed:
    """One widget's streams on the client's loop, and their throttled way to the widgets.

    ``refresh()`` is called on the client's loop; it reads the latest facts and
    returns what to apply on the widgets' thread. ``ticking()`` says whether to
    refresh every ``tick_s`` (default: the interval) even without news (a
    countdown on screen, or times shown as "12s ago").
    ``on_error`` gets a stream's unexpected failure, to show it in the widget.
    """

    def __init__(
        self,
        client: ClientLoop,
        ui: UiThread,
        *,
        interval_s: float,
        refresh: Callable[[], Callable[[], None]],
        on_error: Callable[[BaseException], None],
        ticking: Callable[[], bool] = lambda: False,
        tick_s: float | None = None,
    ) -> None:
        self.client = client
        self.ui = ui
        self.interval_s = interval_s
        self.tick_s = interval_s if tick_s is None else max(tick_s, interval_s)
        self._refresh = refresh
        self._on_error = on_error
        self._ticking = ticking
        self._changed: anyio.Event | None = None
        # Only touched on the client's loop: closing is a call made there, so it is ordered
        # with the start whichever comes first.
        self._scope: anyio.CancelScope | None = None
        self._closing = False
        self._started = False
        # Set once the streams have ended (closed, cancelled or failed), on the client's loop.
        self.stopped = threading.Event()

    def start(self, *sources: Source) -> None:
        async def run() -> None:
            await self._run(sources)

        try:
            self.client.submit(run)
        except RuntimeError as exc:
            self.stopped.set()
            self._on_error(exc)
            self.ui.call(self._refresh())
            return
        self._started = True

    def changed(self) -> None:
        """A stream changed the facts (called on the client's loop)."""
        if self._changed is not None:
            self._changed.set()

    def refresh_now(self) -> None:
        """From any thread: refresh at once, not at the throttle's pace (a person changed a
        filter or a page, and waits to see it)."""

        def refresh() -> None:
            self.ui.call(self._refresh())

        with contextlib.suppress(RuntimeError):  # the client's loop is closed: nothing to show
            self.client.loop.call_soon_threadsafe(refresh)

    async def _run(self, sources: tuple[Source, ...]) -> None:
        self._changed = anyio.Event()
        try:
            with anyio.CancelScope() as self._scope:
                if self._closing:  # closed before the streams got going
                    return
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._flusher)
                    async with anyio.create_task_group() as streams:
                        for source in sources:
                            streams.start_soon(self._guarded, source)
                    tg.cancel_scope.cancel()
                self.ui.call(self._refresh())  # the last facts, which the throttle may have held back
        finally:
            self.stopped.set()

    async def _guarded(self, source: Source) -> None:
        try:
            await source()
        except Exception as exc:  # shown in the widget: a notebook user gets a line, not a traceback
            self._on_error(exc)
            self.changed()

    async def _flusher(self) -> None:
        while True:
            assert self._changed is not None
            with anyio.move_on_after(self.tick_s if self._ticking() else math.inf):
                await self._changed.wait()
            # Nothing runs between the wake-up and taking the facts (no await): a change made
            # after them sets the new event, so the next refresh shows it; none is lost.
            self._changed = anyio.Event()
            self.ui.call(self._refresh())
            await anyio.sleep(self.interval_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Cancel the streams; from another thread than the client's loop, wait until they ended."""
        if not self._started:
            return

        def cancel() -> None:
            self._closing = True
            if self._scope is not None:
                self._scope.cancel()

        if self.client.is_current():
            cancel()
            return
        try:
            self.client.loop.call_soon_threadsafe(cancel)
        except RuntimeError:  # the client's loop is closed, and the streams ended with it
            return
        self.stopped.wait(timeout_s)


def act(
    client: ClientLoop,
    ui: UiThread,
    func: Callable[[], Awaitable[T]],
    report: Callable[[T | BaseException], None],
) -> None:
    """Run ``func()`` on the client's loop; ``report`` its result or its error on the widgets' thread."""
    try:
        future = client.submit(func)
    except RuntimeError as exc:  # the client is closed
        report(exc)
        return

    def done(f: concurrent.futures.Future[T]) -> None:
        if f.cancelled():
            return
        error = f.exception()
        outcome: T | BaseException = error if error is not None else f.result()
        ui.call(lambda: report(outcome))

    future.add_done_callback(done)
