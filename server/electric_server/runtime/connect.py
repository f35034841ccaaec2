"""RuntimeService: the gRPC stream a worker's session runs on (``Connect``).

See proto/electric/v1/runtime_service.proto for the contract. The stream opens with the worker's
hello (checked here: its names, its types' profiles, what its principal may host), answers with a
welcome, then carries the runtime's messages (hosting.py) one way, batched when the worker takes
batches, and the worker's requests (requests.py) the other, read by a task of the session's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import runtime_service_pb2_grpc as rt_grpc
from electric_sdk._wire.times import duration_from_ms
from electric_sdk.runtime_session import SESSION_ACCEPTED
from electric_sdk.stream_batches import EMPTY, Empty, coalesce

from ..core import validation as v
from ..core.auth import Principal, current_principal
from ..core.caps import Caps
from ..core.errors import ApiError, invalid_argument, translate_stream
from ..lifetime import TaskGroup
from ..settings import HELLO_TIMEOUT
from .announcements import check_hosting
from .hosting import Runtime
from .local_leases import WorkerSession
from .requests import WorkerRequests


def _poll(outbox: asyncio.Queue[rt.ConnectResponse | None]) -> rt.ConnectResponse | Empty | None:
    try:
        return outbox.get_nowait()
    except asyncio.QueueEmpty:
        return EMPTY


def _response_batch(responses: list[rt.ConnectResponse]) -> rt.ConnectResponse:
    return rt.ConnectResponse(batch=rt.ResponseBatch(responses=responses))


class RuntimeService(rt_grpc.RuntimeServiceServicer):
    def __init__(
        self, runtime: Runtime, caps: Caps | None = None, hello_timeout_ms: int = HELLO_TIMEOUT.value
    ) -> None:
        self.runtime = runtime
        self.caps = caps or Caps()
        self.hello_timeout_s = hello_timeout_ms / 1000

    @translate_stream
    async def Connect(
        self, request_iterator: AsyncIterator[rt.ConnectRequest], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[rt.ConnectResponse]:
        principal = current_principal.get()
        with self.caps.stream(principal.name):  # refused at the door: no marker
            await context.send_initial_metadata((SESSION_ACCEPTED,))  # the worker may now say hello
            try:
                first = await asyncio.wait_for(anext(aiter(request_iterator), None), self.hello_timeout_s)
            except TimeoutError:
                raise ApiError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    "HELLO_TIMEOUT",
                    f"no hello within {self.hello_timeout_s * 1000:g} ms of the stream's start",
                ) from None
            if first is None:
                return
            hello = _check_hello(first, principal)
            with self.caps.session(principal.name):
                session = await self.runtime.open(hello, principal)
                yield rt.ConnectResponse(
                    welcome=rt.Welcome(
                        lease_ttl=duration_from_ms(round(self.runtime.lease_ttl_s * 1000)),
                        heartbeat_interval=duration_from_ms(self.runtime.heartbeat_interval_ms),
                    )
                )
                refused: list[Exception] = []
                async with TaskGroup("a worker's session") as reading:
                    reading.start_soon(_read(self.runtime.requests, session, request_iterator, refused))
                    try:
                        while (item := await session.outbox.get()) is not None:
                            if not hello.accepts_batches:
                                yield item
                                continue
                            message, ended = coalesce(item, lambda: _poll(session.outbox), _response_batch)
                            yield message
                            if ended:
                                break
                        if refused:  # a bad request (e.g. a malformed ref): the session ends with its status
                            raise refused[0]
                    finally:
                        reading.cancel()
                        await self.runtime.close(session, "runtime_lost")


async def _read(
    requests: WorkerRequests,
    session: WorkerSession,
    request_iterator: AsyncIterator[rt.ConnectRequest],
    refused: list[Exception],
) -> None:
    """The worker's requests, until it hangs up; what refused one goes to ``refused`` (Connect
    raises it, as the session's status), not to the group as a crash."""
    try:
        await requests.read(session, request_iterator)
    except Exception as exc:
        refused.append(exc)


def _check_hello(first: rt.ConnectRequest, principal: Principal) -> rt.Hello:
    """The session's hello, checked: its names, its types' profiles, the principal's types."""
    if first.WhichOneof("msg") != "hello":
        raise invalid_argument("HELLO_FIRST", "a worker's session starts with hello")
    hello = first.hello
    v.name(hello.worker_id, "hello.worker_id")
    check_hosting(hello.types, hello.code_version, principal, "hello")
    return hello
