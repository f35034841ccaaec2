"""The Voilà dashboard in a real browser, along the path a person takes.

A real server and worker hold a fleet of several types and states; ``voila`` serves
notebooks/control_panel.ipynb on it; headless Chromium (Debian's package), driven by playwright-core
(dashboard.mjs), opens it on the table, filters, opens a row, interrupts a run, stops the entity and
watches the countdown reach ``stopped``, then shows the final entities. Each step leaves a
screenshot in .artifacts/ (git-ignored); the test prints their paths. The script asks for the two
things only the test can do (start a run that holds, let a held cleanup finish) on stdout and waits
for the answer on stdin, so every step waits for an event, never for a time.

Skipped, with the reason, where Chromium or Node.js is not installed (.ci/run installs Chromium).
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import anyio
import pytest
from conftest import Leases
from widgets.support import TIMEOUT_S, ThreadedWorker

from electric_sdk.lifecycle import State
from electric_sdk.testing import TestServer

from .dashboard_app import CHROMIUM, HERE, NODE, NPM, ROOT, Voila, ensure_playwright

ARTIFACTS = ROOT / ".artifacts"
BROWSER_TIMEOUT_S = 180  # a kernel start and the notebook's cell, then the whole path
DRIVEN = "probe/b1"

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)"
    ),
    pytest.mark.skipif(
        NODE is None or NPM is None, reason="Node.js/npm not found (playwright-core runs on Node)"
    ),
]


@pytest.fixture(scope="module")
def playwright() -> Path:
    ensure_playwright()
    return HERE / "dashboard.mjs"


@pytest.fixture
def leases() -> Leases:
    """10 s leases instead of 0.6 s. The worker's thread shares this process with the drivers of
    Chromium and Voilà: under load its heartbeats came late enough for a 0.6 s lease to lapse
    mid-path (the page then showed what a lost lease does, not the path), and nothing here needs
    a lease to expire quickly."""
    return Leases(ttl_ms=10_000, heartbeat_ms=1_000)


@pytest.fixture
def fleet(electric: TestServer) -> Iterator[ThreadedWorker]:
    """probe entities running, paused, stopped and killed on a worker (its own thread), and
    entities of a type no worker hosts, waiting in spawning."""
    with ThreadedWorker(electric.address, idle_timeout="10m", grace_period="30s") as worker:
        client = electric.client()
        for name in ("b1", "b2", "b3", "s1", "k1"):
            client.spawn(f"probe/{name}")
        for name in ("n1", "n2"):
            client.spawn(f"nobody/{name}")
        for name in ("b1", "b2", "b3", "s1", "k1"):
            client.wait_for_state(f"probe/{name}", State.RUNNING, timeout=TIMEOUT_S)
        client.pause("probe/b3")
        client.terminate("probe/s1")
        client.wait_for_state("probe/s1", State.STOPPED, timeout=TIMEOUT_S)
        client.kill("probe/k1")
        worker.hold_cleanups()  # DRIVEN's stop lasts until the test lets it end
        yield worker


@pytest.fixture
def dashboard(electric: TestServer, fleet: ThreadedWorker) -> Iterator[Voila]:
    env = {**os.environ, "ELECTRIC_ADDRESS": electric.address}
    for name in ("ELECTRIC_TOKEN", "ELECTRIC_ENTITY"):
        env.pop(name, None)
    voila = Voila(env)
    try:
        voila.wait_ready(TIMEOUT_S * 3)
        yield voila
    finally:
        voila.stop()


def lines_of(stream: IO[str]) -> queue.Queue[str | None]:
    """The stream's lines as they come, then None at its end."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def test_the_path_a_person_takes(
    electric: TestServer,
    fleet: ThreadedWorker,
    dashboard: Voila,
    playwright: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    assert NODE is not None
    client = electric.client()
    script = subprocess.Popen(
        [NODE, str(playwright), dashboard.url, str(ARTIFACTS)],
        env={**os.environ, "CHROMIUM": str(CHROMIUM)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert script.stdout is not None
    assert script.stderr is not None
    said, errors = lines_of(script.stdout), lines_of(script.stderr)
    transcript: list[str] = []
    deadline = time.monotonic() + BROWSER_TIMEOUT_S

    def answer() -> None:
        assert script.stdin is not None  # a pipe: asked for above
        script.stdin.write("go\n")
        script.stdin.flush()

    async def run_held() -> None:
        with anyio.fail_after(TIMEOUT_S):
            await fleet.probe.entered.wait()

    try:
        while (line := said.get(timeout=max(0.0, deadline - time.monotonic()))) is not None:
            transcript.append(line)
            if line == "need run":
                client.send(DRIVEN, "hold")
                fleet.portal.call(run_held)  # its step is open: a run is in progress
                answer()
            elif line == "countdown seen":
                fleet.release_cleanups()
                answer()
        returncode = script.wait(TIMEOUT_S)
        stderr = []
        while (err := errors.get(timeout=TIMEOUT_S)) is not None:
            stderr.append(err)
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
        for pipe in (script.stdin, script.stdout, script.stderr):
            if pipe is not None:
                pipe.close()
    report = "\n".join([*transcript, *stderr, "--- voila ---", "".join(dashboard.lines)])
    assert returncode == 0, report
    assert transcript[-1].startswith("dashboard: fleet → filtered → opened → interrupted"), report

    screenshots = [
        Path(line.removeprefix("screenshot ")) for line in transcript if line.startswith("screenshot ")
    ]
    assert [p.name for p in screenshots] == [
        "dashboard-01-fleet.png",
        "dashboard-02-filtered.png",
        "dashboard-03-opened.png",
        "dashboard-04-interrupted.png",
        "dashboard-05-stopping.png",
        "dashboard-06-stopped.png",
        "dashboard-07-final-shown.png",
    ]
    assert all(p.stat().st_size > 0 for p in screenshots)
    with capsys.disabled():
        print("\nscreenshots of the dashboard, step by step:", *screenshots, sep="\n  ")

    # The clicks reached the server: SIGINT aborted the run, SIGTERM stopped it after the cleanup.
    events = client.events(DRIVEN, limit=500).events
    signals = [e.value["signal"] for e in events if e.type == "signal" and e.operation == "insert"]
    assert signals == ["SIGINT", "SIGTERM"]
    assert any(e.type == "run" and e.value["status"] == "aborted" for e in events)
    assert client.get(DRIVEN).state is State.STOPPED
