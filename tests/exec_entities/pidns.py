"""A PID namespace of a test's own (``unshare``): ``ns_init.py`` as its PID 1, driven by JSON lines.

In it, a test sees every process there is (nothing else runs there), can give a chosen PID to a
new process (``ns_last_pid``), and ends everything at once by closing it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .support import child

NS_INIT = str(Path(__file__).with_name("ns_init.py"))
REPO = str(Path(__file__).resolve().parents[2])


def _unshare_works() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", "echo 100 > /proc/sys/kernel/ns_last_pid"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"cannot make a PID namespace and set ns_last_pid here (needs root): {probe.stderr.strip()}"
    return None


_SKIP = _unshare_works()
# For a test (or a module's ``pytestmark``) that needs a PID namespace of its own.
needs_pid_namespace = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")


class Namespace:
    """``ns_init.py`` as PID 1 of a new PID namespace; requests and answers as JSON lines."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.proc = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-u", NS_INIT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def spawn(self, argv: list[str], log: str) -> int:
        return int(self.ask(op="spawn", argv=argv, log=str(self.tmp / log))["pid"])

    def worker(self, exec_file: Path, address: str, name: str, grace: str = "1s") -> int:
        argv = [sys.executable, "-m", "electric_sdk.cli.main", "worker", "--exec", str(exec_file)]
        return self.spawn([*argv, "--address", address, "--worker-id", name, "--grace", grace], f"{name}.log")

    def take_pid(self, pid: int, log: Path) -> int:
        """Start an unrelated process that gets exactly ``pid``."""
        self.ask(op="last_pid", value=pid - 1)
        return self.spawn(
            child("--on-term", "ignore", "--on-eof", "ignore", "--log", str(log)), "sentinel.out"
        )

    def procs(self) -> list[dict[str, Any]]:
        """Every process in the namespace: pid, ppid, pgrp, state and argv."""
        return list(self.ask(op="ps")["procs"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # init exits at EOF, and the kernel kills the rest of the namespace
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
