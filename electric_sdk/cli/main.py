"""`electric`: the command line. This module owns the parser and the dispatch.

Client commands (commands.py, streams.py) talk to a server through the public
``electric_sdk.Client``; `server` and `verify` (local.py) work on a data
directory. Every client error is printed once, here, as
``electric: CODE: message`` on stderr (plus the RFC's error JSON on stdout with
``--json``), and becomes an exit code from exit_codes.py, whose docstring is
the table. docs/cli.md is the user's guide.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeAlias

from .. import errors
from .._wire.run_outcome import WAIT_KINDS
from ..busy import BusyPolicy
from ..lifecycle import DEFAULT_GRACE_MS, DEFAULT_IDLE_TIMEOUT_MS, Stage
from . import (
    commands,
    completion,
    console,
    exit_codes,
    help_text,
    local,
    mcp_cmd,
    presence_cmds,
    replay_cmd,
    run_cmd,
    runtime_cmds,
    streams,
    transfer_cmds,
    versions_cmds,
)
from .commands import Invocation, client_options, with_hint
from .console import Console

EPILOG = f"exit codes: {exit_codes.SUMMARY}. See docs/cli.md."
CommandFunc = Callable[[Invocation, argparse.Namespace], int]
Subparsers: TypeAlias = "argparse._SubParsersAction[Any]"  # of _Parser
REF_HELP = "the entity, e.g. my_agent/agent_1"


class UsageError(errors.InvalidArgument):
    """A command line argparse rejects; reported like every other error (code USAGE, exit 2)."""

    default_code = "USAGE"

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.usage = usage


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.format_usage())

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # A mistyped command: name the closest one (argparse lists them all, unranked).
        if isinstance(action, argparse._SubParsersAction) and value not in action.choices:
            hint = help_text.did_you_mean(value, action.choices)
            self.error(f"unknown command {value!r}{hint}; `electric --help` lists them")
        super()._check_value(action, value)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``parse_args``, but a flag the command does not take is reported with that command's usage
    (argparse hands it back to the top-level parser, whose usage says nothing about the command)."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        command = commands_of(parser).get(getattr(args, "command", ""), parser)
        raise UsageError(f"unrecognized arguments: {' '.join(extras)}", command.format_usage())
    return args


def commands_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each command's parser, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _add_global_options(parser: argparse.ArgumentParser, *, on_subcommand: bool) -> None:
    # On a subcommand the defaults are SUPPRESS, so a flag given before the subcommand is kept.
    def default(value: object) -> object:
        return argparse.SUPPRESS if on_subcommand else value

    group = parser.add_argument_group("global options (before or after the command)")
    group.add_argument(
        "--address",
        metavar="HOST:PORT",
        default=default(None),
        help=f"the server, or several replicas as HOST:PORT,HOST:PORT (env ELECTRIC_ADDRESS; default "
        f"{commands.DEFAULT_ADDRESS})",
    )
    group.add_argument("--token", default=default(None), help="bearer token (env ELECTRIC_TOKEN)")
    group.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="machine output: one JSON object, or one JSON record per line for streams",
    )
    group.add_argument(
        "--timeout",
        metavar="DURATION",
        default=default(None),
        help=f"deadline of each call, retries included, e.g. 5s (default {commands.DEFAULT_TIMEOUT})",
    )


def _stage_wait(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait",
        choices=[stage.value for stage in Stage],
        metavar="STAGE",
        help="answer once the signal reached this stage and print each stage (accepted, handled, "
        "unwound, downstream, reaped, terminal; which a signal has: docs/signals.md); exit 124 past "
        "--timeout (0: answer at once with what is reached), 10 when it cannot be reached any more",
    )


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _whole(text: str) -> int:
    """A whole number, its range left to the server (which refuses a negative offset or step)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _states(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--state",
        action="extend",
        nargs="+",
        metavar="STATE",
        help=f"only {what} in these states (repeat, or separate with commas)",
    )


def _client_commands(sub: Subparsers) -> None:
    def add(name: str, func: CommandFunc, help: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(
            name, help=help, description=help[0].upper() + help[1:] + "."
        )
        p.set_defaults(client_func=func)
        _add_global_options(p, on_subcommand=True)
        return p

    p = add("spawn", commands.spawn, "create an entity (it starts in spawning)")
    p.add_argument("ref", metavar="TYPE/ID", help=REF_HELP)
    grace, idle = DEFAULT_GRACE_MS // 1000, DEFAULT_IDLE_TIMEOUT_MS // 1000
    p.add_argument("--grace", metavar="DURATION", help=f"SIGTERM grace period (server default {grace}s)")
    p.add_argument("--idle-timeout", metavar="DURATION", help=f"idle timeout (server default {idle}s)")
    p.add_argument("--parent", metavar="TYPE/ID", help="the entity it works for: its SIGTERM/SIGKILL cascade")

    p = add("get", commands.get, "show one entity")
    p.add_argument("ref", metavar="TYPE/ID", help=REF_HELP)

    p = add("ls", commands.ls, "list entities, ordered by type and id")
    p.add_argument("--type", help="only entities of this type")
    p.add_argument("--parent", metavar="TYPE/ID", help="only the children of this entity")
    _states(p, "entities")
    p.add_argument("--limit", type=_positive, metavar="N", help="at most N entities")

    p = add("signal", commands.signal, "send a signal: SIGINT SIGHUP SIGTERM SIGKILL SIGSTOP SIGCONT SIGUSR")
    p.add_argument("ref", metavar="TYPE/ID", help=REF_HELP)
    p.add_argument(
        "signal", metavar="SIGNAL", help="e.g. SIGTERM, sigterm, TERM or 15 (numbers: 1 2 9 15 only)"
    )
    p.add_argument("--reason", default="", help="why; recorded on the signal event")
    p.add_argument("--payload", metavar="JSON", help="a JSON value (SIGUSR only)")
    p.add_argument(
        "--interrupt",
        action="store_true",
        help="SIGTERM only: interrupt the step in progress at once, so the cleanup runs within the grace",
    )
    _stage_wait(p)

    p = add("kill", commands.kill, "SIGKILL an entity: stop it at once")
    p.add_argument("ref", metavar="TYPE/ID", help=REF_HELP)
    p.add_argument("--reason", default="", help="why; recorded on the signal event")
    _stage_wait(p)

    p = add("send", commands.send, "append a message to an entity's stream")
    p.add_argument("ref", metavar="TYPE/ID", help=REF_HELP)
    p.add_argument("text", nargs="?", default="", metavar="TEXT", help="the message text")
    p.add_argument("--data", metavar="JSON", help="a JSON value sent with the text")
    p.add_argument(
        "--wait",
        choices=WAIT_KINDS,
        help="run: wait for the run the message starts and print how it ended (exit 8 failed, 9 aborted)",
    )
    p.add_argument(
        "--policy",
        choices=[policy.value for policy in BusyPolicy],
        help="what the message does if a run is in progress (default: its entity type's policy; "
        "reject refused exits 4 with ENTITY_BUSY; docs/double-texting.md)",
    )
    p.epilog = (
        "With --wait, --timeout bounds the wait from the message's acceptance (default none; 0 answers "
        "at once; exit 124 when it passes: the message stays delivered)."
    )

    p = add("fork", commands.fork, "create an entity whose stream starts as another's, up to an offset")
    p.add_argument("ref", metavar="TYPE/ID", help="the origin (any state: a stopped or killed one too)")
    p.add_argument("new_id", metavar="NEW_ID", help="the fork's id (its type is the origin's)")
    p.add_argument("--at", type=_whole, metavar="OFFSET", help="fork before this offset (default: the head)")
    p.add_argument("--reason", default="", help="why; recorded on the fork record")

    p = add("retry", commands.retry, "run a failed or aborted run again, replaying its steps before N")
    p.add_argument("ref", metavar="TYPE/ID", help=REF_HELP)
    p.add_argument("run", metavar="RUN", help="the run's message key, as `electric events` shows it")
    p.add_argument(
        "--from-step",
        type=_whole,
        default=0,
        metavar="N",
        help="the first step executed again (default 0: all)",
    )
    p.add_argument("--reason", default="", help="why; recorded on the retry's message")

    p = add("events", streams.events, "print an entity's events (--follow: then live, until it ends)")
    p.add_argument("ref", metavar="TYPE/ID", help=REF_HELP)
    p.add_argument("--from", dest="from_offset", type=_count, default=0, metavar="N", help="first offset")
    p.add_argument("--limit", type=_count, metavar="N", help="at most N events")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new events until EOF")

    p = add("state", streams.state, "print an entity's durable state (ctx.state)")
    p.add_argument("ref", metavar="TYPE/ID", help=REF_HELP)
    p.add_argument("-w", "--watch", action="store_true", help="print it again after every change, until EOF")

    add("workers", presence_cmds.workers, "list the connected workers: types, code, leases, heartbeat")

    p = add(
        "versions", versions_cmds.versions, "list each type's code versions, or choose the one new wakes get"
    )
    versions_cmds.add_arguments(p)

    p = add("ready", commands.ready, "wait until the server answers, e.g. right after starting it")
    p.epilog = f"--timeout bounds the whole wait here (default {commands.DEFAULT_READY}; then exit 5)."

    p = add("wait", streams.wait, "wait until an entity is in one of the given states")
    p.add_argument("ref", metavar="TYPE/ID", help=REF_HELP)
    p.add_argument("states", nargs="+", metavar="STATE", help="e.g. running, or idle stopped")
    p.epilog = (
        f"--timeout bounds the whole wait here (default {streams.DEFAULT_WAIT}; exit 124 when it passes)."
    )

    p = add("watch", streams.watch, "watch entity states live (a table on a terminal)")
    p.add_argument("--type", help="only entities of this type")
    _states(p, "entities entering or leaving")

    p = add("mcp", mcp_cmd.command, mcp_cmd.SUMMARY)
    p.epilog = "Needs the mcp extra: pip install 'electric-sdk[mcp]'. See docs/mcp.md."

    p = add("replay-check", replay_cmd.command, replay_cmd.SUMMARY)
    replay_cmd.add_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    from ..version import __version__

    parser = _Parser(prog="electric", description="Lifecycle control plane for agents.", epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"electric {__version__}")
    _add_global_options(parser, on_subcommand=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _client_commands(sub)
    run_cmd.add_parser(sub)
    local.add_server_parser(sub)
    local.add_verify_parser(sub)
    local.add_backup_parsers(sub)
    transfer_cmds.add_transfer_parsers(sub)
    runtime_cmds.add_runtime_parsers(sub)
    completion.add_parser(sub)
    help_text.finish(sub)
    return parser


def _run_client_command(args: argparse.Namespace) -> int:
    out = Console(args.json)
    address: str | None = None
    try:
        console.require_stdout()
        options = client_options(args)
        address = options.address
        ctx = Invocation(out, options)
        try:
            func: CommandFunc = args.client_func
            return func(ctx, args)
        finally:
            ctx.close()
    except errors.ElectricError as exc:
        out.error(with_hint(exc, address))
        return exit_codes.for_error(exc)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C ends the process at once
        return exit_codes.INTERRUPTED
    except BrokenPipeError:
        console.discard_stdout()
        return exit_codes.BROKEN_PIPE


def _check_text(argv: Sequence[str], parser: argparse.ArgumentParser) -> None:
    """Every argument must be text: bytes that are not UTF-8 come as lone surrogates, which
    nothing can send (an entity name, a message, a reason)."""
    for n, arg in enumerate(argv, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "surrogateescape")
            raise UsageError(
                f"argument {n} is not valid UTF-8 text: {shown!r}", parser.format_usage()
            ) from None


def main(argv: Sequence[str] | None = None) -> int:
    console.keep_standard_fds_open()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        if completion.requested():
            completion.complete(parser)  # answers the shell and exits
        _check_text(argv, parser)
        args = _parse(parser, argv)
    except UsageError as exc:
        out = Console("--json" in argv)
        out.stderr.write(exc.usage)
        out.error(exc)
        return exit_codes.USAGE
    if "client_func" in args:
        return _run_client_command(args)
    try:
        code: int = args.func(args)
    except ModuleNotFoundError as exc:
        extra = EXTRAS.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        print(
            f"electric {args.command}: needs the {extra} extra ({exc.name} is not installed): "
            f"pip install 'electric-sdk[{extra}]'",
            file=sys.stderr,
        )
        return exit_codes.USAGE
    return code


# The local commands (server, dev, verify, backup, restore) run the control plane, whose packages
# are the [server] extra: a base install says which extra to add instead of a traceback.
EXTRAS = {name: "server" for name in ("starlette", "uvicorn", "grpc_health", "grpc_reflection", "h11")}


if __name__ == "__main__":
    sys.exit(main())
