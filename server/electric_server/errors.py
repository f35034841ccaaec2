"""The one place where server-side failures become gRPC statuses.

Every error leaves as a gRPC status code plus a ``google.rpc.ErrorInfo``
detail (domain ``electric.v1``, an UPPER_SNAKE ``reason``, string metadata).
Handlers raise ``ApiError`` (or a domain exception mapped below);
``translate`` turns it into ``context.abort_with_status``. Nothing else in the
server builds a status.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from electric_sdk._wire.entities import entity_url
from electric_sdk.lifecycle import InvalidTransition, SignalRejected

from .store.base import DamagedStore, DiskFull, IdempotencyKeyReused, StorageFault, StoreBusy

DOMAIN = "electric.v1"
log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error for the client: a status code, a reason and a message."""

    def __init__(
        self, code: grpc.StatusCode, reason: str, message: str, metadata: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.metadata = metadata or {}


def invalid_argument(reason: str, message: str, **metadata: str) -> ApiError:
    return ApiError(grpc.StatusCode.INVALID_ARGUMENT, reason, message, metadata)


def not_found(type_: str, id_: str) -> ApiError:
    url = entity_url(type_, id_)
    return ApiError(grpc.StatusCode.NOT_FOUND, "ENTITY_NOT_FOUND", f"No entity {url}", {"entity": url})


def to_api_error(exc: BaseException) -> ApiError | None:
    """Map a domain exception to its wire error; None for unexpected ones."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, SignalRejected):
        return ApiError(
            grpc.StatusCode.FAILED_PRECONDITION,
            exc.reason,
            str(exc),
            {"state": exc.state.value, "signal": exc.signal.value},
        )
    if isinstance(exc, InvalidTransition):
        return ApiError(grpc.StatusCode.FAILED_PRECONDITION, exc.reason, str(exc))
    if isinstance(exc, IdempotencyKeyReused):
        return invalid_argument("IDEMPOTENCY_KEY_REUSED", str(exc), idempotency_key=exc.key)
    if isinstance(exc, StorageFault):
        return _storage_error(exc)
    return None


def _storage_error(fault: StorageFault) -> ApiError:
    """A storage fault, for the client: what it means for the call (the server's log says
    where and what to do; the client is not told the server's paths)."""
    if isinstance(fault, DiskFull):  # nothing of the write was kept; retry once space is freed
        return ApiError(
            grpc.StatusCode.UNAVAILABLE,
            "DISK_FULL",
            "the server's disk is full: writes are refused until space is freed (reads still work)",
        )
    if isinstance(fault, StoreBusy):  # another process holds the database locked: nothing was written
        return ApiError(
            grpc.StatusCode.UNAVAILABLE, "STORAGE_BUSY", "the server's database is locked by another process"
        )
    if isinstance(fault, DamagedStore):
        return ApiError(
            grpc.StatusCode.DATA_LOSS,
            "DATA_DAMAGED",
            "the server's data is damaged: it cannot read or write it",
        )
    # StorageFailed: the disk failed a write (e.g. its sync); the server acknowledges nothing more
    return ApiError(
        grpc.StatusCode.UNAVAILABLE,
        "STORAGE_FAILED",
        "the server's storage failed: it acknowledges no more writes and is stopping",
    )


def status_for(error: ApiError) -> grpc.Status:
    info = error_details_pb2.ErrorInfo(reason=error.reason, domain=DOMAIN, metadata=error.metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=error.code.value[0], message=error.message, details=[detail])
    result: grpc.Status = rpc_status.to_status(status)
    return result


def _unexpected(exc: BaseException, method: str) -> ApiError:
    log.exception("unexpected error in %s", method, exc_info=exc)
    return ApiError(grpc.StatusCode.INTERNAL, "INTERNAL", f"internal error: {type(exc).__name__}")


Unary = Callable[..., Awaitable[Any]]
Streaming = Callable[..., AsyncIterator[Any]]
U = TypeVar("U", bound=Unary)
S = TypeVar("S", bound=Streaming)


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: Exception, method: str) -> None:
    if isinstance(exc, grpc.aio.AbortError):
        raise exc  # already a status (e.g. from the auth check)
    error = to_api_error(exc) or _unexpected(exc, method)
    await context.abort_with_status(status_for(error))


def translate(method: U) -> U:
    """Decorate a unary handler: domain errors become statuses with ErrorInfo."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await method(self, request, context)
        except Exception as exc:
            await _abort(context, exc, method.__name__)

    return wrapper  # type: ignore[return-value]


def translate_stream(method: S) -> S:
    """Decorate a server-streaming handler like ``translate``."""

    @functools.wraps(method)
    async def wrapper(
        self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        try:
            async for item in method(self, request, context):
                yield item
        except Exception as exc:
            await _abort(context, exc, method.__name__)

    return wrapper  # type: ignore[return-value]
