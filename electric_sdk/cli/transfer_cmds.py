"""`electric export` and `electric import`: every stream of a store, offline, to a file and back
(server/electric_server/tools/transfer.py; the file's format: export_file.py).

Each works on a data directory (``--data``) or a PostgreSQL database
(``--database``), says how far it got on stderr, and exits 0 when done, or
2 when refused (a live server's data, a target that is not empty, a file
that is not a whole export), having written nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from . import console, exit_codes
from .local import add_store, resolve_store


def add_transfer_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("export", help="write every stream of a stopped store to a file (docs/scaling.md)")
    p.add_argument("out", type=Path, metavar="FILE", help="the new file to write")
    _store_options(p, "export")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("import", help="read an `electric export` file into a new, empty store")
    p.add_argument("source", type=Path, metavar="FILE", help="a file written by `electric export`")
    _store_options(p, "import into")
    p.set_defaults(func=_cmd_import)


def _store_options(p: argparse.ArgumentParser, verb: str) -> None:
    add_store(p, verb)
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the result as JSON")


def _cmd_export(args: argparse.Namespace) -> int:
    from electric_server import Progress, export_store, setting

    return _transfer(
        "export",
        args,
        lambda: export_store(
            args.out,
            data_dir=args.data,
            database_url=args.database,
            # Idempotency keys older than the server's default retention have expired.
            retention_ms=setting("idempotency_retention_ms").value,
            progress=Progress("export"),
        ),
    )


def _cmd_import(args: argparse.Namespace) -> int:
    from electric_server import Progress, import_store

    return _transfer(
        "import",
        args,
        lambda: import_store(
            args.source, data_dir=args.data, database_url=args.database, progress=Progress("import")
        ),
    )


def _transfer(command: str, args: argparse.Namespace, run: Any) -> int:
    resolve_store(args)  # before ``run`` reads the namespace
    try:
        done = asyncio.run(run())
    except ValueError as exc:  # TransferError, or the data directory's (locked by a live server)
        print(f"electric {command}: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    if getattr(args, "json", False):
        print(console.json_text({**done.counts, "head_txid": done.head_txid}))
    else:
        print(f"{command}ed {done}")
    return exit_codes.OK
