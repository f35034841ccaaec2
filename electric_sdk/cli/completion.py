"""Shell completion for bash and zsh, through argcomplete.

`electric completion bash|zsh` prints the script to source. The shell then runs `electric`
itself with argcomplete's environment set; `main` hands the parser to ``argcomplete`` first,
which answers and exits. Commands, flags and choices come from the parser; entity refs
(every ``TYPE/ID`` argument) are asked of the server with a short deadline, and when no
server answers in time the completer offers nothing and prints nothing: a key press must
not hang, nor spill an error into the command line being typed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

import anyio

from .. import errors
from ..client import AsyncClient, ClientOptions, RetryPolicy
from ..lifecycle import Signal, State
from ..models import Entity
from .commands import DEFAULT_ADDRESS

SHELLS = ("bash", "zsh")
# The whole server round trip of one completion, retries included (a key press must not wait).
REF_DEADLINE_S = 0.3
# At most this many refs are offered; a type prefix (``my_agent/``) narrows the list.
REF_LIMIT = 200
REF_METAVAR = "TYPE/ID"


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("completion", help="print the bash or zsh completion script to source")
    p.add_argument("shell", choices=SHELLS, help="the shell the script is for")
    p.set_defaults(func=_cmd_completion)


def _cmd_completion(args: argparse.Namespace) -> int:
    from argcomplete.shell_integration import shellcode

    sys.stdout.write(shellcode(["electric"], shell=args.shell))
    return 0


def requested() -> bool:
    """The shell is asking for completions (argcomplete's protocol), not a user running a command."""
    return "_ARGCOMPLETE" in os.environ


def complete(parser: argparse.ArgumentParser) -> None:
    """Answer the shell and exit: argcomplete writes the candidates where the script reads them."""
    import argcomplete

    completers = {REF_METAVAR: complete_refs, "SIGNAL": complete_signals, "STATE": complete_states}
    for action in _actions(parser):
        if isinstance(action.metavar, str) and action.metavar in completers:
            action.completer = completers[action.metavar]  # type: ignore[attr-defined]
    # Flags only once a "-" is typed: an empty word offers the refs (or nothing), not -h.
    argcomplete.autocomplete(parser, always_complete_options=False)


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every argument of every command."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                found += _actions(command)
        else:
            found.append(action)
    return found


def complete_signals(prefix: str, **_: Any) -> list[str]:
    return [s.value for s in Signal if s.value.startswith(prefix.upper())]


def complete_states(prefix: str, **_: Any) -> list[str]:
    return [s.value for s in State if s.value.startswith(prefix.lower())]


def complete_refs(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """The server's entity refs that start with ``prefix``; none when it does not answer within
    REF_DEADLINE_S."""
    typed = prefix.lstrip("/")
    kind = typed.partition("/")[0] if "/" in typed else None
    try:
        options = ClientOptions(
            address=getattr(parsed_args, "address", None)
            or os.environ.get("ELECTRIC_ADDRESS")
            or DEFAULT_ADDRESS,
            token=getattr(parsed_args, "token", None) or os.environ.get("ELECTRIC_TOKEN") or None,
            timeout_s=REF_DEADLINE_S,
            # One attempt: a refused connection answers at once, and a Tab press is repeated
            # by hand rather than retried behind the user's back.
            retry=RetryPolicy(attempts=1, total_s=REF_DEADLINE_S),
        )
        entities = asyncio.run(_list(options, kind))
    except (errors.ElectricError, TimeoutError):
        return []
    refs = (entity.ref.url.removeprefix("/") for entity in entities)
    return [ref for ref in refs if ref.startswith(typed)]


async def _list(options: ClientOptions, kind: str | None) -> list[Entity]:
    # The bound covers opening the channel too, not only the call's own deadline.
    with anyio.fail_after(REF_DEADLINE_S):
        async with AsyncClient(options=options) as client:
            return await client.list(kind, limit=REF_LIMIT)
