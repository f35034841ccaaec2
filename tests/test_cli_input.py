"""`electric` with a standard stream closed, or given input that is not text (issue 19, point 9).

Each case runs the real command as a subprocess, its fds closed by the shell as `<&-`, `>&-`
and `2>&-` do, against a real server. Wanted: a clear error (``electric: CODE: message``), an
exit code from the table (2 for what the user gave), no traceback, and nothing sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from electric_sdk import Client, errors
from electric_sdk.cli import exit_codes
from electric_sdk.testing import TestServer

ROOT = Path(__file__).resolve().parent.parent
ELECTRIC = [sys.executable, "-m", "electric_sdk.cli.main"]
APP = "tests.runtime.headless_app:app"

Arg = str | bytes


@pytest.fixture
def ref(sdk: Client) -> str:
    """A spawned entity of this test's own."""
    name = f"input/e{uuid.uuid4().hex[:10]}"
    sdk.spawn(name)
    return name


def electric(
    live: TestServer,
    *args: Arg,
    closed: str = "",
    stdin: bytes | None = None,
    env: dict[bytes, bytes] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """`electric ARGS` with the fds named in ``closed`` (e.g. "0", "12") closed when it starts."""
    closing = " ".join(f"{fd}>&-" for fd in closed)
    base = {k: v for k, v in os.environb.items() if not k.startswith(b"ELECTRIC_")}
    result = subprocess.run(
        ["sh", "-c", f'exec "$@" {closing}', "sh", *ELECTRIC, "--address", live.address, *args],
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        cwd=ROOT,
        env={**base, **(env or {})},
        timeout=60,
        check=False,
    )
    assert b"Traceback" not in result.stderr, result.stderr.decode(errors="replace")
    return result


def error_line(result: subprocess.CompletedProcess[bytes]) -> str:
    lines = result.stderr.decode().splitlines()
    assert lines, "nothing on stderr"
    return lines[-1]


def events_of(sdk: Client, ref: str) -> int:
    return sdk.get(ref).head_offset


# -- standard input --------------------------------------------------------------------------------


@pytest.mark.parametrize("json_mode", [False, True])
def test_run_message_from_a_closed_stdin(live: TestServer, sdk: Client, ref: str, json_mode: bool) -> None:
    before = events_of(sdk, ref)
    result = electric(live, "run", ref, "--message", "-", *(["--json"] if json_mode else []), closed="0")
    assert result.returncode == exit_codes.USAGE
    assert error_line(result) == (
        "electric: USAGE: --message -: standard input is closed; pipe the text in, or give it as --message TEXT"
    )
    if json_mode:
        error, complete = (json.loads(line) for line in result.stdout.splitlines())
        assert (error["type"], error["code"], error["run_status"]) == ("error", "USAGE", "not_sent")
        assert (complete["type"], complete["exit_code"], complete["message_key"]) == (
            "session_complete",
            2,
            None,
        )
    assert events_of(sdk, ref) == before  # nothing was sent


def test_run_message_from_a_stdin_that_is_not_utf8(live: TestServer, sdk: Client, ref: str) -> None:
    before = events_of(sdk, ref)
    result = electric(live, "run", ref, "--message", "-", stdin=b"caf\xe9 \xff")
    assert result.returncode == exit_codes.USAGE
    assert error_line(result).startswith(
        "electric: INVALID_TEXT: --message -: standard input is not UTF-8 text"
    )
    assert events_of(sdk, ref) == before


# -- arguments -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("send", "{ref}", b"caf\xe9"),
        ("signal", "{ref}", "SIGUSR", "--reason", b"\xff"),
        ("run", "{ref}", "--message", b"\xff"),
        ("spawn", b"input/\xff"),
    ],
    ids=["send", "signal-reason", "run", "spawn"],
)
def test_an_argument_that_is_not_utf8(live: TestServer, sdk: Client, ref: str, args: tuple[Arg, ...]) -> None:
    before = events_of(sdk, ref)
    result = electric(live, *(a.format(ref=ref) if isinstance(a, str) else a for a in args))
    assert result.returncode == exit_codes.USAGE
    assert "is not valid UTF-8 text: b'" in error_line(result)
    assert error_line(result).startswith("electric: USAGE: argument ")
    assert events_of(sdk, ref) == before


@pytest.mark.parametrize(
    ("how", "token"),
    [("flag", b"two\nlines"), ("flag", "caf\u00e9".encode()), ("env", b"\xff\xfe")],
    ids=["newline", "not-ascii", "env-not-utf8"],
)
def test_a_token_that_cannot_be_sent(live: TestServer, sdk: Client, ref: str, how: str, token: bytes) -> None:
    before = events_of(sdk, ref)
    if how == "flag":
        result = electric(live, "--token", token, "send", ref, "hi")
    else:
        result = electric(live, "send", ref, "hi", env={b"ELECTRIC_TOKEN": token})
    assert result.returncode == exit_codes.USAGE
    assert error_line(result) == (
        "electric: INVALID_TOKEN: the token must be printable ASCII: it is sent in the authorization header"
    )
    assert events_of(sdk, ref) == before


def test_a_worker_with_bad_flags_says_so(live: TestServer) -> None:
    for flags, wanted in [
        (("--grace", "soon"), "electric worker: INVALID_DURATION: --grace: invalid duration 'soon'"),
        (("--capacity", "-1"), "electric worker: VALUE_OUT_OF_RANGE: capacity must be a whole number"),
        (("--keepalive", "0ms"), "electric worker: INVALID_DURATION: --keepalive must be more than 0"),
        (("--keepalive-timeout", "fast"), "electric worker: INVALID_DURATION: --keepalive-timeout: invalid"),
    ]:
        result = electric(live, "worker", APP, *flags)
        assert result.returncode == exit_codes.USAGE
        assert error_line(result).startswith(wanted)


# -- standard output and error ---------------------------------------------------------------------


@pytest.mark.parametrize("command", ["spawn", "run"])
def test_a_closed_stdout_refuses_before_anything_is_done(live: TestServer, sdk: Client, command: str) -> None:
    name = f"input/o{uuid.uuid4().hex[:10]}"
    args = ("spawn", name) if command == "spawn" else ("run", name, "--spawn", "--message", "hi", "--json")
    result = electric(live, *args, closed="1")
    assert result.returncode == exit_codes.USAGE
    assert error_line(result) == (
        "electric: USAGE: standard output is closed: the result would be lost "
        "(redirect it to /dev/null to discard it)"
    )
    with pytest.raises(errors.EntityNotFound):
        sdk.get(name)  # not spawned, nothing sent


def test_a_closed_stderr_keeps_the_exit_code(live: TestServer) -> None:
    result = electric(live, "--json", "get", "input/nobody", closed="2")
    assert result.returncode == exit_codes.NOT_FOUND
    assert json.loads(result.stdout)["error"]["code"] == "ENTITY_NOT_FOUND"
