"""The SDK's exceptions: one tree, built from gRPC statuses in one place.

::

    ElectricError
    ├── InvalidArgument          INVALID_ARGUMENT (bad name, payload, duration, ...); also a ValueError
    │   └── IdempotencyKeyReused     the same key was used with a different request
    ├── EntityNotFound           NOT_FOUND
    ├── EntityExists             ALREADY_EXISTS (ids are never reused, not even after stopped/killed)
    ├── FailedPrecondition       FAILED_PRECONDITION
    │   ├── InvalidSignal            the entity is stopped or killed ("Cannot signal a stopped entity")
    │   ├── EntityTerminal           a message to a stopped or killed entity, or ``ctx.emit`` after its end
    │   └── EntityBusy               a message refused by a ``reject`` policy: a run was in progress
    ├── Unauthenticated          UNAUTHENTICATED (missing or unknown token)
    ├── PermissionDenied         PERMISSION_DENIED (missing scope, entity type not allowed)
    ├── Unavailable              UNAVAILABLE (server down or draining; retried automatically)
    ├── DeadlineExceeded         DEADLINE_EXCEEDED (retried automatically)
    │   └── RunNotEnded              ``send(..., wait="run", timeout=...)``: the run had not ended
    ├── WatchLagging             ABORTED / WATCH_LAGGING (a watch fell behind; reconnects automatically)
    ├── WrongEventLoop           an AsyncClient used from another event loop than its own
    ├── NonDeterministicRun      a redelivered run asked for another step than was recorded there
    ├── StepFailed               a recorded step raised (after its retries), now or when it was recorded
    │   └── StepTimeout              ... because it ran past its ``timeout`` (also a TimeoutError)
    ├── InvalidStepResult        a step's result is not JSON or is too large (also a ValueError)
    └── ServerError              INTERNAL and anything else unexpected

Every error carries ``code`` (the RFC's error code: the ErrorInfo reason,
e.g. ``"INVALID_SIGNAL"``), ``message``, ``status`` (the gRPC status code
name) and ``metadata`` (the ErrorInfo metadata). ``error.to_json()`` gives the
RFC's error shape ``{"error": {"code": ..., "message": ...}}``.

``from_rpc_error`` is the one place a ``grpc.RpcError`` becomes one of these.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

__all__ = [
    "DeadlineExceeded",
    "ElectricError",
    "EntityBusy",
    "EntityExists",
    "EntityNotFound",
    "EntityTerminal",
    "FailedPrecondition",
    "IdempotencyKeyReused",
    "InvalidArgument",
    "InvalidSignal",
    "InvalidStepResult",
    "NonDeterministicRun",
    "PermissionDenied",
    "RunAborted",
    "RunNotEnded",
    "ServerError",
    "StepFailed",
    "StepTimeout",
    "Unauthenticated",
    "Unavailable",
    "WatchLagging",
    "WrongEventLoop",
    "from_rpc_error",
]

DOMAIN = "electric.v1"


class ElectricError(Exception):
    """Base of every error the SDK raises."""

    default_code = "ELECTRIC_ERROR"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: str = "UNKNOWN",
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.status = status
        self.metadata = dict(metadata or {})

    def to_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class InvalidArgument(ElectricError, ValueError):
    default_code = "INVALID_ARGUMENT"


class IdempotencyKeyReused(InvalidArgument):
    default_code = "IDEMPOTENCY_KEY_REUSED"


class EntityNotFound(ElectricError):
    default_code = "ENTITY_NOT_FOUND"


class EntityExists(ElectricError):
    default_code = "ENTITY_EXISTS"


class FailedPrecondition(ElectricError):
    default_code = "FAILED_PRECONDITION"


class InvalidSignal(FailedPrecondition):
    default_code = "INVALID_SIGNAL"


class EntityTerminal(FailedPrecondition):
    default_code = "ENTITY_TERMINAL"


class EntityBusy(FailedPrecondition):
    """A message refused by its ``reject`` double-texting policy: a run of the entity was in
    progress, and nothing was written (docs/double-texting.md)."""

    default_code = "ENTITY_BUSY"


class Unauthenticated(ElectricError):
    default_code = "UNAUTHENTICATED"


class PermissionDenied(ElectricError):
    default_code = "PERMISSION_DENIED"


class Unavailable(ElectricError):
    default_code = "UNAVAILABLE"


class DeadlineExceeded(ElectricError):
    default_code = "DEADLINE_EXCEEDED"


class RunNotEnded(DeadlineExceeded):
    """``send(..., wait="run", timeout=...)``: the timeout passed before the message's run ended.
    The message was delivered all the same: ``receipt`` is its receipt, ``run_status`` says where
    its run was (``queued`` or ``started``)."""

    default_code = "RUN_NOT_ENDED"

    def __init__(self, message: str, *, receipt: Any, run_status: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.receipt, self.run_status = receipt, run_status


class WatchLagging(ElectricError):
    default_code = "WATCH_LAGGING"


class WrongEventLoop(ElectricError):
    default_code = "WRONG_EVENT_LOOP"


class ServerError(ElectricError):
    default_code = "INTERNAL"


class NonDeterministicRun(ElectricError):
    """A redelivered run asked, at a recorded position, for another step than the one recorded
    there (its code path changed): the run fails rather than diverge silently."""

    default_code = "NON_DETERMINISTIC_RUN"


class RunAborted(ElectricError):
    """Raised in a run's code that outlived its run: the run was aborted (SIGINT, SIGKILL) while
    it was blocked in a thread, and what it does once the thread returns is discarded."""

    default_code = "RUN_ABORTED"


class StepFailed(ElectricError):
    """A recorded step raised and will not be retried; ``error_type`` names what it raised, and
    ``attempts`` how often it was tried. A replay raises it again from the record."""

    default_code = "STEP_FAILED"

    def __init__(self, message: str, *, step: str, error_type: str, attempts: int, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.step, self.error_type, self.attempts = step, error_type, attempts


class StepTimeout(StepFailed, TimeoutError):
    default_code = "STEP_TIMEOUT"


class InvalidStepResult(ElectricError, ValueError):
    """A step's result that cannot be recorded: not JSON, or larger than the documented bound."""

    default_code = "INVALID_STEP_RESULT"


# The reasons of a server's storage faults (its UNAVAILABLE answers): nothing of the write was
# kept, or a commit was cut off, and a retry with the same request id or idempotency key finds
# out which. A fenced runtime write answered with one is sent again, unchanged (fenced.py).
RETRYABLE_WRITE_REASONS = frozenset({"DATABASE_UNAVAILABLE", "DISK_FULL", "STORAGE_BUSY", "STORAGE_FAILED"})

# A reason, where it names a more precise class than the status does.
_BY_REASON: dict[str, type[ElectricError]] = {
    "IDEMPOTENCY_KEY_REUSED": IdempotencyKeyReused,
    "INVALID_SIGNAL": InvalidSignal,
    "ENTITY_TERMINAL": EntityTerminal,
    "ENTITY_BUSY": EntityBusy,
    "WATCH_LAGGING": WatchLagging,
}
_BY_STATUS: dict[grpc.StatusCode, type[ElectricError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: EntityNotFound,
    grpc.StatusCode.ALREADY_EXISTS: EntityExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.ABORTED: Unavailable,
    grpc.StatusCode.CANCELLED: Unavailable,
}


def _error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    try:
        status = rpc_status.from_call(error)
    except ValueError:  # details that do not match the status: ignore them
        return None
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None


def from_rpc_error(error: grpc.RpcError) -> ElectricError:
    """Translate a gRPC error; the only place the SDK does so."""
    code: grpc.StatusCode = error.code()
    message: str = error.details() or code.name
    info = _error_info(error)
    reason = info.reason if info is not None and info.domain == DOMAIN else None
    cls = _BY_REASON.get(reason or "") or _BY_STATUS.get(code, ServerError)
    metadata = dict(info.metadata) if info is not None else {}
    return cls(message, code=reason or cls.default_code, status=code.name, metadata=metadata)
