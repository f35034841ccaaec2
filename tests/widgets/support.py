"""Shared by the widget tests: a worker on its own thread, and waiting for what a widget shows."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from threading import Event as ThreadEvent
from typing import Any

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal
from runtime.rt_support import Probe, probe_app

from electric_sdk.runtime import Worker

TIMEOUT_S = 10.0


class ThreadedWorker:
    """The runtime tests' probe app, hosted by a real Worker on its own event-loop thread.

    As in a notebook, the worker's loop is not the test's thread, so a sync
    test can block (``Client`` calls, waiting for a widget) while entities run.
    ``probe`` is built on the worker's loop; touch its events through ``portal``.
    """

    def __init__(self, address: str, **profile: Any) -> None:
        self.address = address
        self.profile = profile
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None

    def __enter__(self) -> ThreadedWorker:
        self._portal_cm = start_blocking_portal()
        self.portal = self._portal_cm.__enter__()
        self.probe: Probe = self.portal.call(Probe)
        app = probe_app(self.probe, **self.profile)
        self.worker = self.portal.call(lambda: Worker(app, self.address))
        self._run, _ = self.portal.start_task(self.worker.run)
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._portal_cm is not None
        try:
            self.portal.call(self.worker.shutdown, 1.0)
            self._run.result(TIMEOUT_S)
        finally:
            self._portal_cm.__exit__(None, None, None)

    def release(self) -> None:
        """Let a held run ("hold") finish its step."""
        self.portal.call(self.probe.release.set)
        self.portal.call(self._rearm)

    async def _rearm(self) -> None:
        self.probe.release = anyio.Event()
        self.probe.entered = anyio.Event()

    def hold_cleanups(self) -> None:
        """SIGTERM cleanups wait for ``release_cleanups``: an entity stays `stopping` until then."""

        async def hold() -> None:
            self.probe.cleanup_release = anyio.Event()

        self.portal.call(hold)

    def release_cleanups(self) -> None:
        assert self.probe.cleanup_release is not None
        self.portal.call(self.probe.cleanup_release.set)


@contextmanager
def _observing(
    widget: Any, trait: str, predicate: Callable[[Any], bool], reached: Callable[[], None]
) -> Iterator[None]:
    """Call ``reached`` once ``predicate(widget.<trait>)`` holds: now, or at a later change of the trait."""

    def check(_change: object = None) -> None:
        if predicate(getattr(widget, trait)):
            reached()

    widget.observe(check, trait)
    try:
        check()
        yield
    finally:
        widget.unobserve(check, trait)


def wait_for(widget: Any, trait: str, predicate: Callable[[Any], bool], timeout: float = TIMEOUT_S) -> Any:
    """Block until ``predicate(widget.<trait>)`` holds; returns the trait's value then."""
    reached = ThreadEvent()
    with _observing(widget, trait, predicate, reached.set):
        if not reached.wait(timeout):
            raise AssertionError(
                f"{type(widget).__name__}.{trait} never matched; it is {getattr(widget, trait)!r}"
            )
    return getattr(widget, trait)


async def await_for(widget: Any, trait: str, predicate: Callable[[Any], bool]) -> Any:
    """``wait_for`` for a widget whose updates arrive on the running loop (the test's own)."""
    reached = anyio.Event()
    with _observing(widget, trait, predicate, reached.set), anyio.fail_after(TIMEOUT_S):
        await reached.wait()
    return getattr(widget, trait)


def wait_until(condition: Callable[[], bool], timeout: float = TIMEOUT_S) -> None:
    """For facts with no event to wait on (the server's count of open watches): re-check until true."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition never became true")
        ThreadEvent().wait(0.01)  # a short pause between checks of a bounded wait


def enabled(buttons: dict[Any, Any]) -> set[Any]:
    """The signals whose buttons can be clicked now."""
    return {signal for signal, button in buttons.items() if not button.disabled}
