"""Defining entity types: ``App`` and its ``@app.entity`` decorator.

An entity type is a class with ``async def on_message(self, ctx, message)``
and, optionally, ``async def on_signal(self, ctx, signal)`` (or per-signal
methods such as ``on_sigterm``); or a plain ``async def f(ctx, message)``
function, whose signal handler is added with ``@f.on_signal``. SIGKILL and
SIGSTOP cannot be handled: the runtime enforces them unconditionally, so
asking to handle either is a ``DefinitionError`` here, before anything runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from .._proto.electric.v1 import types_pb2 as pb
from ..client._options import DurationLike, to_duration
from ..lifecycle import HANDLEABLE, Signal

if TYPE_CHECKING:
    from .context import Context, Message, SignalInfo
    from .exec.spec import Backend, ExecType, ShutdownPolicy

__all__ = ["HANDLEABLE", "App", "AppReloader", "DefinitionError", "EntityType", "load_app"]

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")

MessageHandler = Callable[[Any, "Context", "Message"], Awaitable[Any]]
SignalHandler = Callable[[Any, "Context", "SignalInfo"], Awaitable[Any]]
C = TypeVar("C", bound=type)
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class DefinitionError(TypeError):
    """An entity type that must not run: found when it is defined, before any state is written."""


def _unhandleable(signal: Signal) -> DefinitionError:
    return DefinitionError(
        f"{signal.value} cannot be handled: the runtime enforces it unconditionally "
        f"(handlers may be registered for {', '.join(s.value for s in Signal if s in HANDLEABLE)})"
    )


def _handles(handles: Iterable[Signal | str] | None) -> frozenset[Signal]:
    if handles is None:
        return HANDLEABLE
    try:
        wanted = frozenset(Signal.parse(s) for s in handles)
    except ValueError as exc:
        raise DefinitionError(str(exc)) from None
    for signal in Signal:
        if signal in wanted and signal not in HANDLEABLE:
            raise _unhandleable(signal)
    return wanted


def _require_async(func: object, what: str) -> None:
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

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise DefinitionError(f"entity type {self.name!r} must match [A-Za-z0-9_.-]{{1,128}}")
        for label, value in (("grace_period", self.grace_period), ("idle_timeout", self.idle_timeout)):
            if value is not None:
                try:
                    to_duration(value)
                except ValueError as exc:
                    raise DefinitionError(f"{self.name}: {label}: {exc}") from None

    def handler_for(self, signal: Signal) -> SignalHandler | None:
        return self.handlers.get(signal)

    def profile(self) -> pb.Profile:
        profile = pb.Profile()
        if self.grace_period is not None:
            profile.grace_period.CopyFrom(to_duration(self.grace_period))
        if self.idle_timeout is not None:
            profile.idle_timeout.CopyFrom(to_duration(self.idle_timeout))
        return profile

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
            _require_async(f, f"{self.name}: on_signal")
            for signal in _handles(handles):
                self.handlers[signal] = _drop_instance(f)
            self.sources.append(f)
            return f

        return register(func) if func is not None else register


def _drop_instance(func: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def call(_instance: Any, ctx: Any, arg: Any) -> Any:
        return await func(ctx, arg)

    return call


def _class_type(
    name: str, cls: type, grace: DurationLike | None, idle: DurationLike | None, handles: frozenset[Signal]
) -> EntityType:
    on_message = getattr(cls, "on_message", None)
    if on_message is None:
        raise DefinitionError(f"{cls.__qualname__} needs async def on_message(self, ctx, message)")
    _require_async(on_message, f"{cls.__qualname__}.on_message")
    handlers: dict[Signal, SignalHandler] = {}
    generic = getattr(cls, "on_signal", None)
    if generic is not None:
        _require_async(generic, f"{cls.__qualname__}.on_signal")
        handlers = dict.fromkeys(handles, generic)
    for signal in Signal:
        method = getattr(cls, f"on_{signal.name.lower()}", None)
        if method is None:
            continue
        if signal not in HANDLEABLE:
            raise _unhandleable(signal)
        _require_async(method, f"{cls.__qualname__}.on_{signal.name.lower()}")
        handlers[signal] = method  # a per-signal method wins over on_signal
    return EntityType(name, on_message, cls, grace, idle, handlers, [cls])


class _Define:
    """What ``app.entity(...)`` returns: a class comes back unchanged, a function as an EntityType."""

    def __init__(self, define: Callable[[Any], Any]) -> None:
        self._define = define

    @overload
    def __call__(self, target: C) -> C: ...
    @overload
    def __call__(self, target: Callable[..., Awaitable[Any]]) -> EntityType: ...
    def __call__(self, target: Any) -> Any:
        return self._define(target)


class App:
    """A set of entity types a worker hosts, and the code version it announces.

    >>> app = App()
    >>> @app.entity("research", grace_period="30s", idle_timeout="60s")
    ... class Research:
    ...     async def on_message(self, ctx, message): ...
    """

    def __init__(self, name: str = "electric", *, code_version: str | None = None) -> None:
        self.name = name
        self.types: dict[str, EntityType] = {}
        self._code_version = code_version

    def entity(
        self,
        name: str,
        *,
        grace_period: DurationLike | None = None,
        idle_timeout: DurationLike | None = None,
        handles: Iterable[Signal | str] | None = None,
    ) -> _Define:
        """Define an entity type from a class (returned unchanged) or an async function
        (an ``EntityType`` is returned, so ``@fn.on_signal`` can add a handler)."""
        if not _NAME.fullmatch(name):
            raise DefinitionError(f"entity type {name!r} must match [A-Za-z0-9_.-]{{1,128}}")
        wanted = _handles(handles)

        def define(target: Any) -> Any:
            if name in self.types:
                raise DefinitionError(f"entity type {name!r} is already defined in this app")
            if inspect.isclass(target):
                self.types[name] = _class_type(name, target, grace_period, idle_timeout, wanted)
                return target
            _require_async(target, f"{name}: the message handler")
            etype = EntityType(
                name, _drop_instance(target), SimpleNamespace, grace_period, idle_timeout, sources=[target]
            )
            self.types[name] = etype
            return etype

        return _Define(define)

    def exec(
        self,
        id: str,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        keep: bool = False,
        tags: Sequence[str] = (),
        shutdown: ShutdownPolicy | None = None,
        grace_period: DurationLike | None = None,
        idle_timeout: DurationLike | None = None,
        backend: Backend | None = None,
        stdin_format: Literal["text", "json"] = "text",
        output_limit: int | None = None,
    ) -> ExecType:
        """Define an exec entity type: each entity of it is an OS process (docs/exec.md).

        >>> app.exec("tail", ["tail", "-F", "app.log"], keep=True,
        ...          shutdown=ShutdownPolicy("SIGTERM", "5s"), grace_period="10s")
        """
        from .exec import spec as exec_spec

        spec = exec_spec.ExecSpec(
            id=id,
            command=command,
            cwd=cwd,
            env=dict(env or {}),
            keep=keep,
            tags=tuple(tags),
            shutdown=shutdown,
            grace_period=grace_period,
            idle_timeout=idle_timeout,
            backend=backend or exec_spec.DEFAULT_BACKEND,
            stdin_format=stdin_format,
            output_limit=exec_spec.DEFAULT_OUTPUT_LIMIT if output_limit is None else output_limit,
        )
        etype = exec_spec.define(spec)
        self.add(etype)
        return etype

    def add_exec_file(self, path: str | os.PathLike[str]) -> list[ExecType]:
        """Add every exec type declared in a TOML file (docs/exec.md has the grammar)."""
        from .exec.config import load_exec_file

        types = load_exec_file(path)
        for etype in types:
            self.add(etype)
        return types

    def add(self, etype: EntityType) -> EntityType:
        if etype.name in self.types:
            raise DefinitionError(f"entity type {etype.name!r} is already defined in this app")
        self.types[etype.name] = etype
        return etype

    @property
    def code_version(self) -> str:
        """The version announced in Hello: given, else a hash of the defining modules' source."""
        if self._code_version:
            return self._code_version
        digest = hashlib.sha256()
        found = False
        for module_name in sorted(
            {getattr(s, "__module__", "") for t in self.types.values() for s in t.sources}
        ):
            module = sys.modules.get(module_name)
            try:
                source = inspect.getsource(module) if module is not None else None
            except (OSError, TypeError):
                source = None
            if source is not None:
                found = True
                digest.update(module_name.encode() + b"\0" + source.encode())
        return digest.hexdigest()[:12] if found else "dev"


def load_app(spec: str) -> App:
    """``"package.module:app"`` (or just the module, if it holds exactly one App)."""
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise DefinitionError(f"expected MODULE:APP, got {spec!r}")
    module = importlib.import_module(module_name)
    if attr:
        app = getattr(module, attr, None)
        if not isinstance(app, App):
            raise DefinitionError(f"{module_name}:{attr} is not an electric_sdk.runtime.App")
        return app
    apps = [v for v in vars(module).values() if isinstance(v, App)]
    if len(apps) != 1:
        raise DefinitionError(f"{module_name} holds {len(apps)} App objects; name one as {module_name}:NAME")
    return apps[0]


class AppReloader:
    """``electric dev``: the app of ``MODULE:APP`` afresh, re-imported when its source changed.

    A worker given one calls it on every wake (idle → running, and spawning), so
    a developer's edit takes effect at the next wake, e.g. after SIGHUP.
    """

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.app = load_app(spec)
        self._module = sys.modules[spec.partition(":")[0]]
        self._stamp = self._source_stamp()

    def _source_stamp(self) -> int | None:
        path = getattr(self._module, "__file__", None)
        try:
            return os.stat(path).st_mtime_ns if path else None
        except OSError:
            return None

    def __call__(self) -> App:
        stamp = self._source_stamp()
        if stamp != self._stamp:
            self._stamp = stamp
            cached = getattr(self._module, "__cached__", None)
            if cached:  # its bytecode may look fresh: an edit within a second that kept the size
                with contextlib.suppress(OSError):
                    os.remove(cached)
            self._module = importlib.reload(self._module)
            self.app = load_app(self.spec)
        return self.app
