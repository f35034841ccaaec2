"""``--log-format json`` (issue 21): a real `electric server` process logs one JSON object per line on
stderr, uvicorn's lines included; and the formatter keeps exceptions and ``extra`` fields."""

from __future__ import annotations

import json
import logging
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from electric_sdk.cli.logs import TEXT_FORMAT, JsonFormatter, OneLine

TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def _serve_then_stop(proc: subprocess.Popen[str]) -> str:
    """Once the server listens, send uvicorn something that is not HTTP, then SIGTERM; its stderr."""
    try:
        assert proc.stdout is not None
        http = None
        for line in proc.stdout:
            if match := re.match(r"electric http listening on http://(\S+):(\d+)", line):
                http = (match.group(1), int(match.group(2)))
                break
        assert http is not None, "the server exited before listening"
        # Not HTTP: uvicorn logs a warning on its own logger, then answers 400.
        with socket.create_connection(http, timeout=30) as sock:
            sock.sendall(b"NOT HTTP\r\n\r\n")
            assert sock.recv(100).startswith(b"HTTP/1.1 400")
        proc.send_signal(signal.SIGTERM)
        return proc.communicate(timeout=30)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)


def test_a_server_process_logs_json_lines(tmp_path: Path) -> None:
    with subprocess.Popen(
        [
            *(sys.executable, "-m", "electric_sdk.cli.main", "server"),
            *("--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data", str(tmp_path / "d")),
            *("--drain-grace", "1s", "--log-format", "json"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        stderr = _serve_then_stop(proc)
    assert proc.returncode == 0, stderr
    lines = [json.loads(line) for line in stderr.splitlines()]  # every line is one JSON object
    assert lines
    for line in lines:
        assert TS.fullmatch(line["ts"]), line
        assert {"level", "logger", "message"} <= set(line), line
    seen = {(line["logger"], line["level"], line["message"]) for line in lines}
    assert ("uvicorn.error", "WARNING", "Invalid HTTP request received.") in seen
    assert ("electric.server", "INFO", "electric server stopped") in seen
    # Every line names the replica `electric workers` shows, uvicorn's and the last one's too.
    [start] = [line for line in lines if line["message"].startswith("electric server listening on")]
    replica = re.search(r"replica (\w+)\)", start["message"])
    assert replica is not None
    assert {line.get("replica") for line in lines} == {replica.group(1)}


def test_a_server_process_names_its_replica_on_every_text_line(tmp_path: Path) -> None:
    with subprocess.Popen(
        [
            *(sys.executable, "-m", "electric_sdk.cli.main", "server"),
            *("--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data", str(tmp_path / "d")),
            *("--drain-grace", "1s"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        stderr = _serve_then_stop(proc)
    assert proc.returncode == 0, stderr
    lines = stderr.splitlines()
    line_format = re.compile(r"\S+ \S+ (INFO|WARNING) \[replica (\w+)\] (\S+): (.*)")
    parsed = [line_format.fullmatch(line) for line in lines]
    assert all(parsed), lines
    [start] = [m for m in parsed if m is not None and m.group(4).startswith("electric server listening on")]
    assert {m.group(2) for m in parsed if m is not None} == {start.group(2)}
    assert start.group(4).endswith(f"replica {start.group(2)})")
    assert ("uvicorn.error", "Invalid HTTP request received.") in {
        (m.group(3), m.group(4)) for m in parsed if m is not None
    }


def test_the_formatter_keeps_exceptions_and_extra_fields() -> None:
    logger = logging.getLogger("electric.test_log_format")
    try:
        raise ValueError("bad value")
    except ValueError:
        record = logger.makeRecord(
            logger.name,
            logging.ERROR,
            __file__,
            1,
            "failed %s",
            ("x",),
            sys.exc_info(),
            extra={"ref": "/a/1"},
        )
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "failed x"
    assert line["level"] == "ERROR"
    assert line["ref"] == "/a/1"
    assert line["exception"].startswith("Traceback")
    assert "ValueError: bad value" in line["exception"]
    assert TS.fullmatch(line["ts"])


def test_asyncpgs_reconnect_warnings_are_one_line_naming_the_error() -> None:
    """While the database is away, asyncpg's pool warns with a traceback at every reconnect: the
    server's logging folds each into one line (the server says once why, store/postgres/faults.py)."""
    logger = logging.getLogger("asyncpg.pool")
    try:
        raise TimeoutError
    except TimeoutError:
        record = logger.makeRecord(
            logger.name, logging.WARNING, __file__, 1, "Failed to restore the %s", ("floor",), sys.exc_info()
        )
    assert OneLine().filter(record)
    assert (
        logging.Formatter(TEXT_FORMAT)
        .format(record)
        .endswith("WARNING asyncpg.pool: Failed to restore the floor (TimeoutError)")
    )
    assert "exception" not in json.loads(JsonFormatter().format(record))


@pytest.mark.parametrize("command", ["server", "worker", "dev"])
def test_log_format_is_offered_and_checked(command: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "electric_sdk.cli.main", command, "--log-format", "xml"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--log-format: invalid choice: 'xml'" in result.stderr
