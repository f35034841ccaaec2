"""The dashboard as a real Voilà process, and playwright-core for the scripts that drive it in
Chromium. Used by the browser test and by ``bench/bench_dashboard.py``, so the bench measures the
page the test drives."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
NOTEBOOK = ROOT / "notebooks" / "control_panel.ipynb"
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
NODE, NPM = shutil.which("node"), shutil.which("npm")
STOP_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def ensure_playwright() -> None:
    """playwright-core, from tests/browser/package-lock.json (no browser download: it drives
    Chromium)."""
    if not (HERE / "node_modules" / "playwright-core").is_dir():
        assert NPM is not None, "npm not found"
        subprocess.run(
            [NPM, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=HERE, check=True, timeout=300
        )


class Voila:
    """``voila notebooks/control_panel.ipynb`` as a real process; ``url`` once ``ready`` is set.

    ``env`` is its environment (``ELECTRIC_ADDRESS``, ``ELECTRIC_ENTITY``, ...), which the
    kernels it starts inherit."""

    def __init__(self, env: dict[str, str]) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/"
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            [
                str(Path(sys.prefix) / "bin" / "voila"),
                str(NOTEBOOK),
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
        self.ready.set()  # it exited: the caller reports its log

    def wait_ready(self, timeout_s: float) -> None:
        assert self.ready.wait(timeout_s), "voila did not start:\n" + "".join(self.lines)
        assert self.proc.poll() is None, "voila exited:\n" + "".join(self.lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # Voilà shuts its kernels down on SIGTERM
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(STOP_TIMEOUT_S)  # the log ends with the process
        assert self.proc.stdout is not None
        self.proc.stdout.close()
