"""Client: the synchronous facade over AsyncClient.

It owns a portal thread (an anyio blocking portal) running its own event
loop, creates its AsyncClient on that loop, and runs every call there. So it
works in a plain script and inside a running Jupyter kernel (whose loop is
busy in the calling thread) without nest_asyncio, and there is exactly one
implementation of each operation: the async one.
"""

from __future__ import annotations

import builtins
import functools
import threading
import warnings
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

import anyio
from anyio.from_thread import BlockingPortal

from .._portal import start_portal
from ..arguments import RefLike, SignalLike, StateLike
from ..code_versions import TypeVersions
from ..lifecycle import Stage
from ..models import (
    Entity,
    EntityChange,
    Event,
    EventPage,
    MessageReceipt,
    RunResult,
    SignalManyResult,
    SignalResult,
)
from ..presence import WorkerInfo
from ._async import AsyncClient
from ._options import ClientOptions, DurationLike

T = TypeVar("T")


@dataclass
class _Step:
    """One step of a sync iteration, as the portal's loop sees it (see Client._next)."""

    scope: anyio.CancelScope | None = None
    ended: anyio.Event | None = None
    abandoned: bool = False
    finished: bool = False


def _shutdown(portal: BlockingPortal, thread: threading.Thread, client: AsyncClient) -> None:
    try:
        portal.call(client.close)
    finally:
        portal.call(portal.stop)
        thread.join()


class Client:
    """The electric control plane, synchronously. Thread-safe.

    >>> with Client("127.0.0.1:7700") as client:
    ...     client.spawn("my_agent/agent_1")
    ...     print(client.kill("my_agent/agent_1"))
    """

    def __init__(
        self, address: str | Sequence[str] | None = None, *, options: ClientOptions | None = None, **kw: Any
    ) -> None:
        self._portal, thread = start_portal("electric-client-portal")

        async def create() -> AsyncClient:
            return AsyncClient(address, options=options, **kw)

        self._async = self._portal.call(create)
        self.options = self._async.options
        # Closes the channel and the portal when the Client is closed, collected,
        # or the interpreter exits, whichever comes first, exactly once.
        self._finalizer = weakref.finalize(self, _shutdown, self._portal, thread, self._async)

    @property
    def aio(self) -> AsyncClient:
        """The AsyncClient underneath; it belongs to the portal thread's loop."""
        return self._async

    def _run(self, func: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        return self._portal.call(functools.partial(func, *args, **kwargs))

    def _next(self, agen: AsyncIterator[T]) -> T:
        """One step of ``agen`` on the portal's loop, safe to interrupt.

        Ctrl-C raises KeyboardInterrupt in this thread at any point: while the
        step is being scheduled, or while it runs on the loop. The step is then
        cancelled (or, not started yet, never started) and waited for before
        the interrupt propagates; otherwise it would keep running on the loop
        and closing the generator would fail with "already running".
        """
        step = _Step()

        async def advance() -> T:
            step.ended = anyio.Event()
            try:
                with anyio.CancelScope() as step.scope:
                    if not step.abandoned:
                        return await agen.__anext__()
                raise StopAsyncIteration  # cancelled: nobody waits for this result any more
            finally:
                step.finished = True
                step.ended.set()

        async def abandon() -> None:
            step.abandoned = True
            if step.scope is not None:
                step.scope.cancel()
            if step.ended is not None:
                await step.ended.wait()

        try:
            return self._portal.call(advance)
        except BaseException:
            if not step.finished:  # interrupted here, not an error of the step's own
                self._portal.call(abandon)
            raise

    def _iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        try:
            while True:
                try:
                    yield self._next(agen)
                except StopAsyncIteration:
                    return
        finally:
            if self._finalizer.alive:
                aclose = getattr(agen, "aclose", None)
                if aclose is not None:  # every async generator has it; a bare AsyncIterator may not
                    self._portal.call(aclose)

    def close(self) -> None:
        """Close the channel and stop the portal thread; safe to repeat."""
        self._finalizer()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- the operations: each one line, delegating to AsyncClient ----------------------

    def spawn(
        self,
        ref: RefLike,
        *,
        grace_period: DurationLike | None = None,
        idle_timeout: DurationLike | None = None,
        idempotency_key: str | None = None,
        parent: RefLike | None = None,
    ) -> Entity:
        return self._run(
            self._async.spawn,
            ref,
            grace_period=grace_period,
            idle_timeout=idle_timeout,
            idempotency_key=idempotency_key,
            parent=parent,
        )

    def get(self, ref: RefLike) -> Entity:
        return self._run(self._async.get, ref)

    def list(
        self,
        type: str | None = None,
        states: StateLike | Iterable[StateLike] | None = None,
        *,
        limit: int | None = None,
        page_size: int = 500,
        parent: RefLike | None = None,
    ) -> list[Entity]:
        return self._run(self._async.list, type, states, limit=limit, page_size=page_size, parent=parent)

    def workers(self) -> builtins.list[WorkerInfo]:
        return self._run(self._async.workers)

    def versions(self, type: str | None = None) -> builtins.list[TypeVersions]:
        return self._run(self._async.versions, type)

    def set_version(
        self,
        type: str,
        version: str | None = None,
        *,
        ramp_version: str | None = None,
        ramp_percent: int = 0,
        reason: str = "",
    ) -> TypeVersions:
        return self._run(
            self._async.set_version,
            type,
            version,
            ramp_version=ramp_version,
            ramp_percent=ramp_percent,
            reason=reason,
        )

    def signal(
        self,
        ref: RefLike,
        signal: SignalLike,
        *,
        reason: str = "",
        payload: Any = None,
        message_key: str = "",
        idempotency_key: str | None = None,
        interrupt: bool = False,
        wait: Stage | str | None = None,
        timeout: DurationLike | None = None,
    ) -> SignalResult:
        return self._run(
            self._async.signal,
            ref,
            signal,
            reason=reason,
            payload=payload,
            message_key=message_key,
            idempotency_key=idempotency_key,
            interrupt=interrupt,
            wait=wait,
            timeout=timeout,
        )

    def wait_signal(
        self,
        result: SignalResult,
        wait: Stage | str,
        timeout: DurationLike | None = None,
        *,
        message_key: str = "",
    ) -> SignalResult:
        return self._run(self._async.wait_signal, result, wait, timeout, message_key=message_key)

    def interrupt(
        self,
        ref: RefLike,
        *,
        reason: str = "",
        wait: Stage | str | None = None,
        timeout: DurationLike | None = None,
    ) -> SignalResult:
        return self._run(self._async.interrupt, ref, reason=reason, wait=wait, timeout=timeout)

    def reload(self, ref: RefLike, *, reason: str = "") -> SignalResult:
        return self._run(self._async.reload, ref, reason=reason)

    def terminate(
        self,
        ref: RefLike,
        *,
        reason: str = "",
        interrupt: bool = False,
        wait: Stage | str | None = None,
        timeout: DurationLike | None = None,
    ) -> SignalResult:
        return self._run(
            self._async.terminate, ref, reason=reason, interrupt=interrupt, wait=wait, timeout=timeout
        )

    def kill(
        self,
        ref: RefLike,
        *,
        reason: str = "",
        wait: Stage | str | None = None,
        timeout: DurationLike | None = None,
    ) -> SignalResult:
        return self._run(self._async.kill, ref, reason=reason, wait=wait, timeout=timeout)

    def pause(self, ref: RefLike, *, reason: str = "") -> SignalResult:
        return self._run(self._async.pause, ref, reason=reason)

    def resume(self, ref: RefLike, *, reason: str = "") -> SignalResult:
        return self._run(self._async.resume, ref, reason=reason)

    def usr(
        self,
        ref: RefLike,
        payload: Any = None,
        *,
        reason: str = "",
        wait: Stage | str | None = None,
        timeout: DurationLike | None = None,
    ) -> SignalResult:
        return self._run(self._async.usr, ref, payload, reason=reason, wait=wait, timeout=timeout)

    def signal_many(
        self,
        signal: SignalLike,
        *,
        type: str | None = None,
        states: StateLike | Iterable[StateLike] | None = None,
        refs: Sequence[RefLike] = (),
        reason: str = "",
        payload: Any = None,
        idempotency_key: str | None = None,
        interrupt: bool = False,
    ) -> SignalManyResult:
        return self._run(
            self._async.signal_many,
            signal,
            type=type,
            states=states,
            refs=refs,
            reason=reason,
            payload=payload,
            idempotency_key=idempotency_key,
            interrupt=interrupt,
        )

    def delete(self, ref: RefLike) -> SignalResult:
        """Deprecated: exactly SIGKILL with reason "legacy delete". Use kill()."""
        warnings.warn(
            "delete() is deprecated: it sends SIGKILL; call kill() instead", DeprecationWarning, stacklevel=2
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # already warned, at the caller's line
            return self._run(self._async.delete, ref)

    @overload
    def send(
        self,
        ref: RefLike,
        text: str = "",
        *,
        data: Any = None,
        idempotency_key: str | None = None,
        wait: None = None,
        timeout: DurationLike | None = None,
        policy: str | None = None,
    ) -> MessageReceipt: ...

    @overload
    def send(
        self,
        ref: RefLike,
        text: str = "",
        *,
        data: Any = None,
        idempotency_key: str | None = None,
        wait: Literal["run"],
        timeout: DurationLike | None = None,
        policy: str | None = None,
    ) -> RunResult: ...

    def send(
        self,
        ref: RefLike,
        text: str = "",
        *,
        data: Any = None,
        idempotency_key: str | None = None,
        wait: Literal["run"] | None = None,
        timeout: DurationLike | None = None,
        policy: str | None = None,
    ) -> MessageReceipt | RunResult:
        """As ``AsyncClient.send``: with ``wait="run"``, how the message's run ended
        (``RunResult``), or ``RunNotEnded`` past ``timeout``; ``policy`` as there."""
        return self._run(
            self._async.send,
            ref,
            text,
            data=data,
            idempotency_key=idempotency_key,
            wait=wait,
            timeout=timeout,
            policy=policy,
        )

    def fork(
        self,
        ref: RefLike,
        new_id: str,
        *,
        at: int | None = None,
        reason: str = "",
        idempotency_key: str | None = None,
    ) -> Entity:
        return self._run(self._async.fork, ref, new_id, at=at, reason=reason, idempotency_key=idempotency_key)

    def retry(
        self,
        ref: RefLike,
        run: str,
        *,
        from_step: int = 0,
        reason: str = "",
        idempotency_key: str | None = None,
    ) -> MessageReceipt:
        return self._run(
            self._async.retry, ref, run, from_step=from_step, reason=reason, idempotency_key=idempotency_key
        )

    def events(self, ref: RefLike, from_offset: int = 0, limit: int = 100) -> EventPage:
        return self._run(self._async.events, ref, from_offset, limit)

    def wait_ready(self, timeout: float = 10.0) -> None:
        self._run(self._async.wait_ready, timeout)

    def state(self, ref: RefLike) -> dict[str, Any]:
        return self._run(self._async.state, ref)

    def watch_state(self, ref: RefLike) -> Iterator[dict[str, Any]]:
        return self._iterate(self._async.watch_state(ref))

    def watch(self, ref: RefLike, from_offset: int = 0) -> Iterator[Event]:
        return self._iterate(self._async.watch(ref, from_offset))

    def watch_entities(
        self, type: str | None = None, states: StateLike | Iterable[StateLike] | None = None
    ) -> Iterator[EntityChange]:
        return self._iterate(self._async.watch_entities(type, states))

    def wait_for_state(
        self, ref: RefLike, states: StateLike | Iterable[StateLike], timeout: float | None = None
    ) -> Entity:
        return self._run(self._async.wait_for_state, ref, states, timeout)
