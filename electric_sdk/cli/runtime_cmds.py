"""`electric worker MODULE:APP` and `electric dev [MODULE:APP]`: the runtime's commands.

`worker` hosts an app's entity types against a server; `dev` starts the
server on the embedded default (SQLite in ``--data``), or on a PostgreSQL
``--database``, and a worker in one process. Both drain on the first SIGINT/SIGTERM (no new leases, runs finish
within ``--grace``, leases are released) and exit at once on a second one,
with 128 + the signal's number.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from .. import errors
from .._signals import drain_on_signals
from . import exit_codes
from .commands import duration_s
from .console import outlive_closed_output
from .local import resolve_store, storage_exit
from .logs import add_log_format, setup_logging
from .server_options import add_server_options, server_fields

DEFAULT_APP = "examples.agents:app"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--grace",
        metavar="DURATION",
        default="10s",
        help="how long runs may finish when draining (default %(default)s)",
    )
    p.add_argument("--worker-id", metavar="ID", help="this worker's id (default: host-pid-random)")
    p.add_argument(
        "--capacity", metavar="N", type=int, default=0, help="most entities hosted at once; 0: no limit"
    )
    p.add_argument(
        "--keepalive",
        metavar="DURATION",
        default="1s",
        help="ping the session's replica once nothing came from it for this long (default %(default)s)",
    )
    p.add_argument(
        "--keepalive-timeout",
        metavar="DURATION",
        default="500ms",
        help="give up on a replica that answers no ping within this, and move to another "
        '(default %(default)s; docs/scaling.md, "Failover")',
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log the runtime's decisions")
    add_log_format(p)
    p.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve this worker's Prometheus metrics at http://HOST:PORT/metrics (docs/operations.md); "
        "port 0 picks a free one (default: off)",
    )
    p.add_argument(
        "--exec",
        dest="exec_files",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="also host the exec entity types declared in this TOML file (repeatable; docs/exec.md)",
    )


def add_runtime_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("worker", help="host the entity types of MODULE:APP (connects to a server)")
    p.add_argument(
        "app", nargs="?", metavar="MODULE:APP", help="e.g. examples.agents:app (optional with --exec)"
    )
    # SUPPRESS: the global --address/--token given before the command are kept.
    p.add_argument(
        "--address", metavar="HOST:PORT", default=argparse.SUPPRESS, help="the server (env ELECTRIC_ADDRESS)"
    )
    p.add_argument(
        "--token", metavar="TOKEN", default=argparse.SUPPRESS, help="bearer token with the runtime scope"
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --metrics address (it has no auth; not recommended)",
    )
    _common(p)
    p.set_defaults(func=_cmd_worker)

    p = sub.add_parser(
        "dev", help="run a server (embedded SQLite, or --database) and a worker in one process"
    )
    p.add_argument(
        "app", nargs="?", metavar="MODULE:APP", help=f"default {DEFAULT_APP}, unless --exec files are given"
    )
    add_server_options(p, "dev")
    _common(p)
    p.set_defaults(func=_cmd_dev)


class _Apps:
    """MODULE:APP (re-imported by `dev` on a wake after an edit) plus the exec types of --exec files,
    checked once at start: a bad policy stops the command before it connects, so nothing is written."""

    def __init__(self, spec: str | None, exec_files: list[Path]) -> None:
        from ..runtime import App, AppReloader, DefinitionError
        from ..runtime.exec import load_exec_file

        if spec is None and not exec_files:
            raise errors.InvalidArgument("name MODULE:APP, or exec types with --exec FILE", code="USAGE")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # MODULE is found from the current directory, as `python -m` does
        try:
            self._reloader = AppReloader(spec) if spec is not None else None
        except Exception as exc:  # the user's module may raise anything while it is imported
            raise errors.InvalidArgument(f"cannot load {spec}: {_where(exc)}", code="USAGE") from exc
        self._exec = []
        for path in exec_files:
            try:
                self._exec += load_exec_file(path)
            except (DefinitionError, OSError, ValueError) as exc:
                detail = str(exc).removeprefix(f"{path}: ")  # the file is named once
                raise errors.InvalidArgument(f"cannot load {path}: {detail}", code="USAGE") from exc
        self._files = b"".join(path.read_bytes() for path in exec_files)
        try:
            self.app: App = self()
        except DefinitionError as exc:  # e.g. a type both the app and an exec file define
            raise errors.InvalidArgument(
                f"cannot load {spec or 'the exec files'}: {exc}", code="USAGE"
            ) from exc

    def __call__(self) -> Any:
        import hashlib

        from ..runtime import App

        base = self._reloader() if self._reloader is not None else None
        if not self._exec and base is not None:
            return base
        version = base.code_version if base is not None else hashlib.sha256(self._files).hexdigest()[:12]
        app = App(base.name if base is not None else "exec", code_version=version)
        for etype in [*(base.types.values() if base is not None else ()), *self._exec]:
            app.add(etype)  # a name defined twice is a DefinitionError
        return app


def _where(exc: BaseException) -> str:
    """An import failure as a newcomer can act on it: the error, and the file and line of their
    code that raised it (the last frame outside the import machinery and electric itself)."""
    import traceback

    from ..runtime import DefinitionError

    text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ImportError | DefinitionError) else str(exc)
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith("<frozen")
        and f"{os.sep}electric_sdk{os.sep}" not in f.filename
        and "importlib" not in f.filename
    ]
    if isinstance(exc, SyntaxError):
        return text  # it names its file and line itself
    if frames:
        return f"{text} ({frames[-1].filename}, line {frames[-1].lineno})"
    return text


def _load(spec: str | None, exec_files: list[Path] | None = None) -> Any:
    return _Apps(spec, exec_files or [])


def load_app_spec(spec: str) -> Any:
    """The App at MODULE:APP, imported from the current directory as `worker` does; a module that
    cannot be loaded is INVALID_ARGUMENT (USAGE) naming the file and line that failed."""
    return _Apps(spec, []).app


def _hints(address: str, app: Any, tools: list[str]) -> str:
    env = "" if address == "127.0.0.1:7700" else f"ELECTRIC_ADDRESS={address} "
    types = list(app.types)
    first = types[0] if types else "my_agent"
    return "\n".join(
        [
            f"  hosting: {', '.join(types)} (code version {app.code_version})",
            "  try, in another terminal (.venv/bin/electric when run from a checkout):",
            f"    {env}electric spawn {first}/r1",
            f"    {env}electric send {first}/r1 'quantum batteries'",
            f"    {env}electric events {first}/r1 --follow",
            f"    {env}electric signal {first}/r1 SIGINT       # abort the run, keep the entity",
            f'    {env}electric signal {first}/r1 SIGUSR --payload \'{{"focus": "cost"}}\'',
            f"    {env}electric signal {first}/r1 SIGSTOP      # then SIGCONT",
            f"    {env}electric signal {first}/r1 SIGTERM      # cleanup, then stopped",
            *_exec_hints(env, app),
            *tools,  # a server's own (`dev`): its gRPC tools line
            "  stop:    Ctrl-C drains and exits 0; a second Ctrl-C exits at once",
        ]
    )


def _exec_hints(env: str, app: Any) -> list[str]:
    from ..runtime.exec import ExecType

    kinds = [name for name, t in app.types.items() if isinstance(t, ExecType)]
    if not kinds:
        return []
    first = kinds[0]
    return [
        f"  exec entities ({', '.join(kinds)}): OS processes; receipts in docs/exec.md",
        f"    {env}electric spawn {first}/t1 && {env}electric events {first}/t1 --follow",
        f"    {env}electric signal {first}/t1 SIGTERM      # graceful, then force after the timeout",
        f"    {env}electric get {first}/t1                  # the process: generation, pid, last act",
    ]


async def _serve(reloader: Any, args: argparse.Namespace, *, server_config: Any = None) -> int:
    grace_s = duration_s(args.grace, "--grace", zero=True)
    announce = _announce_drain
    with drain_on_signals(announce) as drain:
        return await _serve_until_drained(reloader, args, server_config, grace_s, drain)


def _announce_drain(name: str) -> None:
    print(f"received {name}: draining (again to exit at once)", flush=True)


async def _serve_until_drained(
    reloader: Any, args: argparse.Namespace, server_config: Any, grace_s: float, drain: asyncio.Event
) -> int:
    import anyio

    from ..client import ClientOptions
    from ..runtime import Worker
    from ..runtime.metrics import WorkerMetrics

    server = None
    metrics_server = None
    crashed = False
    try:
        overrides: dict[str, Any] = {}
        if server_config is not None:
            from electric_server import ElectricServer

            server = ElectricServer(server_config)
            await server.start()
            server.drain_on_failure(drain)  # the store failed for good: stop, and say so (exit 74)
            overrides["address"] = server.address
            print(f"electric server listening on {server.address} ({server_config.where})", flush=True)
            if server.http is not None:
                print(f"electric http listening on {server.http.address}", flush=True)
        else:
            for name in ("address", "token"):
                if getattr(args, name, None):
                    overrides[name] = getattr(args, name)
        options = ClientOptions(**overrides)
        app = reloader.app
        reload_app = reloader if server_config is not None else None  # dev: edits apply at the next wake
        metrics = WorkerMetrics() if args.metrics else None
        worker = Worker(
            app,
            options=options,
            worker_id=args.worker_id,
            capacity=args.capacity,
            reload_app=reload_app,
            metrics=metrics,
            keepalive_ms=round(duration_s(args.keepalive, "--keepalive") * 1000),
            keepalive_timeout_ms=round(duration_s(args.keepalive_timeout, "--keepalive-timeout") * 1000),
        )
        if metrics is not None:
            metrics_server = _serve_metrics(metrics, args.metrics, getattr(args, "insecure", None))
            print(f"electric worker metrics on {metrics_server.url}", flush=True)
        failure: list[errors.ElectricError] = []
        async with anyio.create_task_group() as tg:

            async def run_worker() -> None:
                try:
                    await worker.run()
                except errors.ElectricError as exc:  # e.g. unauthenticated: the command ends with it
                    failure.append(exc)
                finally:
                    drain.set()

            tg.start_soon(run_worker)
            print(f"electric worker {worker.worker_id} connecting to {options.address}", flush=True)
            print(_hints(options.address, app, server.tool_hint() if server else []), flush=True)
            await drain.wait()
            await worker.shutdown(grace_s)
        if failure:
            raise failure[0]
    finally:
        if metrics_server is not None:
            metrics_server.close()
        if server is not None:
            crashed = await _stop_server(server)
    if server is not None and server.failure is not None:
        raise server.failure
    return exit_codes.SOFTWARE if crashed else exit_codes.OK


async def _stop_server(server: Any) -> bool:
    """Stop `dev`'s server; whether tasks of it had crashed (each logged when it crashed)."""
    from electric_server import TasksCrashed

    try:
        await server.stop()
    except TasksCrashed as exc:
        print(f"electric dev: {exc.message}", file=sys.stderr)
        return True
    return False


def _serve_metrics(metrics: Any, address: str, insecure: bool | None) -> Any:
    """Serve ``metrics`` on ``address``. The server's rule for ``--http`` applies: a non-loopback
    host needs ``--insecure`` (here always, since the endpoint has no auth); ``None``: the command
    has no ``--insecure`` (`dev`, a development server, serves loopback only)."""
    from ..listen import is_loopback, listen_host
    from ..runtime.metrics import MetricsServer

    try:
        host = listen_host(address, "--metrics")
    except ValueError as exc:
        raise errors.InvalidArgument(str(exc), code="USAGE") from None
    if not is_loopback(host) and not insecure:
        raise errors.InvalidArgument(
            f"refusing to serve metrics on non-loopback address --metrics {address!r} (they have no "
            "auth)" + ("" if insecure is None else "; pass --insecure to allow it"),
            code="USAGE",
        )
    try:
        return MetricsServer(metrics.registry, host, int(address.rpartition(":")[2]))
    except OSError as exc:
        raise errors.InvalidArgument(f"cannot serve metrics on {address}: {exc}", code="USAGE") from None


def _run(args: argparse.Namespace, server_config: Any = None) -> int:
    name = "dev" if server_config is not None else "worker"
    try:
        reloader = _load(args.app, args.exec_files)
        return asyncio.run(_serve(reloader, args, server_config=server_config))
    except errors.ElectricError as exc:
        print(f"electric {name}: {exc.code}: {exc.message}", file=sys.stderr)
        return exit_codes.for_error(exc)


def _cmd_worker(args: argparse.Namespace) -> int:
    outlive_closed_output("worker")
    setup_logging(args.log_format, verbose=args.verbose)
    return _run(args)


def _cmd_dev(args: argparse.Namespace) -> int:
    from electric_server import ConfigError, DatabaseUnavailable, ServerConfig, StorageFault

    outlive_closed_output("dev")
    setup_logging(args.log_format, verbose=args.verbose)
    resolve_store(args)
    try:
        # dev takes no --drain-grace: its server drains in a second, not in the server's default.
        config = ServerConfig(**server_fields(args, "dev"), drain_grace_s=1.0)
        if args.app is None and not args.exec_files:
            args.app = DEFAULT_APP
        return _run(args, server_config=config)
    except (ConfigError, DatabaseUnavailable) as exc:  # DatabaseUnavailable: no database to start on
        print(f"electric dev: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    except StorageFault as exc:  # damaged (refused to start), or failed (stopped)
        return storage_exit("dev", exc)
