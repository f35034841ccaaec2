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

from .._wire.entities import entity_url
from . import console, exit_codes
from .logs import add_log_format, setup_logging

if TYPE_CHECKING:
    from electric_server import StoreCopy


def add_server_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("server", help="run the control plane (SQLite, embedded)")
    add_listen(p)
    add_http(p)
    add_served_data(p)
    p.add_argument(
        "--tokens", metavar="FILE", type=Path, help="TOML file of bearer tokens; without it, no auth"
    )
    p.add_argument(
        "--tls-cert", metavar="FILE", type=Path, help="PEM certificate chain; enables TLS with --tls-key"
    )
    p.add_argument("--tls-key", metavar="FILE", type=Path, help="PEM private key")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --listen without --tokens (not recommended)",
    )
    p.add_argument(
        "--drain-grace",
        metavar="DURATION",
        default="10s",
        help="how long in-flight calls may finish on shutdown",
    )
    p.add_argument(
        "--synchronous",
        default="FULL",
        choices=["FULL", "NORMAL"],
        help="SQLite durability; FULL (default) survives power loss",
    )
    p.add_argument(
        "--commit-delay",
        metavar="DURATION",
        default="0",
        help="under concurrent load, how long a commit waits for more writes to share its fsync, "
        "e.g. 1ms (default 0: never; at most 100ms)",
    )
    p.add_argument(
        "--acceptors",
        type=int,
        default=8,
        metavar="N",
        help="calls each method accepts ahead beyond grpc's one, so a busy server keeps taking calls "
        "(default %(default)s; 0: grpc's own acceptor only)",
    )
    p.add_argument(
        "--allow-readable-tokens",
        action="store_true",
        help="use a --tokens file that its group or others may read (logged as a warning) instead of "
        "refusing it",
    )
    p.add_argument(
        "--hello-timeout",
        metavar="DURATION",
        default="10s",
        help="how long a runtime stream may stay open without its hello (default %(default)s)",
    )
    p.add_argument(
        "--watch-bandwidth",
        type=int,
        default=32 * 1024 * 1024,
        metavar="BYTES",
        help="bytes per second all event watches share once there are many: each watcher then "
        "sends what arrived meanwhile in one message (default %(default)s, 32 MiB)",
    )
    p.add_argument(
        "--settle",
        metavar="DURATION",
        default="1s",
        help="after an entity's end, how long its runtime may append its closing records (a "
        "signal's outcome, the end of the run in progress, exec receipts) before the stream closes "
        "(default %(default)s; 1ms to 60s)",
    )
    p.add_argument(
        "--poll",
        metavar="DURATION",
        default="500ms",
        help="how often the store is polled for deadlines any replica may fire: grace expiries, "
        "lost leases, settled streams (default %(default)s; 1ms to 500ms)",
    )
    p.add_argument(
        "--lease-ttl",
        metavar="DURATION",
        default="10s",
        help="how long a worker's session (and its leases) outlives its last heartbeat, and a "
        "replica's sessions their replica's (default %(default)s)",
    )
    p.add_argument(
        "--max-streams",
        type=int,
        default=5000,
        metavar="N",
        help="open streams (watches and runtime sessions) per principal (default %(default)s)",
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        default=100,
        metavar="N",
        help="worker sessions per principal (default %(default)s)",
    )
    add_database(p)
    add_accept_data_loss(p)
    add_log_format(p)
    p.set_defaults(func=_cmd_server)


def add_listen(p: argparse.ArgumentParser) -> None:
    """``--listen``, the gRPC address of `server` and `dev`."""
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default="127.0.0.1:7700",
        help="HOST:PORT to listen on (default %(default)s)",
    )


DEFAULT_DATA = Path(".electric")


def add_data(p: argparse.ArgumentParser, help: str = "data directory (default %(default)s)") -> None:
    """``--data``, the data directory every local command takes (one default, one spelling)."""
    p.add_argument("--data", metavar="DIR", type=Path, default=DEFAULT_DATA, help=help)


def add_served_data(p: argparse.ArgumentParser) -> None:
    """``--data`` of ``server`` and ``dev``, whose store ``resolve_store`` picks as the tools'."""
    p.add_argument(
        "--data",
        metavar="DIR",
        type=Path,
        default=None,
        help=f"data directory (default {DEFAULT_DATA}, or $ELECTRIC_DATABASE_URL's database when that "
        "is set and --data is not given)",
    )


def add_store(p: argparse.ArgumentParser, verb: str, database_help: str | None = None) -> None:
    """``--data`` and ``--database`` of the offline tools (verify, export, import, backup); their
    store is picked by ``resolve_store``. ``database_help`` None: say what ``--database`` does."""
    p.add_argument(
        "--data",
        metavar="DIR",
        type=Path,
        default=None,
        help=f"{verb} this data directory (default {DEFAULT_DATA}, or $ELECTRIC_DATABASE_URL's database "
        "when that is set)",
    )
    p.add_argument(
        "--database",
        metavar="URL",
        default=None,
        help=database_help
        or f"{verb} this PostgreSQL database instead of --data (default $ELECTRIC_DATABASE_URL, "
        "unless --data is given)",
    )


def resolve_store(args: argparse.Namespace) -> bool:
    """Pick a command's store (the offline tools', ``server``'s, ``dev``'s): ``--database``; else
    ``--data``; else the database of ``$ELECTRIC_DATABASE_URL``; else ``.electric``. A ``--data`` given
    is never overridden by the environment. Returns whether the environment picked it."""
    from_env = False
    if args.database is None and args.data is None:
        args.database = os.environ.get("ELECTRIC_DATABASE_URL") or None
        from_env = args.database is not None
    if args.data is None:
        args.data = DEFAULT_DATA
    return from_env


def duration_ms(value: str) -> int:
    """An argparse type: a duration (``5s``, ``500ms``; a bare number is seconds) in milliseconds."""
    from ..durations import parse_ms

    try:
        return parse_ms(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_database(p: argparse.ArgumentParser) -> None:
    """`--database`, `--database-pool` and `--database-timeout`, for `server` and `dev`
    (``resolve_store`` picks)."""
    p.add_argument(
        "--database",
        default=None,
        metavar="URL",
        help="a postgresql:// URL: keep the store in that PostgreSQL database instead of the data "
        "directory's SQLite file (default $ELECTRIC_DATABASE_URL, unless --data is given; needs "
        "electric-sdk[postgres])",
    )
    p.add_argument(
        "--database-pool",
        type=int,
        default=4,
        metavar="N",
        help="connections to the --database (default %(default)s; mind PostgreSQL's max_connections)",
    )
    p.add_argument(
        "--database-timeout",
        type=duration_ms,
        default="5s",
        metavar="DURATION",
        help="the longest the server waits on the --database for a connection or a statement before "
        "the call is answered UNAVAILABLE (default %(default)s; 10ms to 10m)",
    )


def add_http(p: argparse.ArgumentParser) -> None:
    # Off unless asked: tests and notebooks start several servers, which one default port would fail.
    p.add_argument(
        "--http",
        default="off",
        metavar="HOST:PORT",
        help="also serve the HTTP/JSON API here (docs/http.md), e.g. 127.0.0.1:7780; "
        "port 0 picks a free one (default %(default)s)",
    )
    p.add_argument(
        "--sse-heartbeat",
        default="15000",
        metavar="MS",
        type=sse_heartbeat_ms,
        help="an HTTP SSE response with nothing to send sends a comment this often, in ms "
        "(or a duration such as 15s; default %(default)s)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let pages of this origin call the HTTP API, e.g. https://app.example (repeat it; "
        "default: CORS off)",
    )


def http_address(value: str) -> str | None:
    return None if value.strip().lower() == "off" else value


def sse_heartbeat_ms(value: str) -> int:
    """Milliseconds: a bare number is ms here (the flag names its unit), else a duration."""
    from ..durations import parse_ms

    try:
        ms = int(value) if value.strip().isdigit() else parse_ms(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if ms <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value!r}")
    return ms


def add_accept_data_loss(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--accept-data-loss",
        action="store_true",
        help="start on a damaged data directory anyway, dropping what the damage cut off "
        '(logged; see docs/server.md, "Damage")',
    )


def storage_exit(command: str, exc: Exception) -> int:
    """Report a store that refused to start (65: damaged) or failed (74), and the exit code."""
    from electric_server import DamagedStore

    print(f"electric {command}: {exc}", file=sys.stderr)
    return exit_codes.DATA_DAMAGED if isinstance(exc, DamagedStore) else exit_codes.STORAGE_FAILED


def add_verify_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("verify", help="replay every stream and report entities whose state differs")
    add_store(p, "verify")
    # SUPPRESS: `electric --json verify` (the global flag) works too.
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the report as JSON")
    p.set_defaults(func=_cmd_verify)


def _cmd_server(args: argparse.Namespace) -> int:
    from electric_server import DatabaseUnavailable, ServerConfig, StorageFault, serve

    from ..durations import parse_ms

    console.outlive_closed_output("server")
    setup_logging(args.log_format)
    resolve_store(args)
    try:
        config = ServerConfig(
            listen=args.listen,
            http=http_address(args.http),
            sse_heartbeat_ms=args.sse_heartbeat,
            cors_origins=tuple(args.cors_origin),
            data_dir=args.data,
            tokens_file=args.tokens,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            insecure=args.insecure,
            drain_grace_s=parse_ms(args.drain_grace) / 1000,
            synchronous=args.synchronous,
            commit_delay_ms=parse_ms(args.commit_delay),
            acceptors_per_method=args.acceptors,
            accept_data_loss=args.accept_data_loss,
            allow_readable_tokens=args.allow_readable_tokens,
            hello_timeout_ms=parse_ms(args.hello_timeout),
            settle_ms=parse_ms(args.settle),
            poll_ms=parse_ms(args.poll),
            lease_ttl_ms=parse_ms(args.lease_ttl),
            max_streams=args.max_streams,
            max_sessions=args.max_sessions,
            watch_bandwidth=args.watch_bandwidth,
            database_url=args.database,
            database_pool=args.database_pool,
            database_timeout_ms=args.database_timeout,
        )
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
