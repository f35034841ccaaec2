"""The commands that work on a data directory, not through a client: `server`, `verify`,
`backup` and `restore`.

They report their own errors (``electric server: ...``, ``electric verify: ...``)
and use the exit codes of exit_codes.py: 0 ok, 1 `verify` found a mismatch, 2
bad usage or configuration, or a backup or restore refused (nothing was started
or written), 65 a damaged store (the server refused to start; `verify` found
damage), 74 the storage failed (the server stopped).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from electric_server import setting

from .._wire.entities import entity_url
from . import console, exit_codes
from .logs import add_log_format, setup_logging
from .server_options import add_server_options, server_fields

if TYPE_CHECKING:
    from electric_server import StoreCopy


def add_server_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("server", help="run the control plane (SQLite, embedded)")
    add_server_options(p, "server")
    add_log_format(p)
    p.set_defaults(func=_cmd_server)


DEFAULT_DATA: Path = setting("data_dir").value
DATABASE_ENV: str = setting("database_url").env


def add_data(p: argparse.ArgumentParser, help: str = "data directory (default %(default)s)") -> None:
    """``--data``, the data directory every local command takes (one default, one spelling)."""
    p.add_argument("--data", metavar="DIR", type=Path, default=DEFAULT_DATA, help=help)


def add_store(p: argparse.ArgumentParser, verb: str, database_help: str | None = None) -> None:
    """``--data`` and ``--database`` of the offline tools (verify, export, import, backup); their
    store is picked by ``resolve_store``. ``database_help`` None: say what ``--database`` does."""
    p.add_argument(
        "--data",
        metavar="DIR",
        type=Path,
        default=None,
        help=f"{verb} this data directory (default {DEFAULT_DATA}, or ${DATABASE_ENV}'s database "
        "when that is set)",
    )
    p.add_argument(
        "--database",
        metavar="URL",
        default=None,
        help=database_help
        or f"{verb} this PostgreSQL database instead of --data (default ${DATABASE_ENV}, "
        "unless --data is given)",
    )


def resolve_store(args: argparse.Namespace) -> bool:
    """Pick a command's store (the offline tools', ``server``'s, ``dev``'s): ``--database``; else
    ``--data``; else the database of ``$ELECTRIC_DATABASE_URL``; else ``.electric``. A ``--data`` given
    is never overridden by the environment. Returns whether the environment picked it."""
    from_env = False
    if args.database is None and args.data is None:
        args.database = os.environ.get(DATABASE_ENV) or None
        from_env = args.database is not None
    if args.data is None:
        args.data = DEFAULT_DATA
    return from_env


def storage_exit(command: str, exc: Exception) -> int:
    """Report a store that refused to start (65: damaged; 75: a full disk) or failed (74), and
    the exit code."""
    from electric_server import DamagedStore, DiskFull

    print(f"electric {command}: {exc}", file=sys.stderr)
    if isinstance(exc, DiskFull):
        return exit_codes.DISK_FULL
    return exit_codes.DATA_DAMAGED if isinstance(exc, DamagedStore) else exit_codes.STORAGE_FAILED


def add_verify_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("verify", help="replay every stream and report entities whose state differs")
    add_store(p, "verify")
    # SUPPRESS: `electric --json verify` (the global flag) works too.
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the report as JSON")
    p.set_defaults(func=_cmd_verify)


def _cmd_server(args: argparse.Namespace) -> int:
    from electric_server import DatabaseUnavailable, ServerConfig, StorageFault, serve

    console.outlive_closed_output("server")
    setup_logging(args.log_format)
    resolve_store(args)
    try:
        config = ServerConfig(**server_fields(args, "server"))
        return asyncio.run(serve(config))
    except (ValueError, DatabaseUnavailable) as exc:  # ConfigError, TokenFileError; no database to start on
        print(f"electric server: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    except StorageFault as exc:  # damaged (refused to start), or failed (stopped)
        return storage_exit("server", exc)


def _stores_counts(entities: int, events: int) -> str:
    """What verify, backup and restore counted, worded as export and import word theirs."""
    from electric_server import counted

    return counted({"entity": entities, "event": events})


def _cmd_verify(args: argparse.Namespace) -> int:
    from electric_server import DatabaseUnavailable, StorageFault, verify_data_dir, verify_database

    resolve_store(args)
    try:
        report = asyncio.run(verify_database(args.database) if args.database else verify_data_dir(args.data))
    except (ValueError, DatabaseUnavailable) as exc:  # not a database URL; one that cannot be opened
        # As `server` and `export` say it: exit 1 is a mismatch found, which this is not.
        print(f"electric verify: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    except FileNotFoundError as exc:
        print(f"electric verify: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    except OSError as exc:  # e.g. permission denied
        print(f"electric verify: cannot read {args.data}: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    except StorageFault as exc:  # not damage: e.g. another process holds the database locked
        print(f"electric verify: {exc}; try again", file=sys.stderr)
        return exit_codes.ERROR
    except Exception as exc:  # never a traceback: say what could not be read
        print(
            f"electric verify: cannot read the store in {args.data}: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return exit_codes.ERROR
    if args.json:
        print(
            console.json_text(
                {
                    "entities": report.entities,
                    "events": report.events,
                    "clean": report.clean,
                    "damage": report.damage,
                    "mismatches": {entity_url(*ref): p for ref, p in report.mismatches.items()},
                }
            )
        )
    else:
        for ref, problems in report.mismatches.items():
            for problem in problems:
                print(f"{entity_url(*ref)}: {problem}")
        for problem in report.damage:
            print(f"damaged: {problem}")
        if report.damage:
            verdict = (
                "the store is damaged (counted: what could be read); restore a backup, or start the "
                "server with --accept-data-loss"
            )
        elif report.mismatches:
            differ = len(report.mismatches)
            verdict = f"{differ} {'entity differs' if differ == 1 else 'entities differ'}"
        else:
            verdict = "clean"
        print(f"verified {_stores_counts(report.entities, report.events)}: {verdict}")
    if report.damage:
        return exit_codes.DATA_DAMAGED
    return exit_codes.OK if report.clean else exit_codes.ERROR


def add_backup_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("backup", help="copy a data directory's store, live or not, to a file")
    add_store(p, "back up", database_help=argparse.SUPPRESS)  # a database is refused: see _cmd_backup
    p.add_argument("out", type=Path, metavar="OUT", help="the backup file to write")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the result as JSON")
    p.set_defaults(func=_cmd_backup)

    p = sub.add_parser("restore", help="put a backup back into a new, empty data directory")
    p.add_argument("backup", type=Path, metavar="BACKUP", help="a file written by `electric backup`")
    add_data(p)
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the result as JSON")
    p.set_defaults(func=_cmd_restore)


def _cmd_backup(args: argparse.Namespace) -> int:
    from electric_server import backup_data_dir

    from_env = resolve_store(args)
    if args.database:
        why = " ($ELECTRIC_DATABASE_URL names one: give --data DIR to back up a data directory)"
        print(
            "electric backup: backs up a data directory's SQLite store only; back up a PostgreSQL "
            "database with PostgreSQL's own tools: pg_dump (a logical copy) or pg_basebackup "
            f"(with WAL archiving, to a point in time){why if from_env else ''}",
            file=sys.stderr,
        )
        return exit_codes.USAGE

    return _copy_store(
        "backup", "backed up", lambda: backup_data_dir(args.data, args.out, force=args.force), args
    )


def _cmd_restore(args: argparse.Namespace) -> int:
    from electric_server import restore_data_dir

    return _copy_store("restore", "restored", lambda: restore_data_dir(args.backup, args.data), args)


def _copy_store(command: str, done: str, copy: Callable[[], StoreCopy], args: argparse.Namespace) -> int:
    try:
        result = copy()
    except ValueError as exc:  # BackupError, or the data directory's ConfigError (locked, read-only)
        print(f"electric {command}: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    fields = {
        "path": str(result.path),
        "entities": result.entities,
        "events": result.events,
        "head_txid": result.head_txid,
        "bytes": result.size_bytes,
    }
    if args.json:
        print(console.json_text(fields))
    else:
        print(
            f"{done} {_stores_counts(result.entities, result.events)} (txids up to {result.head_txid}) "
            f"into {result.path}: {result.size_bytes:,} bytes"
        )
    return exit_codes.OK
