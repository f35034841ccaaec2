"""`electric completion bash|zsh` and the completer behind it, run the way a shell runs it.

bash sources the printed script and calls its completion function with a command line, as a
Tab press does; the function runs the real `electric` (argcomplete's protocol), against a
real server or against an address where none listens.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from electric_sdk import Client
from electric_sdk.cli import completion
from electric_sdk.testing import TestServer

BIN = Path(sys.executable).parent
ELECTRIC = [sys.executable, "-m", "electric_sdk.cli.main"]
NO_SERVER = "127.0.0.1:1"  # nothing listens on port 1 of the loopback
# Sources the script, then does what bash does on Tab for the line in $1.
TAB = """
source <(electric completion bash)
COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}; COMP_TYPE=9
read -ra COMP_WORDS <<< "$COMP_LINE"; [[ "$COMP_LINE" == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
_python_argcomplete electric
printf '%s\\n' "${COMPREPLY[@]}"
"""

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def tab(line: str, address: str) -> tuple[list[str], str]:
    """The candidates bash would offer for ``line``, and what the shell printed on stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTRIC_")}
    env.update(ELECTRIC_ADDRESS=address, PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    result = subprocess.run(
        ["bash", "-c", TAB, "bash", line], capture_output=True, text=True, env=env, timeout=60, check=True
    )
    return [c.strip() for c in result.stdout.splitlines() if c.strip()], result.stderr


@pytest.mark.parametrize(("shell", "registers"), [("bash", "complete "), ("zsh", "compdef ")])
def test_the_script_for_each_shell(shell: str, registers: str) -> None:
    result = subprocess.run([*ELECTRIC, "completion", shell], capture_output=True, text=True, check=True)
    assert f"{registers}" in result.stdout
    assert "_ARGCOMPLETE=1" in result.stdout
    assert result.stdout.rstrip().endswith("fi")
    if shell == "bash":
        subprocess.run(["bash", "-n"], input=result.stdout, text=True, check=True)


def test_commands_and_signals_complete_without_a_server() -> None:
    assert tab("electric sp", NO_SERVER)[0] == ["spawn"]
    assert tab("electric signal a/b SIGK", NO_SERVER)[0] == ["SIGKILL"]
    assert tab("electric wait a/b id", NO_SERVER)[0] == ["idle"]


def test_refs_without_a_server_offer_and_print_nothing() -> None:
    candidates, stderr = tab("electric get ", NO_SERVER)
    assert candidates == []
    assert stderr == ""
    # In-process, the same completer: empty, and bounded by its deadline rather than the CLI's
    # 10 s default (the margin is for a loaded machine; the deadline is 300 ms).
    started = time.monotonic()
    assert completion.complete_refs("", argparse.Namespace(address=NO_SERVER)) == []
    assert time.monotonic() - started < 5 * completion.REF_DEADLINE_S
    assert completion.REF_DEADLINE_S <= 0.3


def test_refs_are_offered_by_a_server(live: TestServer, sdk: Client) -> None:
    kind = f"c{uuid.uuid4().hex[:10]}"
    for name in ("alpha", "beta"):
        sdk.spawn(f"{kind}/{name}")
    assert tab(f"electric get {kind}/", live.address)[0] == [f"{kind}/alpha", f"{kind}/beta"]
    assert tab(f"electric signal {kind}/b", live.address)[0] == [f"{kind}/beta"]
    assert f"{kind}/alpha" in tab("electric events ", live.address)[0]
