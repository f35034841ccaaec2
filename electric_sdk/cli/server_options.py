"""The options of `electric server` and `electric dev`, built from the server's table of settings
(``electric_server.SETTINGS``, server/electric_server/settings.py): each flag, its metavar, and its
help ending with the default and the range. None is written here.

argparse keeps what was typed; the table parses it (``server_fields``), so a value that does not
parse is refused as one out of range is: ``electric server: --flag ...``, exit 2, nothing started.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from electric_server import SETTINGS, parse_given

if TYPE_CHECKING:
    from electric_server import Setting

# Picked by ``local.resolve_store`` (with $ELECTRIC_DATABASE_URL), as the offline tools pick theirs.
_STORE = {"data_dir", "database_url"}


def _options(command: str) -> list[Setting[Any]]:
    """The settings ``command`` (``server`` or ``dev``) takes a flag for, in the table's order."""
    return [s for s in SETTINGS if s.flag is not None and (command == "server" or s.dev)]


def _dest(setting: Setting[Any]) -> str:
    return (setting.flag or setting.name).removeprefix("--").replace("-", "_")


def help_text(setting: Setting[Any]) -> str:
    """The flag's help: the table's, then its default and range (a flag without a value: none)."""
    if setting.kind.action == "store_true":
        return setting.help
    said = "; ".join(filter(None, [f"default {setting.default_words()}", setting.range_words()]))
    return f"{setting.help} ({said})"


def add_server_options(p: argparse.ArgumentParser, command: str) -> None:
    """Every option of ``command``: none has an argparse default, so what was not given is left to
    ``ServerConfig``'s (and ``--data``/``--database`` to ``resolve_store``)."""
    for s in _options(command):
        assert s.flag is not None
        text = help_text(s).replace("%", "%%")  # argparse formats help with %
        if s.kind.action == "store_true":  # a flag without a value: no metavar
            p.add_argument(s.flag, dest=_dest(s), action=s.kind.action, help=text)
        else:
            p.add_argument(
                s.flag,
                dest=_dest(s),
                action=s.kind.action or "store",
                metavar=s.kind.metavar,
                choices=s.choices or None,
                help=text,
            )


def server_fields(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The ``ServerConfig`` fields the command line gave; ``ConfigError`` names the flag of a value
    that does not parse. Run ``resolve_store`` first: the store it picks is taken as it is."""
    given = {s.name: getattr(args, _dest(s)) for s in _options(command) if s.name not in _STORE}
    return parse_given(given) | {"data_dir": Path(args.data), "database_url": args.database}
