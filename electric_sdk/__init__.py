"""electric: Unix-style lifecycle signals for long-running agents.

The public API is what this module exports (pinned by a test); everything
else is private. Start with ``Client`` (sync; scripts and notebooks) or
``AsyncClient`` (asyncio).
"""

from .client import AsyncClient, Client, ClientOptions, RetryPolicy
from .code_versions import CodeVersionInfo, TypeVersions
from .errors import (
    DeadlineExceeded,
    ElectricError,
    EntityBusy,
    EntityExists,
    EntityNotFound,
    EntityTerminal,
    FailedPrecondition,
    IdempotencyKeyReused,
    InvalidArgument,
    InvalidSignal,
    PermissionDenied,
    RunNotEnded,
    ServerError,
    Unauthenticated,
    Unavailable,
    WatchLagging,
    WrongEventLoop,
)
from .models import (
    Entity,
    EntityChange,
    EntityRef,
    Event,
    EventPage,
    LeaseHolder,
    MessageReceipt,
    Outcome,
    RunResult,
    Signal,
    SignalManyResult,
    SignalResult,
    State,
)
from .presence import WorkerInfo
from .version import __version__

__all__ = [
    "AsyncClient",
    "Client",
    "ClientOptions",
    "CodeVersionInfo",
    "DeadlineExceeded",
    "ElectricError",
    "Entity",
    "EntityBusy",
    "EntityChange",
    "EntityExists",
    "EntityNotFound",
    "EntityRef",
    "EntityTerminal",
    "Event",
    "EventPage",
    "FailedPrecondition",
    "IdempotencyKeyReused",
    "InvalidArgument",
    "InvalidSignal",
    "LeaseHolder",
    "MessageReceipt",
    "Outcome",
    "PermissionDenied",
    "RetryPolicy",
    "RunNotEnded",
    "RunResult",
    "ServerError",
    "Signal",
    "SignalManyResult",
    "SignalResult",
    "State",
    "TypeVersions",
    "Unauthenticated",
    "Unavailable",
    "WatchLagging",
    "WorkerInfo",
    "WrongEventLoop",
    "__version__",
]
