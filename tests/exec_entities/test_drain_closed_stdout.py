"""Drain under a closed stdout: `make run | tee log`, then Ctrl-C (issue 24, point 4).

A terminal's Ctrl-C sends SIGINT to the whole foreground process group, so `tee` dies with the
command it reads: from then on every write to the command's stdout (and, under `2>&1`, its stderr)
fails with EPIPE. The drain must not depend on them: it completes, its exec receipts land, and the
exit code stays the drain's.

Each test starts the real command in a process group of its own with its output on a pipe this
test reads, waits on that output and on the entity's stream (never on sleeps), then closes its end
of the pipe (the reader is gone) and sends SIGINT to the group, as the terminal would.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from runtime.rt_support import until

from electric_sdk import AsyncClient
from electric_sdk.testing import TestServer

from .support import CHILD, line, receipt, receipts

pytestmark = pytest.mark.anyio
ELECTRIC = (sys.executable, "-m", "electric_sdk.cli.main")
WAIT_S = 30.0
REF = "job/j1"
# Stderr of a command whose output broke must say so at most once, and never with a traceback.
NOISE = ("Traceback", "Logging error", "Exception ignored", "BrokenPipeError")


class Command:
    """A command in a process group of its own, its stdout (and maybe stderr) on one pipe."""

    def __init__(self, args: list[str], stderr: Path | None) -> None:
        read_end, write_end = os.pipe()
        err = open(stderr, "wb") if stderr is not None else None  # noqa: SIM115 (the child's copy)
        try:
            self.popen = subprocess.Popen(
                [*ELECTRIC, *args],
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=err if err is not None else write_end,  # None: `2>&1`
                start_new_session=True,
                env={k: v for k, v in os.environ.items() if not k.startswith("ELECTRIC_")},
            )
        finally:
            os.close(write_end)
            if err is not None:
                err.close()
        self._pipe: int | None = read_end
        self._seen = b""

    def until(self, pattern: str) -> re.Match[str]:
        """The first output line that matches; fails once the command ends or WAIT_S passes."""
        assert self._pipe is not None
        deadline = time.monotonic() + WAIT_S
        with selectors.DefaultSelector() as sel:
            sel.register(self._pipe, selectors.EVENT_READ)
            while True:
                for text in self._seen.decode(errors="replace").splitlines():
                    if found := re.search(pattern, text):
                        return found
                if not sel.select(deadline - time.monotonic()):
                    raise AssertionError(f"no line matched {pattern!r}:\n{self._seen.decode()}")
                chunk = os.read(self._pipe, 65536)
                if not chunk:
                    raise AssertionError(f"the output ended before {pattern!r}:\n{self._seen.decode()}")
                self._seen += chunk

    def reader_dies(self) -> None:
        """Close the pipe's only read end: every later write to it fails with EPIPE."""
        assert self._pipe is not None
        os.close(self._pipe)
        self._pipe = None

    def ctrl_c(self) -> None:
        os.killpg(self.popen.pid, signal.SIGINT)

    async def exit_code(self) -> int:
        return await anyio.to_thread.run_sync(self.popen.wait, WAIT_S)

    def close(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(WAIT_S)
        if self._pipe is not None:
            os.close(self._pipe)


@pytest.fixture
def commands() -> Iterator[list[Command]]:
    started: list[Command] = []
    yield started
    for command in started:
        command.close()


def _tasks(tmp_path: Path) -> Path:
    tasks = tmp_path / "tasks.toml"
    command = json.dumps([sys.executable, "-u", CHILD])  # exits 0 on SIGTERM
    tasks.write_text(
        f'[[exec]]\nid = "job"\ncommand = {command}\nkeep = true\ngrace_period = "20s"\n'
        '[exec.shutdown]\ngraceful = "SIGTERM"\ntimeout = "10s"\n'
    )
    return tasks


async def _process_started(address: str) -> None:
    async with AsyncClient(address) as client:
        await client.spawn(REF)
        await until(client, REF, line("ready pid="))


def _assert_drain_receipts(got: list[dict[str, Any]]) -> None:
    """The worker's drain shut the process down and said so: the graceful action, then its exit;
    no later worker had to find the generation gone (`recover`)."""
    acts = [(r["action"], r["disposition"]) for r in got]
    assert acts == [("start", "observed"), ("graceful", "issued"), ("exit", "observed")], got
    assert "the worker is draining" in got[1]["reason"]
    assert got[2]["exit_status"] == 0


def _assert_quiet(stderr: Path | None, broke: str) -> None:
    if stderr is None:
        return
    text = stderr.read_text()
    assert not any(word in text for word in NOISE), text
    assert text.count(f"{broke} is closed") == 1, text


@pytest.mark.parametrize("closed", ["stdout", "stdout+stderr"])
async def test_dev_drain_under_a_closed_stdout(tmp_path: Path, commands: list[Command], closed: str) -> None:
    data, stderr = tmp_path / "data", (tmp_path / "stderr" if closed == "stdout" else None)
    dev = Command(
        ["dev", "--exec", str(_tasks(tmp_path)), "--listen", "127.0.0.1:0", "--data", str(data)], stderr
    )
    commands.append(dev)
    address = dev.until(r"^electric server listening on (\S+)").group(1)
    dev.until(r"^  stop: ")  # the whole banner is out: what follows is the drain's
    with anyio.fail_after(WAIT_S):
        await _process_started(address)
    dev.reader_dies()
    dev.ctrl_c()
    assert await dev.exit_code() == 0
    _assert_quiet(stderr, "stdout")
    with TestServer(data) as again:  # the same store, read back after the command ended
        async with again.async_client() as client:
            _assert_drain_receipts(await receipts(client, REF))


async def test_worker_drain_under_a_closed_stdout_and_stderr(
    electric: TestServer, client: AsyncClient, tmp_path: Path, commands: list[Command]
) -> None:
    worker = Command(["worker", "--exec", str(_tasks(tmp_path)), "--address", electric.address], None)
    commands.append(worker)
    worker.until(r"^  stop: ")
    with anyio.fail_after(WAIT_S):
        await _process_started(electric.address)
    worker.reader_dies()
    worker.ctrl_c()
    assert await worker.exit_code() == 0
    with anyio.fail_after(WAIT_S):
        await until(client, REF, receipt("exit", "observed"))
    _assert_drain_receipts(await receipts(client, REF))


async def test_server_drain_under_a_closed_stdout_and_stderr(tmp_path: Path, commands: list[Command]) -> None:
    data = tmp_path / "data"
    server = Command(["server", "--listen", "127.0.0.1:0", "--data", str(data)], None)
    commands.append(server)
    address = server.until(r"^electric server listening on (\S+)").group(1)
    server.until(r"^  stop: ")
    async with AsyncClient(address) as client:
        spawned = await client.spawn("agent/a1")
    server.reader_dies()
    server.ctrl_c()
    assert await server.exit_code() == 0  # not 120: Python's last flush of a broken stderr
    with TestServer(data) as again:
        assert again.client().get("agent/a1").txid == spawned.txid
