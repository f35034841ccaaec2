"""The one place where server-side failures become gRPC statuses.

Every error leaves as a gRPC status code plus a ``google.rpc.ErrorInfo``
detail (domain ``electric.v1``, an UPPER_SNAKE ``reason``, string metadata).
Handlers raise ``ApiError`` (or a domain exception mapped below);
``translate`` turns it into ``context.abort_with_status``. Nothing else in the
server builds a status.

A request body that cannot be decoded becomes ``MALFORMED_REQUEST`` (or
``PAYLOAD_TOO_DEEP``) here too: ``handlers.py`` guards every registered
deserializer with ``decode_error``, and the handlers see a ``Malformed`` in
place of the request. Refusals an operator should hear about (a wrong token,
an undecodable body, a cap reached) are logged by ``refusals``: one line per
reason per interval, with the count of those it left out, so a flood of bad
calls cannot flood the log.

The HTTP door (``http/door.py``) calls the same handlers with a ``DoorContext``:
``abort_with`` raises the ``ApiError`` to it instead of a status, and
``HTTP_STATUS`` maps it, keyed by (status, reason), to the HTTP status of the
body ``{"error": {"code", "message", "details"}}`` (``http_error``).
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
from electric_sdk._wire.json_values import MAX_JSON_DEPTH
from electric_sdk.lifecycle import InvalidTransition, SignalRejected

from ..log_throttle import LogThrottle
from ..store.base import (
    DamagedStore,
    DatabaseUnavailable,
    DiskFull,
    IdempotencyKeyReused,
    StorageFault,
    StoreBusy,
    WritesRefused,
)

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


def resource_exhausted(reason: str, message: str, **metadata: str) -> ApiError:
    return ApiError(grpc.StatusCode.RESOURCE_EXHAUSTED, reason, message, metadata)


def not_found(type_: str, id_: str) -> ApiError:
    url = entity_url(type_, id_)
    return ApiError(grpc.StatusCode.NOT_FOUND, "ENTITY_NOT_FOUND", f"No entity {url}", {"entity": url})


def entity_busy(url: str, run_key: str, policy: str) -> ApiError:
    """A message refused by a ``reject`` double-texting policy (electric_sdk/busy.py)."""
    return ApiError(
        grpc.StatusCode.FAILED_PRECONDITION,
        "ENTITY_BUSY",
        f"Entity {url} is busy: a run is in progress and this message's policy is {policy}",
        {"entity": url, "run": run_key, "policy": policy},
    )


def busy_policy_not_allowed(url: str, policy: str, message: str) -> ApiError:
    """A message chose a double-texting policy its entity's type does not let it choose."""
    return ApiError(
        grpc.StatusCode.FAILED_PRECONDITION,
        "BUSY_POLICY_NOT_ALLOWED",
        message,
        {"entity": url, "policy": policy},
    )


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
        return storage_error(exc)
    return None


def storage_error(fault: StorageFault) -> ApiError:
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
    if isinstance(fault, WritesRefused):  # read-only: nothing of the write was kept; reads go on
        return ApiError(
            grpc.StatusCode.UNAVAILABLE,
            "DATABASE_UNAVAILABLE",
            "the server's database takes no writes (it is read-only; the server's log says more): "
            "writes are refused until it takes them again (reads still work)",
        )
    if isinstance(fault, DatabaseUnavailable):  # a retry may find it back; a cut-off COMMIT is resolved
        return ApiError(  # by the retry's idempotency key
            grpc.StatusCode.UNAVAILABLE,
            "DATABASE_UNAVAILABLE",
            "the server's database did not answer, or refused or lost the connection (its log "
            "says which): retry (with the same idempotency key, a write that did commit is not "
            "applied twice)",
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


class Malformed:
    """Stands in for a unary request whose body could not be decoded (see ``handlers.py``)."""

    __slots__ = ("error",)

    def __init__(self, error: ApiError) -> None:
        self.error = error


# The decoders' words for a message nested deeper than they parse: upb's, and the pure-Python
# decoder's. Only JSON values nest that deep in a valid request (ARCHITECTURE §7).
_TOO_DEEP = ("MaxDepth", "too many levels of nesting")


def decode_error(exc: Exception) -> ApiError:
    """What an undecodable request body is, for the client."""
    text = str(exc)
    if any(words in text for words in _TOO_DEEP):
        return invalid_argument(
            "PAYLOAD_TOO_DEEP",
            f"the request nests deeper than it can be decoded; JSON values nest at most "
            f"{MAX_JSON_DEPTH} levels",
        )
    return invalid_argument("MALFORMED_REQUEST", f"the request body cannot be decoded: {text[:200]}")


# Refusals worth an operator's attention; the others (a bad name, a terminal entity) are the
# caller's business, answered with their reason and not logged.
LOGGED_REASONS = frozenset(
    {"UNAUTHENTICATED", "MALFORMED_REQUEST", "HELLO_TIMEOUT", "TOO_MANY_STREAMS", "TOO_MANY_SESSIONS"}
)
REFUSAL_LOG_INTERVAL_S = 10.0


class RefusalLog:
    """At most one log line per reason per interval; the next line counts those left out."""

    def __init__(self, interval_s: float = REFUSAL_LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._throttle = LogThrottle(interval_s)

    def note(self, error: ApiError, method: str, peer: str) -> None:
        left_out = self._throttle.admit(error.reason)
        if left_out is None:
            return
        since = f"; {left_out} more since the last such line" if left_out else ""
        log.warning(
            "refused %s from %s: %s %s: %s%s (logged at most every %gs)",
            method,
            peer,
            error.code.name,
            error.reason,
            error.message,
            since,
            self.interval_s,
        )


refusals = RefusalLog()


class DoorContext:
    """What the service's handlers are given in place of grpc's context when the HTTP door
    calls them: ``abort_with`` raises the error itself, for the door to answer."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        """No deadline: a request waits as long as its own bound says (a stage's wait)."""
        return None


async def abort_with(
    context: grpc.aio.ServicerContext[Any, Any] | DoorContext, error: ApiError, method: str
) -> None:
    """End the call with ``error``'s status (logged, rate-limited, if it is worth it)."""
    if error.reason in LOGGED_REASONS:
        refusals.note(error, method, context.peer())
    if isinstance(context, DoorContext):
        raise error
    await context.abort_with_status(status_for(error))


# -- the HTTP door ---------------------------------------------------------------------------

# (status, reason) → HTTP status; (status, None) is the status's default for its other reasons.
HTTP_STATUS: dict[tuple[grpc.StatusCode, str | None], int] = {
    (grpc.StatusCode.INVALID_ARGUMENT, None): 400,
    (grpc.StatusCode.INVALID_ARGUMENT, "BODY_TOO_LARGE"): 413,
    (grpc.StatusCode.INVALID_ARGUMENT, "PAYLOAD_TOO_LARGE"): 413,
    (grpc.StatusCode.INVALID_ARGUMENT, "MESSAGE_TOO_LARGE"): 413,
    (grpc.StatusCode.INVALID_ARGUMENT, "UNSUPPORTED_MEDIA_TYPE"): 415,
    (grpc.StatusCode.UNAUTHENTICATED, None): 401,
    (grpc.StatusCode.PERMISSION_DENIED, None): 403,
    (grpc.StatusCode.NOT_FOUND, None): 404,
    (grpc.StatusCode.UNIMPLEMENTED, "METHOD_NOT_ALLOWED"): 405,
    (grpc.StatusCode.UNIMPLEMENTED, None): 404,
    (grpc.StatusCode.ALREADY_EXISTS, None): 409,
    (grpc.StatusCode.FAILED_PRECONDITION, None): 409,
    # Past the end of what exists now (a fork offset past the head): the state refuses it.
    (grpc.StatusCode.OUT_OF_RANGE, None): 409,
    (grpc.StatusCode.ABORTED, None): 409,
    (grpc.StatusCode.RESOURCE_EXHAUSTED, None): 429,
    (grpc.StatusCode.UNAVAILABLE, None): 503,
    (grpc.StatusCode.DEADLINE_EXCEEDED, None): 504,
    (grpc.StatusCode.DATA_LOSS, None): 500,
    (grpc.StatusCode.INTERNAL, None): 500,
}


def http_status(error: ApiError) -> int:
    found = HTTP_STATUS.get((error.code, error.reason)) or HTTP_STATUS.get((error.code, None))
    return found or 500


def http_error(error: ApiError) -> tuple[int, dict[str, Any]]:
    """The HTTP status and body of ``error``: its reason is the code, its metadata the details."""
    body = {"error": {"code": error.reason, "message": error.message, "details": dict(error.metadata)}}
    return http_status(error), body


def unexpected(exc: BaseException, method: str) -> ApiError:
    """A bug: logged with its traceback; the client is told only its type."""
    log.exception("unexpected error in %s", method, exc_info=exc)
    return ApiError(grpc.StatusCode.INTERNAL, "INTERNAL", f"internal error: {type(exc).__name__}")


Unary = Callable[..., Awaitable[Any]]
Streaming = Callable[..., AsyncIterator[Any]]
U = TypeVar("U", bound=Unary)
S = TypeVar("S", bound=Streaming)


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: Exception, method: str) -> None:
    if isinstance(exc, grpc.aio.AbortError):
        raise exc  # already a status (e.g. from the auth check)
    await abort_with(context, to_api_error(exc) or unexpected(exc, method), method)


def translate(method: U) -> U:
    """Decorate a unary handler: domain errors become statuses with ErrorInfo."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            if request.__class__ is Malformed:
                raise request.error
            return await method(self, request, context)
        except Exception as exc:
            await _abort(context, exc, method.__name__)

    wrapper.checks_malformed = True  # type: ignore[attr-defined]  # see handlers.py
    return wrapper  # type: ignore[return-value]


def translate_stream(method: S) -> S:
    """Decorate a server-streaming handler like ``translate``."""

    @functools.wraps(method)
    async def wrapper(
        self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        try:
            if request.__class__ is Malformed:
                raise request.error
            async for item in method(self, request, context):
                yield item
        except Exception as exc:
            await _abort(context, exc, method.__name__)

    wrapper.checks_malformed = True  # type: ignore[attr-defined]  # see handlers.py
    return wrapper  # type: ignore[return-value]
