"""An entity type's definition: its name, handlers and profile defaults.

``App`` builds these (from a class or a function) and the exec module builds
its own kind (``ExecType``); both check a definition here, when it is made,
so a type that must not run fails before any lifecycle state is written.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args, overload

from .. import busy
from .._proto.electric.v1 import runtime_service_pb2 as rt
from .._proto.electric.v1 import types_pb2 as pb
from .._wire.versions import VERSIONING_TO_PB
from ..client._options import DurationLike, to_duration
from ..durable_state import SnapshotPolicy
from ..lifecycle import HANDLEABLE, Signal
from .codec import Codec, JSONCodec

if TYPE_CHECKING:
    from .context import Context, Message, SignalInfo

__all__ = [
    "TYPE_NAME",
    "VERSIONINGS",
    "DefinitionError",
    "EntityType",
    "MessageHandler",
    "SignalHandler",
    "Versioning",
    "drop_instance",
    "handled_signals",
    "require_async",
    "unhandleable",
]

TYPE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
# How a type's runs follow deploys (docs/runtime.md, "Deploys"); the server's versions.py.
Versioning = Literal["pinned", "auto_upgrade"]
VERSIONINGS: tuple[Versioning, ...] = get_args(Versioning)

MessageHandler = Callable[[Any, "Context", "Message"], Awaitable[Any]]
SignalHandler = Callable[[Any, "Context", "SignalInfo"], Awaitable[Any]]
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class DefinitionError(TypeError):
    """An entity type that must not run: found when it is defined, before any state is written."""


def unhandleable(signal: Signal) -> DefinitionError:
    return DefinitionError(
        f"{signal.value} cannot be handled: the runtime enforces it unconditionally "
        f"(handlers may be registered for {', '.join(s.value for s in Signal if s in HANDLEABLE)})"
    )


def handled_signals(handles: Iterable[Signal | str] | None) -> frozenset[Signal]:
    if handles is None:
        return HANDLEABLE
    try:
        wanted = frozenset(Signal.parse(s) for s in handles)
    except ValueError as exc:
        raise DefinitionError(str(exc)) from None
    for signal in Signal:
        if signal in wanted and signal not in HANDLEABLE:
            raise unhandleable(signal)
    return wanted


def require_async(func: object, what: str) -> None:
    if not inspect.iscoroutinefunction(func):
        raise DefinitionError(f"{what} must be an async function (async def)")


@dataclass
class EntityType:
    """One hosted entity type: its handlers and the profile defaults announced to the server."""

    name: str
    on_message: MessageHandler
    factory: Callable[[], Any]
    grace_period: DurationLike | None = None
    idle_timeout: DurationLike | None = None
    handlers: dict[Signal, SignalHandler] = field(default_factory=dict)
    # The objects whose source makes up the code version.
    sources: list[object] = field(default_factory=list)
    # Whether its entities keep durable state (``ctx.state``): their hosts rebuild it at each
    # lease. None: found from the code (``uses_state``).
    state: bool | None = None
    # When its hosts write a snapshot of the state.
    snapshots: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    # What a run of it does when it must be delivered again (its worker crashed, drained, lost its
    # lease) and no worker of the code version it started on is connected: "pinned" (it waits, for
    # ``upgrade_after`` if given), "auto_upgrade" (replayed on the version new wakes get), or None:
    # the server's default, pinned for `electric server --upgrade-after` (docs/runtime.md, Deploys).
    versioning: Versioning | None = None
    upgrade_after: DurationLike | None = None
    # Whether a SIGTERM interrupts the step in progress at once (as SIGINT does) instead of
    # waiting for the run's next step boundary (lifecycle.OPT_IN_TIMING).
    sigterm_interrupts: bool = False
    # "detach": its entities' SIGTERM and SIGKILL leave their children as they are; "cascade"
    # (the default) reaches them (docs/runtime.md, Child entities).
    children: str = "cascade"
    # What a message does while a run is in progress (electric_sdk/busy.py; the server judges it),
    # and the policies a message may choose besides enqueue, reject and that one.
    on_busy: str = "enqueue"
    on_busy_choices: tuple[str, ...] = ()
    # The steps a worker has warned of (a declared timeout past the grace): each is named once.
    warned_steps: set[str] = field(default_factory=set, repr=False, compare=False)
    # How its steps' results are recorded and rebuilt: the app's (``App(codec=...)``).
    codec: Codec = field(default_factory=JSONCodec)

    @property
    def may_roll_back(self) -> bool:
        """Whether a message may roll a run of it back: each run keeps a copy of its start's state."""
        return busy.BusyPolicy.ROLLBACK.value in (self.on_busy, *self.on_busy_choices)

    def __post_init__(self) -> None:
        if not TYPE_NAME.fullmatch(self.name):
            raise DefinitionError(f"entity type {self.name!r} must match [A-Za-z0-9_.-]{{1,128}}")
        if self.versioning not in (None, *VERSIONINGS):
            raise DefinitionError(
                f"entity type {self.name!r}: versioning must be one of {', '.join(VERSIONINGS)}, "
                f"got {self.versioning!r}"
            )
        if self.children not in ("cascade", "detach"):
            raise DefinitionError(
                f"entity type {self.name!r}: children must be 'cascade' or 'detach', got {self.children!r}"
            )
        try:
            if busy.parse(self.on_busy) is None:
                raise ValueError("on_busy must name a policy")
            busy.parse_choices(self.on_busy_choices)
        except ValueError as exc:
            raise DefinitionError(f"entity type {self.name!r}: {exc}") from None
        if self.upgrade_after is not None and self.versioning != "pinned":
            raise DefinitionError(
                f"entity type {self.name!r}: upgrade_after bounds a pinned run's wait: "
                "give it with versioning='pinned'"
            )
        durations = (
            ("grace_period", self.grace_period),
            ("idle_timeout", self.idle_timeout),
            ("upgrade_after", self.upgrade_after),
        )
        for label, value in durations:
            if value is not None:
                try:
                    to_duration(value)
                except ValueError as exc:
                    raise DefinitionError(f"entity type {self.name!r}: {label}: {exc}") from None

    @functools.cached_property  # asked at every lease; the handlers are all registered by then
    def uses_state(self) -> bool:
        """``state`` if given, else whether the type's code reads an attribute called ``state``
        (``ctx.state``): a host rebuilds the state at its lease only for types that use it, since
        the rebuild reads the stream. A helper elsewhere that uses ``ctx.state`` is not seen:
        ``app.entity(..., state=True)`` says so then."""
        if self.state is not None:
            return self.state
        return any("state" in names for names in map(_code_names, self.sources))

    def handler_for(self, signal: Signal) -> SignalHandler | None:
        return self.handlers.get(signal)

    def profile(self) -> pb.Profile:
        profile = pb.Profile()
        if self.grace_period is not None:
            profile.grace_period.CopyFrom(to_duration(self.grace_period))
        if self.idle_timeout is not None:
            profile.idle_timeout.CopyFrom(to_duration(self.idle_timeout))
        return profile

    def hosted(self, default_versioning: Versioning | None = None) -> rt.HostedType:
        """What a worker announces of this type: its profile defaults and its versioning
        (``default_versioning`` where the type chose none: `electric dev`'s auto_upgrade)."""
        hosted = rt.HostedType(type=self.name, profile=self.profile())
        versioning = self.versioning or default_versioning
        if versioning is not None:
            hosted.versioning = VERSIONING_TO_PB[versioning]
        if self.upgrade_after is not None:
            hosted.upgrade_after.CopyFrom(to_duration(self.upgrade_after))
        hosted.detach_children = self.children == "detach"
        hosted.on_busy = self.on_busy
        hosted.on_busy_choices.extend(sorted(busy.parse_choices(self.on_busy_choices)))
        return hosted

    @overload
    def on_signal(self, func: F, *, handles: Iterable[Signal | str] | None = None) -> F: ...
    @overload
    def on_signal(
        self, func: None = None, *, handles: Iterable[Signal | str] | None = None
    ) -> Callable[[F], F]: ...
    def on_signal(
        self, func: F | None = None, *, handles: Iterable[Signal | str] | None = None
    ) -> F | Callable[[F], F]:
        """Register ``async def handler(ctx, signal)`` for a function-style entity type."""

        def register(f: F) -> F:
            require_async(f, f"{self.name}: on_signal")
            for signal in handled_signals(handles):
                self.handlers[signal] = drop_instance(f)
            self.sources.append(f)
            return f

        return register(func) if func is not None else register


def _code_names(source: object) -> set[str]:
    """Every name the code of a function (or of a class's functions) refers to, nested code too."""
    if inspect.isclass(source):
        return set().union(*map(_code_names, vars(source).values()))
    code = getattr(inspect.unwrap(source), "__code__", None) if callable(source) else None
    names: set[str] = set()
    stack = [code] if code is not None else []
    while stack:
        current = stack.pop()
        names.update(current.co_names)
        stack.extend(c for c in current.co_consts if inspect.iscode(c))
    return names


def drop_instance(func: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def call(_instance: Any, ctx: Any, arg: Any) -> Any:
        return await func(ctx, arg)

    return call
