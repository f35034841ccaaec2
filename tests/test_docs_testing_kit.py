"""The testing kit's docs run as written (issue 47, point 5).

Every code block of docs/runtime.md "Testing your agent", docs/sdk.md "Testing your code" and
docs/exec.md "Testing races" is a Python block, and each runs as a reader would run it: a block
that defines tests is saved as its own test file in an empty folder and run by a real pytest in a
subprocess (no conftest and no configuration of this repository: only what the block says, its
markers and fixtures, and the plugins installed with electric); any other block runs as a script.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = [
    ("docs/runtime.md", "## Testing your agent"),
    ("docs/sdk.md", "## Testing your code"),
    ("docs/exec.md", "## Testing races: the action hook"),
]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
PASSED = re.compile(r"\b(\d+) passed\b")
pytestmark = pytest.mark.timeout(300)


def section(page: str, heading: str) -> str:
    text = (ROOT / page).read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def blocks() -> list[tuple[str, str, str]]:
    """(where, language, body) of every fenced block of the kit's sections."""
    found = []
    for page, heading in SECTIONS:
        text = section(page, heading)
        for number, match in enumerate(FENCE.finditer(text), 1):
            found.append((f"{page} {heading[3:]} #{number}", match.group(1), match.group(2)))
    return found


def _env() -> dict[str, str]:
    # Nothing of this run leaks into the reader's: no ELECTRIC_* setting, no PYTHONPATH to tests/.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ELECTRIC_", "PYTEST_", "PYTHON"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def test_every_block_of_the_kit_s_sections_is_found_and_is_python() -> None:
    found = blocks()
    assert len(found) >= 4
    assert [where for where, language, _ in found if language != "python"] == []


@pytest.mark.parametrize(("where", "body"), [pytest.param(w, b, id=w) for w, _, b in blocks()])
def test_the_block_runs_as_written(where: str, body: str, tmp_path: Path) -> None:
    if "def test_" in body:
        # The reader's own test file, run by pytest as they would run it.
        (tmp_path / "test_from_the_docs.py").write_text(body)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_from_the_docs.py"]
    else:
        (tmp_path / "from_the_docs.py").write_text(body)
        command = [sys.executable, "from_the_docs.py"]
    done = subprocess.run(
        command, check=False, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{where}:\n{out}"
    if "def test_" in body:
        tests = len(re.findall(r"^(?:async )?def test_", body, re.M))
        passed = PASSED.search(out)
        assert passed is not None, f"{where}: nothing passed:\n{out}"
        assert int(passed.group(1)) == tests, f"{where}: not all passed:\n{out}"
        assert not re.search(r"\b(skipped|xfailed|warnings?)\b", out), f"{where}:\n{out}"
