"""`electric completion bash|zsh` and the completer behind it, run the way a shell runs it.

bash sources the printed script and calls its completion function with a command line, as a
Tab press does; the function runs the real `electric` (argcomplete's protocol), against a
real server or against an address where none listens. zsh runs interactively on a terminal
of its own (a pty), with its completion system and the script loaded, and is typed into.
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
    if shutil.which(shell) is not None:  # bash is required here; zsh is checked where it is installed
        subprocess.run([shell, "-n"], input=result.stdout, text=True, check=True)


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


# -- zsh: the script in a real interactive zsh, on a terminal of its own --------------------------

# ZDOTDIR's .zshrc: the completion system, the script, and one key (Ctrl-T) that saves the line
# being edited to $CAPTURE and exits, so the test reads what a Tab press left in the line.
ZSHRC = """
autoload -Uz compinit && compinit -u -D
eval "$(electric completion zsh)"
bindkey '^I' complete-word
capture-line() { print -r -- "$BUFFER" > "$CAPTURE"; BUFFER=exit; zle accept-line }
zle -N capture-line
bindkey '^T' capture-line
"""


def zsh_tab(tmp_path: Path, typed: str) -> str:
    """The line after typing ``typed`` and Tab into an interactive zsh, as a person would."""
    import pty
    import select

    (tmp_path / ".zshrc").write_text(ZSHRC)
    capture = tmp_path / "line"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTRIC_")}
    env.update(
        ELECTRIC_ADDRESS=NO_SERVER,
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        ZDOTDIR=str(tmp_path),
        CAPTURE=str(capture),
        TERM="dumb",
    )
    leader, follower = pty.openpty()
    shell = subprocess.Popen(
        ["zsh", "--no-globalrcs", "-i"], stdin=follower, stdout=follower, stderr=follower, env=env
    )
    os.close(follower)
    seen = b""
    try:
        # zle reads its input in order: the capture key is handled once the completion is done.
        os.write(leader, f"{typed}\t\x14".encode())
        deadline = time.monotonic() + 60
        while True:  # until the shell exits and its terminal closes
            ready, _, _ = select.select([leader], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(
                    f"zsh did not finish; its terminal showed:\n{seen.decode(errors='replace')}"
                )
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the shell is gone
                break
            if not chunk:
                break
            seen += chunk
        assert shell.wait(30) == 0, seen.decode(errors="replace")
    finally:
        if shell.poll() is None:
            shell.kill()
            shell.wait(30)
        os.close(leader)
    return capture.read_text().rstrip("\n")


@pytest.mark.skipif(
    shutil.which("zsh") is None,
    reason="zsh is not installed (Debian: apt-get install zsh; .ci/run installs it)",
)
def test_zsh_completes_a_command_name_and_a_signal(tmp_path: Path) -> None:
    assert zsh_tab(tmp_path, "electric sp") == "electric spawn "
    assert zsh_tab(tmp_path, "electric signal a/b SIGK") == "electric signal a/b SIGKILL "
