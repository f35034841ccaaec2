"""The README's command blocks do what their comments say (issue 23, point 1).

Every ```sh and ```python block of README.md runs here as written, against
`make run`'s own stack (`make run` with LISTEN, HTTP and DATA pointed at this
test's port and folder). A comment states what its command prints: each
`backticked` fragment must appear in the output (``…`` stands for anything;
runs of spaces count as one), and ``exit N`` is the exit status (else 0). A
line ending in ``&`` runs in the background and is checked when the block
ends. ``make`` lines are the stack itself (``make run``) or this suite
(``make test``), so they are checked to be Makefile targets, not run again.
The Python block runs twice: a second run must work too.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from doc_blocks import FENCE, Line, check_output, comment_fragments, lines
from helpers import OutputPump

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BACKGROUND_S = 90.0


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README.read_text()) if lang == language]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """`make run`, as the README's first block has it, on a free port and a fresh data folder."""
    folder = tmp_path_factory.mktemp("make-run")
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "run", "LISTEN=127.0.0.1:0", "HTTP=off", f"DATA={folder / 'data'}"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output = OutputPump(proc)  # read all along: nobody has to keep reading the server's log
    address = output.wait_for(r"electric server listening on (\S+)", 120).group(1)
    output.wait_for(r"stop: ", 120)  # the banner's last line: the worker is up too
    env = dict(os.environ, ELECTRIC_ADDRESS=address)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # as the README's export does
    try:
        yield env
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


@pytest.mark.parametrize("index", range(len(blocks("sh"))))
def test_sh_block(index: int, stack: dict[str, str]) -> None:
    env = dict(stack)
    background: list[tuple[Line, subprocess.Popen[str]]] = []
    try:
        for line in lines(blocks("sh")[index]):
            _run_line(line, env, stack, background)
        for line, proc in background:
            out, _ = proc.communicate(timeout=BACKGROUND_S)
            assert proc.returncode == line.expected_exit, f"{line!r} exited {proc.returncode}:\n{out}"
            check_output(line, out, line.fragments)
    finally:
        for _, proc in background:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def _run_line(
    line: Line,
    env: dict[str, str],
    stack: dict[str, str],
    background: list[tuple[Line, subprocess.Popen[str]]],
) -> None:
    argv = shlex.split(line.command.rstrip("&"))
    if argv[0] == "make":
        assert argv[1] in _make_targets(), line
        return
    if argv[0] == "export":  # carried to the next lines, as a shell would
        shown = subprocess.run(
            ["bash", "-c", f"{line.command}; env -0"], cwd=ROOT, env=env, capture_output=True, check=True
        ).stdout.decode()
        env.clear()
        env.update(item.partition("=")[::2] for item in shown.split("\0") if "=" in item)
        env["ELECTRIC_ADDRESS"] = stack["ELECTRIC_ADDRESS"]
        return
    if line.background:
        proc = subprocess.Popen(
            ["bash", "-c", line.command.rstrip("&")],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        background.append((line, proc))
        return
    done = subprocess.run(
        ["bash", "-c", line.command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == line.expected_exit, f"{line!r} exited {done.returncode}:\n{output}"
    check_output(line, output, line.fragments)


def test_python_block_twice(stack: dict[str, str]) -> None:
    (code,) = blocks("python")
    fragments = comment_fragments(code)
    assert fragments, "the Python block's comments say what it prints"
    for _ in range(2):  # the second run must work as well as the first
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=stack,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        check_output("python block", done.stdout, fragments)
