"""How the long-running commands (`server`, `worker`, `dev`) log: ``--log-format text`` (the
default, for people) or ``json`` (one object per line on stderr, for a log collector).

Both formats go through one handler on the root logger, so every library that logs with
Python's ``logging`` comes out in the same format: uvicorn's loggers (the HTTP door passes
no log config of its own, so they propagate here), grpc's Python loggers, and warnings
(``logging.captureWarnings``). gRPC's C core writes its own lines straight to stderr (only
errors, at its default ``GRPC_VERBOSITY``); docs/operations.md says so.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from .._wire.times import epoch_to_iso

__all__ = ["LOG_FORMATS", "JsonFormatter", "OneLine", "TextFormatter", "add_log_format", "setup_logging"]

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# A server's record names its replica (electric_server's log_replica.py), as `electric workers` does.
REPLICA_TEXT_FORMAT = "%(asctime)s %(levelname)s [replica %(replica)s] %(name)s: %(message)s"

# The attributes every LogRecord has; any other attribute came from ``extra=`` and is logged.
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def add_log_format(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text (default) or json: one JSON object per line on stderr (docs/operations.md)",
    )


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (UTC, ISO-8601 with milliseconds and ``Z``), ``level``,
    ``logger``, ``message``, then ``exception`` and ``stack`` when there are any, then the
    record's ``extra`` fields (a value JSON cannot hold is written as its ``str``)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": epoch_to_iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and key not in line:
                line[key] = value
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT``; a record that names its server's replica, ``REPLICA_TEXT_FORMAT``."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        self._with_replica = logging.Formatter(REPLICA_TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        if hasattr(record, "replica"):
            return self._with_replica.format(record)
        return super().format(record)


class OneLine(logging.Filter):
    """A record's traceback folded into its message as the exception's name and text. For asyncpg's
    pool, which logs every failed reconnect of its connections as a warning with a traceback,
    every few seconds while the database is away: the server says once, and why, that it cannot
    reach the database (store/postgres_faults.py), and each retry needs no more than a line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            text = str(exc)
            record.msg = f"{record.getMessage()} ({type(exc).__name__}{': ' + text if text else ''})"
            record.args = None
            record.exc_info = record.exc_text = None
        return True


def setup_logging(log_format: str, *, verbose: bool = False) -> None:
    """Log at INFO (DEBUG with ``verbose``) to stderr in ``log_format``, replacing any handler
    the root logger had."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], force=True)
    logging.captureWarnings(True)
    pool_log = logging.getLogger("asyncpg.pool")
    if not any(isinstance(f, OneLine) for f in pool_log.filters):
        pool_log.addFilter(OneLine())
    if verbose:
        logging.getLogger("electric.runtime").setLevel(logging.DEBUG)
