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
import importlib
import inspect
import os
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from types import SimpleNamespace
from typing import Any, Literal, TypeVar, overload

from ..busy import BusyPolicyName
from ..client._options import DurationLike
from ..durable_state import SnapshotPolicy
from ..lifecycle import HANDLEABLE, Signal
from .a2a_calls import A2AAgent
from .code_version import source_version
from .codec import Codec, JSONCodec
from .entity_type import (
    TYPE_NAME,
    DefinitionError,
    EntityType,
    SignalHandler,
    Versioning,
    drop_instance,
    handled_signals,
    require_async,
    unhandleable,
)
from .exec import spec as exec_spec
from .exec.config import load_exec_file
from .exec.reply import Reply
from .exec.spec import Backend, ExecType, ShutdownPolicy
from .mcp import DEFAULT_CANCEL_BOUND_S, McpServer
from .steps import seconds

__all__ = ["HANDLEABLE", "App", "AppReloader", "DefinitionError", "EntityType", "load_app"]

C = TypeVar("C", bound=type)


def _class_type(
    name: str,
    cls: type,
    grace: DurationLike | None,
    idle: DurationLike | None,
    handles: frozenset[Signal],
    state: bool | None,
    snapshots: SnapshotPolicy,
) -> EntityType:
    on_message = getattr(cls, "on_message", None)
    if on_message is None:
        raise DefinitionError(f"{cls.__qualname__} needs async def on_message(self, ctx, message)")
    require_async(on_message, f"{cls.__qualname__}.on_message")
    handlers: dict[Signal, SignalHandler] = {}
    generic = getattr(cls, "on_signal", None)
    if generic is not None:
        require_async(generic, f"{cls.__qualname__}.on_signal")
        handlers = dict.fromkeys(handles, generic)
    for signal in Signal:
        method = getattr(cls, f"on_{signal.name.lower()}", None)
        if method is None:
            continue
        if signal not in HANDLEABLE:
            raise unhandleable(signal)
        require_async(method, f"{cls.__qualname__}.on_{signal.name.lower()}")
        handlers[signal] = method  # a per-signal method wins over on_signal
    return EntityType(name, on_message, cls, grace, idle, handlers, [cls], state, snapshots)


async def _no_handler(_instance: Any, _ctx: Any, _message: Any) -> None:
    """The handler of the type ``App.entity`` builds to check its versioning before the real one."""


@contextlib.contextmanager
def _naming(name: str, field: str | None) -> Iterator[None]:
    """Every DefinitionError raised while defining a type names the type (and the field, if known):
    a newcomer with several types in one module sees at once which definition to fix."""
    try:
        yield
    except DefinitionError as exc:
        prefix = f"entity type {name!r}: "
        text = str(exc)
        if text.startswith(prefix) or text.startswith(f"entity type {name!r} "):
            raise
        where = f"{field}: " if field else ""
        raise DefinitionError(f"{prefix}{where}{text}") from None


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

    def __init__(
        self, name: str = "electric", *, code_version: str | None = None, codec: Codec | None = None
    ) -> None:
        self.name = name
        # How step results are recorded and rebuilt (codec.py): JSON, dataclasses, pydantic models.
        self.codec: Codec = codec or JSONCodec()
        self.types: dict[str, EntityType] = {}
        self.mcp_servers: dict[str, McpServer] = {}
        self.a2a_agents: dict[str, A2AAgent] = {}
        self._code_version = code_version

    def mcp_server(
        self,
        name: str,
        *,
        command: Sequence[str] = (),
        url: str = "",
        env: Mapping[str, str] | None = None,
        cancel_bound: DurationLike | None = None,
    ) -> McpServer:
        """Declare an MCP server its entities call tools of (``ctx.call_tool``, docs/runtime.md):
        ``command`` starts it as a subprocess (stdio), ``url`` reaches it over streamable HTTP;
        ``cancel_bound``: how long a call cut by a signal may take to tell the server before it is
        given up on, recorded ``bound_passed`` (default 1s).

        >>> search = app.mcp_server("search", command=["python", "search_server.py"])
        """
        if name in self.mcp_servers:
            raise ValueError(f"MCP server {name!r} is declared twice")
        bound = DEFAULT_CANCEL_BOUND_S if cancel_bound is None else seconds(cancel_bound)
        server = McpServer(name, tuple(command), url, dict(env) if env is not None else None, bound)
        self.mcp_servers[name] = server
        return server

    def a2a_agent(
        self, name: str, *, url: str, token: str = "", cancel_bound: DurationLike = "2s"
    ) -> A2AAgent:
        """Declare an A2A agent its entities send messages to (``ctx.call_agent``,
        docs/runtime.md): ``url`` is where its card is read; ``token`` a bearer token;
        ``cancel_bound`` how long it has to answer a cut call's ``CancelTask``.

        >>> researcher = app.a2a_agent("researcher", url="http://127.0.0.1:9000/")
        """
        if name in self.a2a_agents:
            raise ValueError(f"A2A agent {name!r} is declared twice")
        agent = A2AAgent(name, url, token, seconds(cancel_bound))
        self.a2a_agents[name] = agent
        return agent

    def entity(
        self,
        name: str,
        *,
        grace_period: DurationLike | None = None,
        idle_timeout: DurationLike | None = None,
        handles: Iterable[Signal | str] | None = None,
        state: bool | None = None,
        snapshots: SnapshotPolicy | None = None,
        versioning: Versioning | None = None,
        upgrade_after: DurationLike | None = None,
        sigterm_interrupts: bool = False,
        children: Literal["cascade", "detach"] = "cascade",
        on_busy: BusyPolicyName = "enqueue",
        on_busy_choices: Iterable[BusyPolicyName] = (),
    ) -> _Define:
        """Define an entity type from a class (returned unchanged) or an async function
        (an ``EntityType`` is returned, so ``@fn.on_signal`` can add a handler). ``state``: whether
        its entities keep durable state (default: whether its code uses ``ctx.state``);
        ``snapshots``: when its hosts write a snapshot of that state (``SnapshotPolicy()``);
        ``versioning``: what a run delivered again does when no worker of the code version it
        started on is connected — ``"pinned"`` (it waits for one, for ``upgrade_after`` if given)
        or ``"auto_upgrade"`` (it is replayed on the version new wakes get); default: the server's,
        pinned for ``electric server --upgrade-after`` (10 min), then upgraded (docs/runtime.md,
        "Deploys"); ``sigterm_interrupts``: a SIGTERM interrupts the step in progress at once, as
        SIGINT does, so ``on_signal(SIGTERM)`` runs within the grace (default: at the next step
        boundary, the RFC's timing; ``lifecycle.OPT_IN_TIMING``); ``children``: whether its
        entities' SIGTERM and SIGKILL cascade to their child entities (``"cascade"``, the default)
        or leave them as they are (``"detach"``; docs/runtime.md, "Child entities"); ``on_busy``:
        what a message does while a run is in progress (``"enqueue"``, the default, ``"reject"``,
        ``"interrupt"``, ``"rollback"`` or ``"steer"``), and ``on_busy_choices`` the policies a message may
        choose for itself besides enqueue, reject and ``on_busy`` (docs/double-texting.md)."""
        probe = EntityType(
            name,
            _no_handler,
            SimpleNamespace,
            versioning=versioning,
            upgrade_after=upgrade_after,
            children=children,
            on_busy=on_busy,
            on_busy_choices=tuple(on_busy_choices),
        )
        policy = snapshots or SnapshotPolicy()
        if not TYPE_NAME.fullmatch(name):
            raise DefinitionError(f"entity type {name!r} must match [A-Za-z0-9_.-]{{1,128}}")
        with _naming(name, "handles"):
            wanted = handled_signals(handles)

        def define(target: Any) -> Any:
            if name in self.types:
                raise DefinitionError(f"entity type {name!r} is already defined in this app")
            with _naming(name, None):
                if inspect.isclass(target):
                    etype = _class_type(name, target, grace_period, idle_timeout, wanted, state, policy)
                    etype.versioning, etype.upgrade_after = probe.versioning, probe.upgrade_after
                    etype.sigterm_interrupts = sigterm_interrupts
                    etype.children = children
                    etype.on_busy, etype.on_busy_choices = probe.on_busy, probe.on_busy_choices
                    etype.codec = self.codec
                    self.types[name] = etype
                    return target
                require_async(target, "the message handler")
                etype = EntityType(
                    name,
                    drop_instance(target),
                    SimpleNamespace,
                    grace_period,
                    idle_timeout,
                    sources=[target],
                    state=state,
                    snapshots=policy,
                    versioning=probe.versioning,
                    upgrade_after=probe.upgrade_after,
                    sigterm_interrupts=sigterm_interrupts,
                    children=children,
                    on_busy=probe.on_busy,
                    on_busy_choices=probe.on_busy_choices,
                    codec=self.codec,
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
        reply: Reply | None = None,
    ) -> ExecType:
        """Define an exec entity type: each entity of it is an OS process (docs/exec.md).

        >>> app.exec("tail", ["tail", "-F", "app.log"], keep=True,
        ...          shutdown=ShutdownPolicy("SIGTERM", "5s"), grace_period="10s")
        >>> app.exec("calc", ["bc", "-lq"], reply=Reply.lines(1))  # each run's output: bc's answer
        """
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
            reply=reply,
        )
        etype = exec_spec.define(spec)
        self.add(etype)
        return etype

    def add_exec_file(self, path: str | os.PathLike[str]) -> list[ExecType]:
        """Add every exec type declared in a TOML file (docs/exec.md has the grammar)."""
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
        """The version announced in Hello: given, else a hash of the app's own source files
        (code_version.py says which)."""
        if self._code_version:
            return self._code_version
        return source_version(getattr(s, "__module__", "") for t in self.types.values() for s in t.sources)


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
