"""More than one call accepted at a time per method on grpc.aio's server.

grpc.aio (1.85) keeps one request for the next call outstanding per
registered method, and re-arms it from the server's main task: the request is
a task of its own, its completion wakes ``asyncio.wait`` over every method's
request, and only then is the next one issued — three to four turns of the
event loop per accepted call. Under load each of those turns also runs
handlers and commits, so calls queue in gRPC's core waiting to be accepted
while the loop still has time to spare. More requests outstanding per method
keep calls coming, and cost less CPU per call: the re-arming's ``asyncio.wait``
over every method's request is skipped. What it buys is measured beside the
fallback by bench/bench_fastpaths.py and recorded in docs/scaling.md.

``Acceptors`` keeps ``per_method`` more requests outstanding for each
registered method, each in a task that hands its call to grpc's own call
handling (interceptors, deserialization, status) and re-arms at once. It uses
grpc.aio internals: the server's registered-call request, its method resolver and
the coroutines its main loop schedules. This module is the ``acceptors`` fast path
(``fastpaths/__init__.py``): they are checked once (``unavailable_reason``);
with a grpcio where they differ, or with the fallback forced
(``ELECTRIC_FORCE_FALLBACKS=acceptors``), the server keeps grpc's own acceptor
and logs why. grpcio is pinned exactly in pyproject.toml, and
tests/test_accept.py fails if these calls stop being the ones that serve
requests.

The same core logs, at ERROR and with a traceback, a response write that
failed because the client had already gone (hung up, or its deadline passed)
before grpc noticed (``ExecuteBatchError raised in core by servicer method``,
grpc/grpc#32551): any client can cause one per stream it abandons.
``quiet_abandoned_writes`` turns those into one line per interval, with a
count, and leaves every other record of that logger alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc

from ..lifetime import TaskGroup
from . import forced

# grpc's Cython core: no type stubs, and only its internals are used here.
cygrpc: Any = importlib.import_module("grpc._cython.cygrpc")

log = logging.getLogger(__name__)

# The grpc.aio internals used here, with the parameters they must take.
_HANDLE_RPC = ("method_name", "method_resolver", "interceptors", "rpc_state", "loop", "concurrency_exceeded")
_SCHEDULE_RPC = ("rpc_coro", "rpc_state", "loop", "method_name")
CLOSE_TIMEOUT_S = 5.0


def _parameters(fn: Any) -> tuple[str, ...]:
    code = getattr(fn, "__code__", None)
    if code is None:
        return ()
    return tuple(code.co_varnames[: code.co_argcount])


FORCED = "fallback forced (ELECTRIC_FORCE_FALLBACKS)"


def unavailable_reason() -> str | None:
    """Why extra acceptors cannot run here; None when they can."""
    return FORCED if forced("acceptors") else missing_internals()


def missing_internals() -> str | None:
    """What the installed grpcio lacks of the internals used here; None when it has them all."""
    version = getattr(grpc, "__version__", "?")
    if not hasattr(cygrpc.AioServer, "_request_registered_call"):
        return f"grpcio {version} has no AioServer._request_registered_call"
    if not hasattr(cygrpc, "_MethodResolver"):
        return f"grpcio {version} has no _MethodResolver"
    if _parameters(getattr(cygrpc, "_handle_rpc", None)) != _HANDLE_RPC:
        return f"grpcio {version} has a different _handle_rpc"
    if _parameters(getattr(cygrpc, "_schedule_rpc_coro", None)) != _SCHEDULE_RPC:
        return f"grpcio {version} has a different _schedule_rpc_coro"
    return None


class Acceptors:
    """Extra outstanding call requests for a grpc.aio server's registered methods.

    Create it before the services are added (it records their handlers as the
    generated ``add_*_to_server`` functions register them), call ``start``
    after ``server.start()`` and ``wait_closed`` after ``server.stop()``.
    """

    def __init__(
        self,
        server: grpc.aio.Server,
        interceptors: Sequence[grpc.aio.ServerInterceptor],
        per_method: int,
    ) -> None:
        # The range is checked where it is configured (ServerConfig via ElectricServer).
        self.per_method = per_method
        # Typed loosely: grpc.aio.Server's internals are reached below.
        self._server: Any = server
        self._interceptors = tuple(interceptors)
        self._registered: dict[str, Any] = {}  # "/service/Method" -> grpc.RpcMethodHandler
        self._acceptors = TaskGroup("the gRPC acceptors")
        self._calls = TaskGroup("the gRPC calls they accepted")
        self.accepted = 0  # calls handed over by these acceptors (for tests and benches)
        self.reason = unavailable_reason() if per_method else "disabled (0 per method)"
        if self.reason is None:
            # The generated add_*_to_server functions register each service's
            # methods here; record them on the way through.
            register: Callable[[str, Mapping[str, Any]], None] = self._server.add_registered_method_handlers

            def recording(service: str, handlers: Mapping[str, Any]) -> None:
                self._registered.update({f"/{service}/{name}": h for name, h in handlers.items()})
                register(service, handlers)

            target: Any = server
            target.add_registered_method_handlers = recording  # on this instance only

    def start(self) -> None:
        """Issue the extra requests; the server must be started."""
        if self.reason is not None:
            # Disabled on purpose is news to nobody; a grpcio without the internals
            # costs throughput under load, which an operator should hear about.
            report = log.info if self.per_method == 0 or self.reason == FORCED else log.warning
            report("one acceptor per method (grpc's own): %s", self.reason)
            return
        core = self._server._server  # grpc.aio.Server's cygrpc.AioServer
        # Registered handlers are looked up first; generic ones are not needed
        # because only registered methods get extra requests.
        resolver = cygrpc._MethodResolver([], dict(self._registered))
        loop = asyncio.get_running_loop()
        for method in self._registered:
            for _ in range(self.per_method):
                self._acceptors.start_soon(
                    self._accept(core, resolver, method, loop), name=f"accept {method}"
                )

    async def _accept(self, core: Any, resolver: Any, method: str, loop: asyncio.AbstractEventLoop) -> None:
        method_bytes = method.encode()
        while core.is_running():
            try:
                # Awaited here, not wrapped in a task as grpc's main loop does: a loop turn less per call.
                rpc_state = await core._request_registered_call(method_bytes)
            except Exception:  # the request fails when the server shuts down
                if core.is_running():
                    log.exception("accepting %s failed; one fewer acceptor for it", method)
                return
            self.accepted += 1
            rpc = cygrpc._handle_rpc(method, resolver, self._interceptors, rpc_state, loop, False)
            # Each call's task kept until it ends, as grpc's main loop does (the loop holds tasks weakly).
            self._calls.start_soon(cygrpc._schedule_rpc_coro(rpc, rpc_state, loop, method), name="rpc_task")

    @property
    def outstanding(self) -> int:
        return len(self._acceptors)

    async def wait_closed(self) -> None:
        """After ``server.stop()``: the acceptors end as their requests fail; cancel any left,
        and what is left of the calls they accepted."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self._acceptors.wait()
        await self._acceptors.aclose()
        await self._calls.aclose()


ABANDONED_WRITES_INTERVAL_S = 10.0


class _AbandonedWrites(logging.Filter):
    """grpc.aio core's ERROR, with its traceback, for a write to a client that had gone: one
    line per interval instead, at INFO, counting the writes since the last line."""

    def __init__(self, interval_s: float = ABANDONED_WRITES_INTERVAL_S) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.last: float | None = None
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, cygrpc.ExecuteBatchError):
            return True
        self.count += 1
        now = time.monotonic()
        if self.last is not None and now - self.last < self.interval_s:
            return False
        self.last = now
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg = "%d response write(s) failed: the client had gone (logged at most every %gs)"
        record.args = (self.count, self.interval_s)
        record.exc_info, record.exc_text = None, None
        self.count = 0
        return True


abandoned_writes = _AbandonedWrites()


def quiet_abandoned_writes() -> None:
    """Condense grpc.aio core's tracebacks for writes to clients that had gone (idempotent)."""
    if hasattr(cygrpc, "ExecuteBatchError"):
        logging.getLogger(cygrpc.__name__).addFilter(abandoned_writes)
