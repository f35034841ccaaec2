"""`electric` client commands end to end: real subprocesses against a real server.

Every command runs as ``python -m electric_sdk.cli.main`` against an in-process
``TestServer``; streaming commands are read line by line with a bound on every
wait, and synchronized on their output (never on sleeps). Exit codes are the
table in electric_sdk/cli/exit_codes.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from electric_sdk import Client, errors, presence
from electric_sdk.cli import exit_codes
from electric_sdk.cli.main import build_parser, commands_of
from electric_sdk.testing import TestServer

ELECTRIC = [sys.executable, "-m", "electric_sdk.cli.main"]
ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 20.0
# Nothing listens on port 1 of the loopback.
NO_SERVER = "127.0.0.1:1"
ADMIN_TOKEN = "cli-admin-token-1"
READER_TOKEN = "cli-reader-token-1"
TOKENS_TOML = f"""
[[tokens]]
token = "{ADMIN_TOKEN}"
principal = "root"
scopes = ["admin"]

[[tokens]]
token = "{READER_TOKEN}"
principal = "rita"
scopes = ["read"]
"""

Run = Callable[..., subprocess.CompletedProcess[str]]


def base_env(**extra: str) -> dict[str, str]:
    """This process's environment without any ELECTRIC_* variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTRIC_")}
    env.update(extra)
    return env


def electric(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*ELECTRIC, *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture(scope="module", autouse=True)
def interruptible_children() -> Iterator[None]:
    """Children inherit an ignored SIGINT (e.g. pytest run as a background job); make it default."""
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture
def cli(live: TestServer) -> Run:
    """Run `electric` with ELECTRIC_ADDRESS pointing at the test server."""

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return electric(*args, env=base_env(ELECTRIC_ADDRESS=live.address, **env))

    return run


@pytest.fixture
def kind() -> str:
    """An entity type of this test's own, so listings and watches see only its entities."""
    return f"t{uuid.uuid4().hex[:10]}"


def error_json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(result.stdout)
    assert set(document) == {"error"}
    assert set(document["error"]) == {"code", "message"}
    return document


# -- one-shot commands ----------------------------------------------------------------------------


def test_spawn_human_and_json(cli: Run, kind: str) -> None:
    human = cli("spawn", f"{kind}/a", "--grace", "250ms", "--idle-timeout", "2s")
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0] == f"/{kind}/a"
    assert re.fullmatch(r"\s+state\s+spawning", lines[1])
    assert any(re.fullmatch(r"\s+grace period\s+250ms", line) for line in lines)
    assert any(re.fullmatch(r"\s+idle timeout\s+2s", line) for line in lines)

    result = cli("--json", "spawn", f"{kind}/b", "--grace", "1s")
    assert result.returncode == 0, result.stderr
    entity = json.loads(result.stdout)
    assert entity["url"] == f"/{kind}/b"
    assert (entity["type"], entity["id"], entity["state"]) == (kind, "b", "spawning")
    # What the spawn left unset is the type's default, fixed at the first lease.
    assert entity["profile"] == {
        "grace_period_ms": 1000,
        "idle_timeout_ms": None,
        "pending": ["idle_timeout"],
    }
    assert entity["head_offset"] == 1
    assert entity["closed"] is False


def test_get_human_and_json(cli: Run, sdk: Client, kind: str) -> None:
    sdk.spawn(f"{kind}/a")
    sdk.kill(f"{kind}/a")
    human = cli("get", f"/{kind}/a")
    assert human.returncode == 0, human.stderr
    assert human.stdout.splitlines()[:2] == [f"/{kind}/a", "  state         killed"]
    assert re.search(r"^\s+closed\s+yes$", human.stdout, re.MULTILINE)

    result = cli("get", f"{kind}/a", "--json")  # the global flag after the command
    assert result.returncode == 0, result.stderr
    entity = json.loads(result.stdout)
    assert (entity["state"], entity["head_offset"], entity["closed"]) == ("killed", 3, True)
    assert entity["txid"].isdigit()


def test_get_shows_the_last_five_events(cli: Run, sdk: Client, kind: str) -> None:
    """Like `kubectl describe`: the entity, then what happened to it last."""
    sdk.spawn(f"{kind}/a")
    for n in range(6):
        sdk.send(f"{kind}/a", f"note {n}")
    head = sdk.get(f"{kind}/a").head_offset
    human = cli("get", f"{kind}/a")
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    at = lines.index("  recent events (last 5)")
    shown = lines[at + 1 :]
    assert len(shown) == 5
    assert [int(line.split()[0]) for line in shown] == list(range(head - 5, head))
    assert "note 5" in shown[-1]
    assert "note 0" not in human.stdout

    entity = json.loads(cli("get", f"{kind}/a", "--json").stdout)
    recent = entity["recent_events"]
    assert [e["offset"] for e in recent] == list(range(head - 5, head))
    assert recent[-1]["value"]["text"] == "note 5"


def test_ls_table_and_json(cli: Run, sdk: Client, kind: str) -> None:
    for name in ("b", "a", "c"):
        sdk.spawn(f"{kind}/{name}")
    sdk.kill(f"{kind}/b")

    human = cli("ls", "--type", kind)
    assert human.returncode == 0, human.stderr
    header, *rows = human.stdout.splitlines()
    assert header.split() == ["URL", "STATE", "EVENTS", "GRACE", "IDLE", "UPDATED", "HOSTED"]
    assert [row.split()[:2] for row in rows] == [
        [f"/{kind}/a", "spawning"],
        [f"/{kind}/b", "killed"],
        [f"/{kind}/c", "spawning"],
    ]
    state_column = header.index("STATE")
    assert all(row[state_column - 2 : state_column] == "  " for row in rows)
    assert all(row[state_column] != " " for row in rows)

    result = cli("ls", "--type", kind, "--json")
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    assert [e["url"] for e in listing["entities"]] == [f"/{kind}/{n}" for n in "abc"]

    killed = json.loads(cli("ls", "--type", kind, "--state", "killed", "--json").stdout)
    assert [e["url"] for e in killed["entities"]] == [f"/{kind}/b"]
    both = json.loads(cli("ls", "--type", kind, "--state", "killed,spawning", "--json").stdout)
    assert len(both["entities"]) == 3
    first = json.loads(cli("ls", "--type", kind, "--limit", "1", "--json").stdout)
    assert [e["url"] for e in first["entities"]] == [f"/{kind}/a"]


def test_ls_says_when_limit_cut_the_list(cli: Run, sdk: Client, kind: str) -> None:
    for name in ("a", "b", "c"):
        sdk.spawn(f"{kind}/{name}")
    cut = cli("ls", "--type", kind, "--limit", "2")
    assert cut.returncode == 0, cut.stderr
    assert len(cut.stdout.splitlines()) == 3  # the header and two rows
    assert cut.stderr == "electric: the first 2 entities; more match (raise --limit to see them)\n"
    whole = cli("ls", "--type", kind, "--limit", "3")
    assert whole.stderr == ""
    assert len(whole.stdout.splitlines()) == 4
    for limit, truncated in (("2", True), ("3", False), ("4", False)):
        listing = json.loads(cli("ls", "--type", kind, "--limit", limit, "--json").stdout)
        assert listing["truncated"] is truncated
        assert len(listing["entities"]) == min(int(limit), 3)
    assert json.loads(cli("ls", "--type", kind, "--json").stdout)["truncated"] is False


ISO_MS_Z = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def instants(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every field that holds an instant (``*_at``, ``timestamp``, ``*deadline``), by its path."""
    found: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if key.endswith(("_at", "timestamp", "deadline")) and item is not None:
                found.append((f"{path}.{key}", item))
            found += instants(item, f"{path}.{key}")
    elif isinstance(value, list):
        for n, item in enumerate(value):
            found += instants(item, f"{path}[{n}]")
    return found


def test_json_times_are_iso_utc_with_milliseconds_and_z(cli: Run, kind: str) -> None:
    ref = f"{kind}/a"
    outputs = {
        "spawn": cli("spawn", ref, "--json"),
        "get": cli("get", ref, "--json"),
        "ls": cli("ls", "--type", kind, "--json"),
        "send": cli("send", ref, "hello", "--json"),
        "events": cli("events", ref, "--json"),
        "wait": cli("wait", ref, "spawning", "--json"),
    }
    seen = 0
    for command, result in outputs.items():
        assert result.returncode == 0, (command, result.stderr)
        for line in result.stdout.splitlines():
            for path, value in instants(json.loads(line)):
                assert isinstance(value, str), (command, path, value)
                assert ISO_MS_Z.fullmatch(value), (command, path, value)
                seen += 1
    assert "created_at" in json.loads(outputs["send"].stdout)
    assert seen >= 8
    # The one exception, as the RFC writes it: the signal response's created_at.
    signalled = json.loads(cli("signal", ref, "TERM", "--json").stdout)
    assert isinstance(signalled["created_at"], int)


@pytest.mark.parametrize("spelling", ["TERM", "sigterm", "SIGTERM"])
def test_signal_spellings_json(cli: Run, sdk: Client, kind: str, spelling: str) -> None:
    sdk.spawn(f"{kind}/a")
    result = cli("--json", "signal", f"{kind}/a", spelling, "--reason", "user requested shutdown")
    assert result.returncode == 0, result.stderr
    response = json.loads(result.stdout)
    assert response["url"] == f"/{kind}/a"
    assert response["signal"] == "SIGTERM"
    # Nothing has started the entity (no runtime here): SIGTERM in spawning is ignored.
    assert (response["previous_state"], response["new_state"]) == ("spawning", "spawning")
    assert response["outcome"] == "ignored"
    assert response["txid"].isdigit()
    assert isinstance(response["created_at"], int)
    recorded = sdk.events(f"{kind}/a").events[-1]
    assert (recorded.type, recorded.key) == ("signal", response["key"])
    assert recorded.value["reason"] == "user requested shutdown"


@pytest.mark.parametrize(
    ("number", "name"), [("1", "SIGHUP"), ("2", "SIGINT"), ("9", "SIGKILL"), ("15", "SIGTERM")]
)
def test_signal_by_the_numbers_posix_fixes(cli: Run, sdk: Client, kind: str, number: str, name: str) -> None:
    """As kill(1) takes them; the SDK takes the same spelling."""
    sdk.spawn(f"{kind}/a")
    result = cli("--json", "signal", f"{kind}/a", number)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["signal"] == name
    sdk.spawn(f"{kind}/b")
    assert sdk.signal(f"{kind}/b", number).signal.value == name


@pytest.mark.parametrize("number", ["17", "18", "19", "0", "10"])
def test_other_signal_numbers_are_refused_naming_stop_and_cont(
    cli: Run, sdk: Client, kind: str, number: str
) -> None:
    sdk.spawn(f"{kind}/a")
    result = cli("signal", f"{kind}/a", number)
    assert result.returncode == exit_codes.USAGE == 2
    assert result.stderr.startswith("electric: UNKNOWN_SIGNAL: ")
    assert "SIGSTOP" in result.stderr
    assert "SIGCONT" in result.stderr
    assert "their numbers differ between platforms" in result.stderr
    with pytest.raises(errors.InvalidArgument, match="SIGSTOP, SIGCONT"):
        sdk.signal(f"{kind}/a", number)
    assert len(sdk.events(f"{kind}/a").events) == 1  # nothing sent: only the spawn record


def test_signal_and_kill_human(cli: Run, sdk: Client, kind: str) -> None:
    sdk.spawn(f"{kind}/a")
    term = cli("signal", f"{kind}/a", "TERM")
    assert term.returncode == 0, term.stderr
    assert re.fullmatch(rf"/{kind}/a: SIGTERM spawning → spawning \(ignored, txid \d+\)\n", term.stdout)
    kill = cli("kill", f"{kind}/a", "--reason", "stuck")
    assert kill.returncode == 0, kill.stderr
    assert re.fullmatch(rf"/{kind}/a: SIGKILL spawning → killed \(transitioned, txid \d+\)\n", kill.stdout)
    assert sdk.get(f"{kind}/a").state.value == "killed"


def test_kill_json(cli: Run, sdk: Client, kind: str) -> None:
    sdk.spawn(f"{kind}/a")
    result = cli("kill", f"{kind}/a", "--json")
    assert result.returncode == 0, result.stderr
    response = json.loads(result.stdout)
    assert (response["signal"], response["previous_state"], response["new_state"]) == (
        "SIGKILL",
        "spawning",
        "killed",
    )
    assert response["txid"] == str(sdk.get(f"{kind}/a").txid)


def test_signal_usr_with_payload(cli: Run, sdk: Client, kind: str) -> None:
    sdk.spawn(f"{kind}/a")
    result = cli("signal", f"{kind}/a", "usr", "--payload", '{"n": 1, "tags": ["x"]}', "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["signal"] == "SIGUSR"
    assert sdk.events(f"{kind}/a").events[-1].value["payload"] == {"n": 1, "tags": ["x"]}


def test_send_human_and_json(cli: Run, sdk: Client, kind: str) -> None:
    sdk.spawn(f"{kind}/a")
    human = cli("send", f"{kind}/a", "hello")
    assert human.returncode == 0, human.stderr
    assert re.fullmatch(rf"/{kind}/a: message msg_\d+ at offset 1 \(spawning, txid \d+\)\n", human.stdout)
    result = cli("send", f"{kind}/a", "again", "--data", '{"k": [1, 2]}', "--json")
    assert result.returncode == 0, result.stderr
    receipt = json.loads(result.stdout)
    assert (receipt["url"], receipt["offset"], receipt["state"]) == (f"/{kind}/a", 2, "spawning")
    message = sdk.events(f"{kind}/a").events[2]
    assert message.value["text"] == "again"
    assert message.value["data"] == {"k": [1, 2]}


def test_events_human(cli: Run, sdk: Client, kind: str) -> None:
    ref = f"{kind}/a"
    sdk.spawn(ref)
    sdk.send(ref, "hello\nworld")
    sdk.signal(ref, "SIGTERM", reason="because")
    sdk.kill(ref)
    result = cli("events", ref)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 5
    assert [int(line.split()[0]) for line in lines] == [0, 1, 2, 3, 4]
    assert [line.split()[2] for line in lines] == ["state", "message", "signal", "signal", "state"]
    assert lines[0].endswith("→ spawning (spawn)")
    assert lines[1].endswith("anonymous: hello\\nworld")
    assert lines[2].endswith("SIGTERM by anonymous (because) → ignored")
    assert lines[3].endswith("SIGKILL by anonymous → transitioned")
    assert lines[4].endswith("spawning → killed (signal)")


def test_events_json_from_and_limit(cli: Run, sdk: Client, kind: str) -> None:
    ref = f"{kind}/a"
    sdk.spawn(ref)
    for n in range(4):
        sdk.send(ref, f"m{n}")
    result = cli("events", ref, "--json")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["offset"] for r in records] == [0, 1, 2, 3, 4]
    assert records[0]["type"] == "state"
    assert set(records[1]) == {"type", "key", "value", "headers", "offset"}
    assert records[1]["headers"]["operation"] == "insert"
    page = cli("events", ref, "--from", "2", "--limit", "2", "--json")
    assert [json.loads(line)["value"]["text"] for line in page.stdout.splitlines()] == ["m1", "m2"]


# -- errors and exit codes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("get", "{kind}/nope"),
        ("signal", "{kind}/nope", "TERM"),
        ("kill", "{kind}/nope"),
        ("send", "{kind}/nope", "hi"),
        ("events", "{kind}/nope"),
        ("events", "{kind}/nope", "--follow"),
    ],
)
def test_not_found_exits_3(cli: Run, kind: str, args: tuple[str, ...]) -> None:
    argv = [a.format(kind=kind) for a in args]
    human = cli(*argv)
    assert human.returncode == exit_codes.NOT_FOUND == 3
    assert human.stdout == ""
    assert human.stderr.startswith("electric: ENTITY_NOT_FOUND: ")
    machine = cli(*argv, "--json")
    assert machine.returncode == 3
    assert error_json(machine)["error"]["code"] == "ENTITY_NOT_FOUND"


def test_signal_to_killed_entity_exits_4_with_rfc_error(cli: Run, sdk: Client, kind: str) -> None:
    sdk.spawn(f"{kind}/a")
    sdk.kill(f"{kind}/a")
    human = cli("signal", f"{kind}/a", "SIGTERM")
    assert human.returncode == exit_codes.PRECONDITION == 4
    assert human.stdout == ""
    assert human.stderr == "electric: INVALID_SIGNAL: Cannot signal a killed entity\n"
    machine = cli("--json", "signal", f"{kind}/a", "SIGTERM")
    assert machine.returncode == 4
    assert json.loads(machine.stdout) == {
        "error": {"code": "INVALID_SIGNAL", "message": "Cannot signal a killed entity"}
    }
    again = cli("kill", f"{kind}/a")
    assert again.returncode == 4
    message = cli("send", f"{kind}/a", "hello")
    assert message.returncode == 4
    assert message.stderr.startswith("electric: ENTITY_TERMINAL: ")


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("get", "a b/x"), "INVALID_NAME"),
        (("get", "no-slash"), "INVALID_NAME"),
        (("signal", "{ref}", "SIGFOO"), "UNKNOWN_SIGNAL"),
        (("signal", "{ref}", "USR", "--payload", "{{bad"), "INVALID_PAYLOAD"),
        (("signal", "{ref}", "TERM", "--payload", "[1]"), "PAYLOAD_NOT_ALLOWED"),
        (("send", "{ref}", "hi", "--data", "nope"), "INVALID_PAYLOAD"),
        (("send", "{ref}"), "EMPTY_MESSAGE"),
        (("ls", "--state", "runnin"), "UNKNOWN_STATE"),
        (("watch", "--state", "runnin"), "UNKNOWN_STATE"),
        (("spawn", "{kind}/new", "--grace", "soon"), "INVALID_DURATION"),
        (("get", "{ref}", "--timeout", "soon"), "INVALID_DURATION"),
    ],
)
def test_invalid_argument_exits_2(cli: Run, sdk: Client, kind: str, args: tuple[str, ...], code: str) -> None:
    ref = f"{kind}/a"
    sdk.spawn(ref)
    argv = [a.format(ref=ref, kind=kind) for a in args]
    human = cli(*argv)
    assert human.returncode == exit_codes.USAGE == 2, human.stderr
    assert human.stderr.startswith(f"electric: {code}: ")
    machine = cli(*argv, "--json")
    assert machine.returncode == 2
    assert error_json(machine)["error"]["code"] == code
    # Rejected before or by the server: nothing was written.
    assert sdk.get(ref).head_offset == 1
    assert sdk.list(kind) == [sdk.get(ref)]


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("bogus",),
        ("get",),
        ("get", "a/b", "--bogus"),
        ("ls", "--limit", "0"),
        ("events", "a/b", "--from", "x"),
    ],
)
def test_usage_errors_exit_2(cli: Run, args: tuple[str, ...]) -> None:
    human = cli(*args)
    assert human.returncode == 2
    assert "usage: electric" in human.stderr
    assert "electric: USAGE: " in human.stderr
    assert human.stdout == ""
    machine = cli(*args, "--json")
    assert machine.returncode == 2
    assert error_json(machine)["error"]["code"] == "USAGE"


def test_help_lists_every_command_and_the_exit_codes(cli: Run) -> None:
    result = cli("--help")
    assert result.returncode == 0
    for command in ("spawn", "get", "ls", "signal", "kill", "send", "events", "watch", "server", "verify"):
        assert command in result.stdout
    assert "130 Ctrl-C" in " ".join(result.stdout.split())
    sub = cli("signal", "--help")
    assert sub.returncode == 0
    for option in ("--reason", "--payload", "--address", "--token", "--json", "--timeout"):
        assert option in sub.stdout


@pytest.mark.parametrize(("typed", "meant"), [("spwan", "spawn"), ("sigal", "signal"), ("wacth", "watch")])
def test_a_mistyped_command_names_the_closest(cli: Run, typed: str, meant: str) -> None:
    human = cli(typed, "a/b")
    assert human.returncode == exit_codes.USAGE == 2
    assert f"electric: USAGE: unknown command '{typed}' (did you mean `{meant}`?)" in human.stderr
    machine = cli(typed, "a/b", "--json")
    assert f"did you mean `{meant}`?" in error_json(machine)["error"]["message"]
    assert "did you mean" not in cli("zzzzzz").stderr  # nothing close: no guess


@pytest.mark.parametrize(
    ("args", "usage"),
    [
        (("get", "a/b", "--bogus"), "usage: electric get "),
        (("--bogus", "ls"), "usage: electric ls "),
        (("ls", "--limit", "0"), "usage: electric ls "),
        (("verify", "--nope"), "usage: electric verify "),
    ],
)
def test_a_bad_flag_prints_that_commands_usage(cli: Run, args: tuple[str, ...], usage: str) -> None:
    result = cli(*args)
    assert result.returncode == 2
    assert result.stderr.startswith(usage), result.stderr


def test_every_command_has_a_description_an_example_and_readable_placeholders(cli: Run) -> None:
    commands = commands_of(build_parser())
    assert {"server", "worker", "dev", "verify", "export", "import", "state", "wait", "ready"} <= set(
        commands
    )
    for name, parser in commands.items():
        text = parser.format_help()
        assert parser.description, name
        assert re.search(r"^examples?:\n  \$ electric ", text, re.MULTILINE), (name, text)
        # argparse's default placeholder is the option's dest in capitals, e.g. COMMIT_DELAY.
        assert not re.search(r"--[a-z-]+ [A-Z]+_[A-Z_]+", text), (name, text)
    shown = cli("server", "--help")
    assert shown.returncode == 0
    assert "--commit-delay DURATION" in shown.stdout
    assert "$ electric server " in shown.stdout


def test_unavailable_exits_5(cli: Run) -> None:
    started = time.monotonic()
    human = cli("get", "a/b", "--address", NO_SERVER, "--timeout", "1s")
    assert human.returncode == exit_codes.UNAVAILABLE == 5
    assert human.stderr.startswith("electric: UNAVAILABLE: ")
    assert time.monotonic() - started < 15
    # What to do, not gRPC's "failed to connect to all addresses ... UNKNOWN".
    assert human.stderr == (
        f"electric: UNAVAILABLE: no server at {NO_SERVER} — start one with `make run` or "
        "`electric server`, or set ELECTRIC_ADDRESS\n"
    )
    machine = cli("--address", NO_SERVER, "--timeout", "1s", "--json", "ls")
    assert machine.returncode == 5
    assert error_json(machine)["error"]["code"] == "UNAVAILABLE"
    assert error_json(machine)["error"]["message"].startswith(f"no server at {NO_SERVER} — ")
    stream = cli("--address", NO_SERVER, "--timeout", "1s", "watch")
    assert stream.returncode == 5
    assert f"no server at {NO_SERVER}" in stream.stderr
    # `run`, which follows its run in a session of its own, says the same.
    run = cli("--address", NO_SERVER, "--timeout", "1s", "run", "a/b", "--message", "hi")
    assert run.returncode == 5
    assert f"no server at {NO_SERVER}" in run.stderr


@pytest.mark.parametrize("address", ["127.0.0.1", "localhost", "127.0.0.1:7700,localhost", "[::1]"])
def test_address_without_a_port_is_a_usage_error(cli: Run, address: str) -> None:
    """Not gRPC's silent default of port 443."""
    for result in (
        cli("ls", "--address", address),
        electric("ls", env=base_env(ELECTRIC_ADDRESS=address)),
    ):
        assert result.returncode == exit_codes.USAGE == 2, result.stderr
        assert result.stderr.startswith("electric: INVALID_ADDRESS: ")
        assert "is not HOST:PORT" in result.stderr


def test_already_exists_exits_7(cli: Run, sdk: Client, kind: str) -> None:
    sdk.spawn(f"{kind}/a")
    human = cli("spawn", f"{kind}/a")
    assert human.returncode == exit_codes.EXISTS == 7
    assert human.stderr.startswith("electric: ENTITY_EXISTS: ")
    machine = cli("spawn", f"{kind}/a", "--json")
    assert machine.returncode == 7
    assert error_json(machine)["error"]["code"] == "ENTITY_EXISTS"


def test_address_flag_overrides_env(live: TestServer, sdk: Client, kind: str) -> None:
    sdk.spawn(f"{kind}/a")
    dead = base_env(ELECTRIC_ADDRESS=NO_SERVER)
    assert electric("get", f"{kind}/a", "--timeout", "1s", env=dead).returncode == 5
    for argv in (
        ["--address", live.address, "get", f"{kind}/a"],
        ["get", f"{kind}/a", "--address", live.address],
    ):
        result = electric(*argv, env=dead)
        assert result.returncode == 0, result.stderr
    assert electric("get", f"{kind}/a", env=base_env(ELECTRIC_ADDRESS=live.address)).returncode == 0


# -- auth -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestServer]:
    tokens = tmp_path_factory.mktemp("auth") / "tokens.toml"
    tokens.write_text(TOKENS_TOML)
    tokens.chmod(0o600)  # a tokens file others may read is refused
    with TestServer(tokens_file=tokens) as server:
        yield server


def test_auth_failures_exit_6(secured: TestServer, kind: str) -> None:
    env = base_env(ELECTRIC_ADDRESS=secured.address)
    missing = electric("ls", env=env)
    assert missing.returncode == exit_codes.AUTH == 6
    assert missing.stderr.startswith("electric: UNAUTHENTICATED: ")
    unknown = electric("ls", "--token", "not-a-token", "--json", env=env)
    assert unknown.returncode == 6
    assert error_json(unknown)["error"]["code"] == "UNAUTHENTICATED"
    denied = electric("spawn", f"{kind}/a", "--token", READER_TOKEN, env=env)
    assert denied.returncode == 6
    assert denied.stderr.startswith("electric: MISSING_SCOPE: ")


def test_token_from_env_and_flag(secured: TestServer, kind: str) -> None:
    admin = base_env(ELECTRIC_ADDRESS=secured.address, ELECTRIC_TOKEN=ADMIN_TOKEN)
    assert electric("spawn", f"{kind}/a", env=admin).returncode == 0
    assert electric("signal", f"{kind}/a", "TERM", "--reason", "audit", env=admin).returncode == 0
    reader = base_env(ELECTRIC_ADDRESS=secured.address)
    result = electric("events", f"{kind}/a", "--token", READER_TOKEN, env=reader)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].endswith("SIGTERM by root (audit) → ignored")
    # The flag wins over the environment.
    flagged = electric("kill", f"{kind}/a", "--token", READER_TOKEN, env=admin)
    assert flagged.returncode == 6


# -- streams --------------------------------------------------------------------------------------


class Lines:
    """A stream read line by line on a thread; every wait is bounded."""

    def __init__(self, stream: IO[str]) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def next(self, timeout: float = WAIT_S) -> str:
        line = self._lines.get(timeout=timeout)
        assert line is not None, "the stream ended"
        return line

    def rest(self, timeout: float = WAIT_S) -> list[str]:
        """Every line until EOF."""
        lines = []
        while (line := self._lines.get(timeout=timeout)) is not None:
            lines.append(line)
        return lines


class Streaming:
    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [*ELECTRIC, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        self.lines = Lines(self.proc.stdout)

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(WAIT_S)

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(WAIT_S)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def streaming(live: TestServer) -> Iterator[Callable[..., Streaming]]:
    started: list[Streaming] = []

    def start(*args: str) -> Streaming:
        stream = Streaming(list(args), base_env(ELECTRIC_ADDRESS=live.address))
        started.append(stream)
        return stream

    yield start
    for stream in started:
        stream.close()


def test_events_follow_until_killed(streaming: Callable[..., Streaming], sdk: Client, kind: str) -> None:
    ref = f"{kind}/a"
    sdk.spawn(ref)
    follow = streaming("events", ref, "--follow", "--json")
    first = json.loads(follow.lines.next())
    assert (first["offset"], first["type"], first["value"]["state"]) == (0, "state", "spawning")
    sdk.send(ref, "live")
    assert json.loads(follow.lines.next())["value"]["text"] == "live"
    sdk.kill(ref, reason="done")
    rest = [json.loads(line) for line in follow.lines.rest()]
    assert [(r["offset"], r["type"]) for r in rest] == [(2, "signal"), (3, "state")]
    assert rest[0]["value"]["signal"] == "SIGKILL"
    assert rest[1]["value"]["state"] == "killed"
    assert follow.proc.wait(WAIT_S) == 0
    assert follow.stderr() == ""


def test_events_follow_ctrl_c_exits_130(streaming: Callable[..., Streaming], sdk: Client, kind: str) -> None:
    sdk.spawn(f"{kind}/a")
    follow = streaming("events", f"{kind}/a", "-f")
    assert follow.lines.next().rstrip().endswith("→ spawning (spawn)")
    assert follow.interrupt() == exit_codes.INTERRUPTED == 130
    assert follow.stderr() == ""
    assert sdk.get(f"{kind}/a").state.value == "spawning"  # Ctrl-C stops the CLI, not the entity


def unhosted_note(kind: str) -> str:
    """What watch says on stderr, once, of a spawning entity whose type no connected worker hosts."""
    return f"electric: warning: {presence.unhosted_note(kind)}\n"


def test_watch_json_snapshot_then_changes(
    streaming: Callable[..., Streaming], sdk: Client, kind: str
) -> None:
    sdk.spawn(f"{kind}/a")
    watch = streaming("watch", "--type", kind, "--json")
    snapshot = json.loads(watch.lines.next())
    assert snapshot["snapshot"] is True
    assert snapshot["previous_state"] is None
    assert (snapshot["entity"]["url"], snapshot["entity"]["state"]) == (f"/{kind}/a", "spawning")
    sdk.kill(f"{kind}/a")
    change = json.loads(watch.lines.next())
    assert change["snapshot"] is False
    assert (change["previous_state"], change["entity"]["state"]) == ("spawning", "killed")
    sdk.spawn(f"{kind}/b")
    spawned = json.loads(watch.lines.next())
    assert (spawned["snapshot"], spawned["previous_state"]) == (False, None)
    assert spawned["entity"]["url"] == f"/{kind}/b"
    assert watch.interrupt() == 130
    stderr = watch.stderr()
    assert "Traceback" not in stderr
    assert stderr == unhosted_note(kind)


@pytest.mark.parametrize("json_mode", [True, False])
def test_a_reconnecting_watch_does_not_reprint_the_snapshot(
    tmp_path: Path, kind: str, json_mode: bool
) -> None:
    """The server restarts under a watch: its fresh snapshot is not printed again, only what
    is new (here: an entity spawned after the restart)."""
    first = TestServer(tmp_path / "data").start()
    port = first.address.rpartition(":")[2]
    with first.client() as client:
        for name in ("a", "b"):
            client.spawn(f"{kind}/{name}")
    watch = Streaming(
        ["watch", "--type", kind, *(["--json"] if json_mode else [])],
        base_env(ELECTRIC_ADDRESS=first.address),
    )
    second: TestServer | None = None
    try:
        shown = [watch.lines.next(), watch.lines.next()]
        assert [f"/{kind}/a" in shown[0], f"/{kind}/b" in shown[1]] == [True, True]
        first.stop()
        second = TestServer(tmp_path / "data", listen=f"127.0.0.1:{port}").start()
        with second.client() as client:
            client.spawn(f"{kind}/c")
        after = watch.lines.next()  # the next line the watch prints after the restart
        assert f"/{kind}/c" in after, after
        if json_mode:
            assert json.loads(after)["entity"]["url"] == f"/{kind}/c"
    finally:
        watch.close()
        for server in (first, second):
            if server is not None:
                server.stop()


def test_watch_prints_a_line_per_change_when_not_a_tty(
    streaming: Callable[..., Streaming], sdk: Client, kind: str
) -> None:
    sdk.spawn(f"{kind}/a")
    watch = streaming("watch", "--type", kind)
    assert watch.lines.next().rstrip().endswith(f"/{kind}/a: spawning (snapshot)")
    sdk.kill(f"{kind}/a")
    assert watch.lines.next().rstrip().endswith(f"/{kind}/a: spawning → killed")
    assert watch.interrupt() == 130
    assert watch.stderr() == unhosted_note(kind)


def read_until(fd: int, wanted: Callable[[str], bool], timeout: float = WAIT_S) -> str:
    """Read a pty until ``wanted(everything read so far)``; bounded by ``timeout``."""
    deadline = time.monotonic() + timeout
    text = ""
    while not wanted(text):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"timed out; read so far:\n{text}"
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            text += os.read(fd, 65536).decode(errors="replace")
    return text


@contextlib.contextmanager
def tty_watch(live: TestServer, kind: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """`electric watch --type KIND` on a terminal (a pty): the process and the pty's fd to read."""
    main_fd, child_fd = pty.openpty()
    proc = subprocess.Popen(
        [*ELECTRIC, "watch", "--type", kind],
        stdout=child_fd,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=base_env(ELECTRIC_ADDRESS=live.address),
    )
    os.close(child_fd)
    try:
        yield proc, main_fd
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT_S)
        if proc.stderr is not None:
            proc.stderr.close()
        os.close(main_fd)


def test_watch_redraws_a_table_on_a_tty(live: TestServer, sdk: Client, kind: str) -> None:
    sdk.spawn(f"{kind}/a")
    with tty_watch(live, kind) as (proc, main_fd):
        screen = read_until(main_fd, lambda text: f"/{kind}/a" in text and "spawning" in text)
        assert "URL" in screen
        assert "LAST CHANGE" in screen
        sdk.kill(f"{kind}/a")
        redrawn = read_until(main_fd, lambda text: "spawning → killed" in text)
        assert "\x1b[2J" in redrawn  # the screen was cleared and the table drawn again
        proc.send_signal(signal.SIGINT)
        assert proc.wait(WAIT_S) == 130
        assert proc.stderr is not None
        assert proc.stderr.read() == unhosted_note(kind).encode()


def test_the_watch_tables_events_column_stays_current(live: TestServer, sdk: Client, kind: str) -> None:
    """Messages append events without a state change; the EVENTS column follows them anyway."""
    sdk.spawn(f"{kind}/a")
    row = re.compile(rf"/{kind}/a\s+spawning\s+(\d+)\s")

    def events_shown(text: str) -> list[int]:
        return [int(n) for n in row.findall(text)]

    with tty_watch(live, kind) as (_, main_fd):
        assert events_shown(read_until(main_fd, lambda text: bool(events_shown(text))))[-1] == 1
        for n in range(3):
            sdk.send(f"{kind}/a", f"note {n}")
        head = sdk.get(f"{kind}/a").head_offset
        assert head == 4
        read_until(main_fd, lambda text: head in events_shown(text))


# -- docs -----------------------------------------------------------------------------------------


def test_docs_list_every_exit_code() -> None:
    docs = (ROOT / "docs" / "cli.md").read_text()
    assert exit_codes.__doc__ is not None
    codes = [value for name, value in vars(exit_codes).items() if name.isupper() and isinstance(value, int)]
    assert len(set(codes)) == len(codes), "exit codes must be distinct"
    for code in codes:
        assert re.search(rf"^\| {code} \|", docs, re.MULTILINE), f"docs/cli.md lacks exit code {code}"
        assert re.search(rf"^{code}\s", exit_codes.__doc__, re.MULTILINE)


# -- wait -----------------------------------------------------------------------------------------


def test_wait_returns_at_once_when_the_entity_is_there(cli: Run, sdk: Client, kind: str) -> None:
    sdk.spawn(f"{kind}/w1")  # no worker hosts the type: it stays spawning
    result = cli("wait", f"{kind}/w1", "spawning")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"/{kind}/w1 spawning\n"
    result = cli("--json", "wait", f"{kind}/w1", "running,spawning")
    assert json.loads(result.stdout)["state"] == "spawning"


def test_wait_follows_changes_until_the_state(cli: Run, sdk: Client, live: TestServer, kind: str) -> None:
    sdk.spawn(f"{kind}/w2")
    env = base_env(ELECTRIC_ADDRESS=live.address)
    waiting = subprocess.Popen(
        [*ELECTRIC, "wait", f"{kind}/w2", "killed"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    sdk.kill(f"{kind}/w2")  # before or after the wait has started watching: either way it sees `killed`
    out, err = waiting.communicate(timeout=WAIT_S)
    assert waiting.returncode == 0, err
    assert out == f"/{kind}/w2 killed\n"


def test_wait_times_out_with_124(cli: Run, sdk: Client, kind: str) -> None:
    sdk.spawn(f"{kind}/w3")
    result = cli("wait", f"{kind}/w3", "running", "--timeout", "300ms")
    assert result.returncode == exit_codes.TIMEOUT
    assert f"/{kind}/w3 did not become running within 300ms" in result.stderr


def test_wait_for_a_state_a_final_entity_can_never_reach_exits_4(cli: Run, sdk: Client, kind: str) -> None:
    sdk.spawn(f"{kind}/w4")
    sdk.kill(f"{kind}/w4")
    result = cli("wait", f"{kind}/w4", "running")
    assert result.returncode == 4
    assert "STATE_UNREACHABLE" in result.stderr
    assert cli("wait", f"{kind}/w4", "bogus").returncode == 2
    assert cli("wait", f"{kind}/missing", "running").returncode == 3


def test_ready_waits_for_the_server(cli: Run, live: TestServer) -> None:
    result = cli("ready")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{live.address} ready\n"
    absent = electric("--address", NO_SERVER, "ready", "--timeout", "300ms", env=base_env())
    assert absent.returncode == exit_codes.UNAVAILABLE
    assert "not ready after" in absent.stderr
