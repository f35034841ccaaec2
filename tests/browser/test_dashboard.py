"""The Voilà dashboard in a real browser: headless Chromium (Debian's package) driven by
playwright-core (dashboard.mjs) clicks Pause and Resume on the control panel; the badge follows,
and the signals are on the entity's stream. Screenshots go to .artifacts/.

Skipped, with the reason, where Chromium or Node.js is not installed (.ci/run installs Chromium).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from widgets.support import TIMEOUT_S, ThreadedWorker

from electric_sdk.lifecycle import State
from electric_sdk.testing import TestServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ARTIFACTS = ROOT / ".artifacts"
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
NODE, NPM = shutil.which("node"), shutil.which("npm")
BROWSER_TIMEOUT_S = 120  # a kernel start and the notebook's cells, then three clicks

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)"
    ),
    pytest.mark.skipif(
        NODE is None or NPM is None, reason="Node.js/npm not found (playwright-core runs on Node)"
    ),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Voila:
    """``voila notebooks/control_panel.ipynb`` as a real process; ``url`` once it serves."""

    def __init__(self, env: dict[str, str]) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/"
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            [
                str(Path(sys.prefix) / "bin" / "voila"),
                str(ROOT / "notebooks" / "control_panel.ipynb"),
                "--no-browser",
                f"--port={port}",
                "--Voila.ip=127.0.0.1",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # Drain its log on a thread (a full pipe would stall it) and say when it serves.
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if self.url in line:
                self.ready.set()
        self.ready.set()  # it exited: the test reports its log

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # Voilà shuts its kernels down on SIGTERM
            try:
                self.proc.wait(TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(TIMEOUT_S)  # the log ends with the process
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture(scope="module")
def playwright() -> Path:
    """playwright-core, from tests/browser/package-lock.json (no browser download: it drives Chromium)."""
    if not (HERE / "node_modules" / "playwright-core").is_dir():
        assert NPM is not None
        subprocess.run(
            [NPM, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=HERE, check=True, timeout=300
        )
    return HERE / "dashboard.mjs"


@pytest.fixture
def entity(electric: TestServer) -> Iterator[str]:
    """``probe/b1``, running on a worker (on its own thread) for as long as the test needs."""
    with ThreadedWorker(electric.address, idle_timeout="10m"):
        client = electric.client()
        client.spawn("probe/b1")
        client.wait_for_state("probe/b1", State.RUNNING, timeout=TIMEOUT_S)
        yield "probe/b1"


@pytest.fixture
def dashboard(electric: TestServer, entity: str) -> Iterator[Voila]:
    """The dashboard, connected to the test's server (ELECTRIC_ADDRESS), controlling ``entity``."""
    env = {**os.environ, "ELECTRIC_ADDRESS": electric.address, "ELECTRIC_ENTITY": entity}
    env.pop("ELECTRIC_TOKEN", None)
    voila = Voila(env)
    try:
        assert voila.ready.wait(TIMEOUT_S * 3), "voila did not start:\n" + "".join(voila.lines)
        assert voila.proc.poll() is None, "voila exited:\n" + "".join(voila.lines)
        yield voila
    finally:
        voila.stop()


def test_pause_and_resume_in_the_browser(
    electric: TestServer, entity: str, dashboard: Voila, playwright: Path
) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    assert NODE is not None
    result = subprocess.run(
        [NODE, str(playwright), dashboard.url, str(ARTIFACTS)],
        check=False,  # its output goes into the assertion's message
        env={**os.environ, "CHROMIUM": str(CHROMIUM)},
        capture_output=True,
        text=True,
        timeout=BROWSER_TIMEOUT_S,
    )
    assert result.returncode == 0, (
        f"{result.stdout}\n{result.stderr}\n--- voila ---\n{''.join(dashboard.lines)}"
    )
    assert "running → paused → running" in result.stdout

    # The clicks reached the server: SIGSTOP, then SIGCONT, and the entity is running again.
    client = electric.client()
    signals = [
        e.value["signal"]
        for e in client.events(entity).events
        if e.type == "signal" and e.operation == "insert"
    ]
    assert signals == ["SIGSTOP", "SIGCONT"]
    assert client.get(entity).state is State.RUNNING
    assert (ARTIFACTS / "dashboard-paused.png").stat().st_size > 0
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 0
