"""docs/getting-started.md does what it says (issue 23, point 4).

The page runs top to bottom in one shell session, as a reader would type it:
each ```sh line is one command (its output and exit status checked against
its comment: `backticked` fragments, ``…`` for anything, ``exit N``), the
blocks introduced by "Save as `FILE`" are written as those files, and the
```python block that is not a file runs where it stands. Three things differ
from a reader's terminal: the clone is a copy of this one's files in the test's
temporary folder (the page makes its own virtualenv there, with only what it
installs: the test checks the `[test]` extra's tools are not in it), the project
folder (`my_project`) is in the temporary folder too, and port 7701 is a free one.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from doc_blocks import check_output, comment_fragments, lines

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "getting-started.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SAVE_AS = re.compile(r"Save as `([^`]+)`")
END = "__electric_getting_started_end__"
pytestmark = pytest.mark.timeout(300)
# What the `[test]` extra (and `make venv`) adds and an agent's virtualenv does not need.
NOT_FOR_AN_AGENT = ["schemathesis", "jupyter_client", "ipykernel", "pytest", "mypy", "hypothesis"]


class Shell:
    """One bash session: a command in, its output and exit status out."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            ["bash", "--norc", "--noprofile"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for text in self.proc.stdout:
            self.lines.put(text)

    def run(self, command: str, timeout: float = 120) -> tuple[int, str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{command}\necho {END} $?\n")
        self.proc.stdin.flush()
        out: list[str] = []
        while True:
            text = self.lines.get(timeout=timeout)
            if text.startswith(END):
                return int(text.split()[1]), "".join(out)
            out.append(text)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("kill %1 2>/dev/null; exit\n")  # a dev server left by a failed step
        self.proc.stdin.flush()
        self.proc.wait(30)
        self.proc.stdin.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _clone(into: Path) -> Path:
    """A copy of the clone's files (those git tracks, as they are on disk): no virtualenv, no build."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    return _clone(tmp_path / "clone")


@pytest.fixture
def shell(clone: Path) -> Iterator[Shell]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ELECTRIC_", "VIRTUAL_ENV", "PYTHON"))}
    ours = str(Path(sys.executable).parent)  # this suite's virtualenv: not the reader's
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != ours)
    session = Shell(clone, env)
    try:
        yield session
    finally:
        session.close()


def test_the_getting_started_page_runs_as_written(shell: Shell, clone: Path, tmp_path: Path) -> None:
    project, port = tmp_path / "my_project", str(_free_port())
    text = PAGE.read_text().replace("7701", port)
    blocks = [(m.start(), m.group(1), m.group(2)) for m in BLOCK.finditer(text)]
    ran = 0
    for start, language, body in blocks:
        intro = text[:start].rstrip().splitlines()[-1]
        if saved := SAVE_AS.search(intro):
            project.mkdir(exist_ok=True)
            (project / saved.group(1)).write_text(body)
        elif language == "sh":
            for line in lines(body):
                command = line.command.replace(
                    "mkdir -p my_project && cd my_project", f"mkdir -p {project} && cd {project}"
                )
                status, output = shell.run(command)
                assert status == line.expected_exit, f"{line.command!r} exited {status}:\n{output}"
                check_output(line, output, line.fragments)
                ran += 1
        elif language == "python":
            fragments = comment_fragments(body)
            status, output = shell.run(f"python - <<'__PY__'\n{body}__PY__")
            assert status == 0, output
            check_output("python block", output, fragments)
            ran += 1
    assert ran > 20  # the page's commands ran, not a few of them
    python = clone / ".venv" / "bin" / "python"
    found = subprocess.run(
        [
            str(python),
            "-c",
            f"import importlib.util as u; print([n for n in {NOT_FOR_AN_AGENT!r} if u.find_spec(n)])",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert found == "[]", f"the page's virtualenv holds the test tools: {found}"
