"""Errors a newcomer can act on (issue 23, point 5): what is wrong, and where.

Each message names the file, the entity type and the field at fault, so the
fix is one edit away; the commands exit 2 (usage) with no traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from electric_sdk.durations import parse_ms
from electric_sdk.runtime import App, DefinitionError
from electric_sdk.runtime.exec import load_exec_file

ELECTRIC = [str(Path(sys.executable).with_name("electric"))]


def test_a_negative_duration_says_so() -> None:
    with pytest.raises(ValueError, match="negative durations are refused"):
        parse_ms("-1s")


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ('grace_period = "-1s"', "grace_period"),
        ('[exec.shutdown]\ngraceful = "SIGTERM"\ntimeout = "-250ms"', "shutdown.timeout"),
    ],
)
def test_an_exec_file_with_a_negative_duration_names_the_field(
    tmp_path: Path, table: str, field: str
) -> None:
    path = tmp_path / "tasks.toml"
    path.write_text(f'[[exec]]\nid = "t"\ncommand = ["true"]\n{table}\n')
    with pytest.raises(DefinitionError) as caught:
        load_exec_file(path)
    message = str(caught.value)
    assert "(t)" in message
    assert field in message
    assert "negative durations are refused" in message


def test_definition_errors_name_the_type_and_the_field() -> None:
    app = App()
    with pytest.raises(DefinitionError, match=r"entity type 'slow': grace_period: .*negative"):

        @app.entity("slow", grace_period="-1s")
        async def slow(ctx: object, message: object) -> None: ...

    with pytest.raises(DefinitionError, match=r"entity type 'picky': handles: "):
        app.entity("picky", handles=["SIGNOPE"])

    with pytest.raises(DefinitionError, match=r"entity type 'classy': .*on_message"):

        @app.entity("classy")
        class Classy:
            pass

    with pytest.raises(DefinitionError, match=r"entity type 'sync_fn': the message handler must be an async"):

        @app.entity("sync_fn")
        def sync_fn(ctx: object, message: object) -> None: ...


def _dev(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ELECTRIC, "dev", *args, "--listen", "127.0.0.1:0", "--data", str(tmp_path / "data")],
        cwd=tmp_path,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_dev_names_the_module_file_and_line_that_failed(tmp_path: Path) -> None:
    (tmp_path / "myagent.py").write_text(
        'from electric_sdk.runtime import App\napp = App()\nraise RuntimeError("boom")\n'
    )
    done = _dev(tmp_path, "myagent:app")
    assert done.returncode == 2, done.stderr
    assert "cannot load myagent:app: RuntimeError: boom" in done.stderr
    assert f"{tmp_path / 'myagent.py'}, line 3" in done.stderr
    assert "Traceback" not in done.stderr


def test_dev_with_only_an_exec_file_names_that_file_not_the_default_app(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('[[exec]]\nid = "t"\ncommand = ["true"]\ngrace_period = "-1s"\n')
    done = _dev(tmp_path, "--exec", "bad.toml")
    assert done.returncode == 2, done.stderr
    assert "cannot load bad.toml: exec[0] (t): grace_period:" in done.stderr
    assert "examples.agents" not in done.stderr


def test_docs_exec_shows_what_the_worker_prints(tmp_path: Path) -> None:
    """docs/exec.md's example error is the worker's own output for the file it describes."""
    shown = Path(__file__).resolve().parent.parent.joinpath("docs", "exec.md").read_text()
    (printed,) = (line for line in shown.splitlines() if line.startswith("electric worker: "))
    (tmp_path / "tasks.toml").write_text(
        '[[exec]]\nid = "job"\ncommand = ["true"]\ngrace_period = "30s"\n'
        '[exec.shutdown]\ngraceful = "SIGTERM"\ntimeout = "45s"\n'
    )
    done = subprocess.run(
        [*ELECTRIC, "worker", "--exec", "tasks.toml", "--address", "127.0.0.1:1"],
        cwd=tmp_path,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == printed
