"""An unsupported or unsafe shutdown policy fails closed when the type is defined: in Python, in
the TOML file, and end to end (the worker refuses to start, and nothing is written)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from electric_sdk.runtime import App, DefinitionError
from electric_sdk.runtime.exec import ShutdownPolicy, parse_exec_file
from electric_sdk.testing import TestServer

from .support import CHILD

BAD_POLICIES = [
    (
        {"shutdown": ShutdownPolicy("SIGKILL", "1s")},
        "SIGKILL cannot be a graceful action: a process cannot catch it",
    ),
    ({"shutdown": ShutdownPolicy("SIGSTOP", "1s")}, "SIGSTOP cannot be a graceful action"),
    ({"shutdown": ShutdownPolicy("SIGFOO", "1s")}, "graceful action 'SIGFOO' is not supported"),
    (
        {"shutdown": ShutdownPolicy("SIGTERM", "1s"), "backend": "portable"},
        "not supported by the portable backend",
    ),
    ({"shutdown": ShutdownPolicy("SIGTERM", "0s")}, "must be greater than 0"),
    ({"shutdown": ShutdownPolicy("SIGTERM", -1)}, "must be greater than 0"),
    ({"shutdown": ShutdownPolicy("SIGTERM", "11m"), "grace_period": "1h"}, "above the maximum"),
    ({"shutdown": ShutdownPolicy("SIGTERM", "31s")}, "longer than the grace period 30s"),
    ({"shutdown": ShutdownPolicy("SIGTERM", "2s"), "grace_period": "1s"}, "longer than the grace period"),
    ({"shutdown": ShutdownPolicy("SIGTERM", "soon")}, "invalid duration"),
    ({"backend": "windows"}, "backend 'windows' is not one of"),
]


@pytest.mark.parametrize(("options", "message"), BAD_POLICIES)
def test_bad_policy_is_a_definition_error(options: dict[str, object], message: str) -> None:
    app = App()
    with pytest.raises(DefinitionError, match=message.replace("(", r"\(")):
        app.exec("job", ["true"], **options)  # type: ignore[arg-type]
    assert app.types == {}


def test_good_policies_define() -> None:
    app = App()
    app.exec("a", ["true"])  # the compatibility default
    app.exec("b", ["true"], shutdown=ShutdownPolicy("SIGINT", "30s"))  # up to the default grace
    app.exec("c", "sh -c 'exit 0'", shutdown=ShutdownPolicy("stdin:shutdown", "500ms"), grace_period="1s")
    app.exec(
        "d", ["true"], backend="portable", shutdown=ShutdownPolicy("stdin:close", "2m"), grace_period="10m"
    )
    assert sorted(app.types) == ["a", "b", "c", "d"]
    assert app.types["c"].spec.argv == ["sh", "-c", "exit 0"]  # type: ignore[attr-defined]


GOOD_FILE = """
[[exec]]
id = "indexer"
command = ["python3", "-u", "index.py"]
cwd = "jobs"
env = { LOG_LEVEL = "debug" }
tags = ["batch", "nightly"]
grace_period = "1m30s"
idle_timeout = "5m"

[exec.shutdown]
graceful = "SIGINT"
timeout = "500ms"

[[exec]]
id = "tail"
command = "tail -F app.log"
keep = true
backend = "portable"
"""


def test_the_toml_grammar(tmp_path: Path) -> None:
    indexer, tail = parse_exec_file(GOOD_FILE, tmp_path)
    assert indexer.name == "indexer"
    assert indexer.spec.cwd == str(tmp_path / "jobs")
    assert indexer.spec.tags == ("batch", "nightly")
    assert indexer.graceful == "SIGINT"
    assert indexer.profile().grace_period.ToMilliseconds() == 90_000
    assert indexer.profile().idle_timeout.ToMilliseconds() == 300_000
    assert tail.spec.argv == ["tail", "-F", "app.log"]
    assert tail.spec.keep
    assert tail.graceful == "stdin:close"  # the portable compatibility default
    assert tail.force == "terminate"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[[exec]]\nid = "x"\ncommand = ["true"]\ntimeout = "1s"\n',
            r"exec\[0\] \(x\): unknown key\(s\) timeout",
        ),
        ('[[exec]]\nid = "x"\n', r"exec\[0\] \(x\): command is required"),
        (
            '[[exec]]\nid = "x"\ncommand = ["true"]\n[exec.shutdown]\ntimeout = 5\n',
            "a duration is a string with a unit",
        ),
        (
            '[[exec]]\nid = "x"\ncommand = ["true"]\n[exec.shutdown]\ngraceful = "SIGKILL"\n',
            "SIGKILL cannot be a graceful action",
        ),
        ('[[exec]]\nid = "x"\ncommand = ["true"]\n[exec.shutdown]\ntimeout = "0ms"\n', "greater than 0"),
        (
            '[[exec]]\nid = "x"\ncommand = ["true"]\n[[exec]]\nid = "x"\ncommand = ["true"]\n',
            "declared twice",
        ),
        ('[[exec]]\nid = "x"\ncommand = []\n', "non-empty list"),
        ("[task]\n", "unknown top-level key"),
        ("exec = [", "not valid TOML"),
    ],
)
def test_bad_files_name_the_file_and_the_entry(text: str, message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        parse_exec_file(text, name="tasks.toml")


def test_worker_with_a_bad_policy_refuses_to_start_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "tasks.toml"
    bad.write_text(
        f'[[exec]]\nid = "job"\ncommand = ["{sys.executable}", "{CHILD}"]\n[exec.shutdown]\ntimeout = "45s"\n'
    )
    with TestServer(tmp_path / "electric") as server:
        client = server.client()
        client.spawn("job/a")  # waits in spawning for a worker that hosts `job`
        before = client.events("job/a", 0).events
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "electric_sdk.cli.main",
                "worker",
                "--exec",
                str(bad),
                "--address",
                server.address,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        after = client.events("job/a", 0).events
        entity = client.get("job/a")
        client.close()
    assert proc.returncode == 2, proc.stderr
    assert (
        "tasks.toml: exec[0] (job): shutdown timeout 45s is longer than the grace period 30s" in proc.stderr
    )
    assert entity.state.value == "spawning"
    assert [e.offset for e in after] == [e.offset for e in before] == [0]
