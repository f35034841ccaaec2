"""The pytest plugin (``pytest11`` entry point): a user's tests get the fixtures with no setup, and
a conftest that imports ``electric_sdk.testing`` (and even lists it in ``pytest_plugins``, the old
way) runs clean under ``filterwarnings = error``: no PytestAssertRewriteWarning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

USER_TEST = """
def test_kill(electric_client):
    electric_client.spawn("my_agent/a1")
    assert electric_client.kill("my_agent/a1").new_state.value == "killed"
"""


@pytest.mark.parametrize(
    "conftest",
    [
        "",
        "from electric_sdk.testing import TestServer  # noqa: F401\n",
        'from electric_sdk.testing import TestServer  # noqa: F401\n\npytest_plugins = ["electric_sdk.testing"]\n',
    ],
    ids=["no conftest", "conftest imports testing", "conftest lists testing as a plugin"],
)
def test_a_users_suite_gets_the_fixtures_without_warnings(tmp_path: Path, conftest: str) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_user.py").write_text(USER_TEST)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
