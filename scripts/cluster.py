"""`make cluster`: three `electric server` replicas on one PostgreSQL database and one worker.

    python scripts/cluster.py                     # replicas on 7701-7703 (HTTP 7781-7783)
    python scripts/cluster.py --ports 0           # any free ports (tests)
    ELECTRIC_DATABASE_URL=postgresql://... make cluster

The database (default ``postgresql://postgres@127.0.0.1:5432/electric``) is
created if absent. Each replica is ``electric server --database URL`` (it
keeps nothing on local disk, so all of them run from this directory); the
worker is ``electric worker`` hosting the example agents and exec tasks, as
``make run`` does, given every replica's address.
Each child's output is passed on, prefixed with its name.

Ctrl-C (SIGINT) or SIGTERM stops them all: each child gets one SIGTERM (it
drains), and whatever still runs after ``STOP_GRACE_S`` gets SIGKILL. The
children run in sessions of their own, so the terminal's Ctrl-C reaches the
launcher alone (a second signal to a child would end its drain), and each
is asked by the kernel to end (SIGTERM) should the launcher itself die
without stopping them: no child outlives it. A child that exits on its own
stops the rest, and the launcher exits with its code.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

DEFAULT_DATABASE = "postgresql://postgres@127.0.0.1:5432/electric"
REPO = Path(__file__).resolve().parents[1]
ELECTRIC = [sys.executable, "-m", "electric_sdk.cli.main"]
STOP_GRACE_S = 20.0
START_TIMEOUT_S = 60.0
_PR_SET_PDEATHSIG = 1


def _load_prctl() -> object | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: Ctrl-C on the launcher still stops them
        return None


# Resolved before any fork: the child then only calls it (no import, no lock, no allocation to speak of).
_PRCTL: Any = _load_prctl()


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends SIGTERM when the launcher dies (Linux)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Child:
    """One process, its output passed on line by line with its name, and what it announced."""

    def __init__(self, name: str, args: list[str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(  # its pid is announced (below), so a test can check it ended
            args,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 (it only calls prctl, resolved before the fork)
        )
        print(f"cluster: {name} started, pid {self.proc.pid}", flush=True)
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self._reader = threading.Thread(target=self._read, name=f"{name}-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            print(f"[{self.name}] {line}", end="", flush=True)
            with self._seen:
                self.lines.append(line)
                self._seen.notify_all()
        with self._seen:
            self.lines.append("")  # the end of its output
            self._seen.notify_all()

    def wait_for(self, pattern: str, timeout: float = START_TIMEOUT_S) -> re.Match[str] | None:
        """The first line matching ``pattern``; None if the child's output ended first."""
        deadline = time.monotonic() + timeout
        checked = 0
        with self._seen:
            while True:
                for line in self.lines[checked:]:
                    if line == "":
                        return None
                    if match := re.search(pattern, line):
                        return match
                checked = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.name} did not say {pattern!r} within {timeout:g} s")
                self._seen.wait(left)

    def why_it_ended(self) -> str:
        text = [line.rstrip() for line in self.lines if line.strip()]
        return text[-1] if text else "(no output)"


def ensure_database(url: str) -> None:
    """Create the URL's database if absent, from the server's maintenance database."""
    import asyncpg

    name = urllib.parse.urlsplit(url).path.lstrip("/")

    async def create() -> None:
        try:
            conn = await asyncpg.connect(url, timeout=10)
        except asyncpg.exceptions.InvalidCatalogNameError:
            parts = urllib.parse.urlsplit(url)
            admin = await asyncpg.connect(
                urllib.parse.urlunsplit(parts._replace(path="/postgres")), timeout=10
            )
            try:
                await admin.execute(f'CREATE DATABASE "{name}"')
                print(f"cluster: created the database {name}", flush=True)
            except asyncpg.exceptions.DuplicateDatabaseError:
                pass
            finally:
                await admin.close()
        else:
            await conn.close()

    asyncio.run(create())


def stop(children: list[Child]) -> None:
    """One SIGTERM each (they drain), then SIGKILL for what outlives the grace."""
    for child in children:
        if child.proc.poll() is None:
            child.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for child in children:
        try:
            child.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"cluster: {child.name} did not stop within {STOP_GRACE_S:g} s: killed", flush=True)
            child.proc.kill()
            child.proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--database", default=os.environ.get("ELECTRIC_DATABASE_URL") or DEFAULT_DATABASE)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument(
        "--ports", type=int, default=7701, help="the first replica's gRPC port (0: any free ports)"
    )
    p.add_argument("--http-ports", type=int, default=7781, help="the first replica's HTTP port")
    p.add_argument("--app", default="examples.agents:app")
    p.add_argument("--exec", dest="exec_file", default="examples/tasks.toml")
    p.add_argument("--no-worker", action="store_true")
    args = p.parse_args(argv)

    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    ensure_database(args.database)

    children: list[Child] = []
    try:
        addresses, doors = [], []
        for n in range(args.replicas):
            grpc_port = args.ports + n if args.ports else 0
            http_port = args.http_ports + n if args.ports else 0
            child = Child(
                f"replica-{n + 1}",
                [
                    *ELECTRIC,
                    "server",
                    "--database",
                    args.database,
                    "--listen",
                    f"127.0.0.1:{grpc_port}",
                    "--http",
                    f"127.0.0.1:{http_port}",
                ],
            )
            children.append(child)
            listening = child.wait_for(r"electric server listening on (\S+)")
            http = child.wait_for(r"electric http listening on (\S+)") if listening else None
            if listening is None or http is None:
                code = child.proc.wait()
                print(
                    f"cluster: {child.name} did not start (exit {code}): {child.why_it_ended()}", flush=True
                )
                return code or 1
            addresses.append(listening.group(1))
            doors.append(http.group(1))
        every = ",".join(addresses)
        if not args.no_worker:
            worker = Child(
                "worker", [*ELECTRIC, "--address", every, "worker", args.app, "--exec", args.exec_file]
            )
            children.append(worker)
            if worker.wait_for(r"electric worker \S+ connecting") is None:
                code = worker.proc.wait()
                print(f"cluster: the worker did not start (exit {code}): {worker.why_it_ended()}", flush=True)
                return code or 1
        print(_banner(args.database, addresses, doors, children), flush=True)
        while not stopping.is_set():
            ended = [c for c in children if c.proc.poll() is not None]
            if ended:
                print(
                    f"cluster: {ended[0].name} exited ({ended[0].proc.returncode}): stopping the rest",
                    flush=True,
                )
                return ended[0].proc.returncode or 1
            stopping.wait(0.2)
        print("cluster: stopping (each process drains)", flush=True)
        return 0
    finally:
        stop(children)
        print("cluster: stopped", flush=True)


def _banner(database: str, addresses: list[str], doors: list[str], children: list[Child]) -> str:
    from electric_server.store.database_url import redacted

    every = ",".join(addresses)
    env = f"ELECTRIC_ADDRESS={every}"
    lines = [
        f"cluster ready: {len(addresses)} replicas on {redacted(database)}",
        *(
            f"  replica-{n + 1}: grpc {a}  http {d}"
            for n, (a, d) in enumerate(zip(addresses, doors, strict=True))
        ),
        f"  pids: {' '.join(str(c.proc.pid) for c in children)}",
        "  try, in another terminal (.venv/bin/electric from a checkout):",
        f"    electric --address {addresses[0]} spawn chat/c1                  # through one replica",
        f"    electric --address {addresses[-1]} get chat/c1                   # seen through another",
        f"    {env} electric send chat/c1 'hello'          # calls spread over every replica",
        f"    {env} electric signal chat/c1 SIGUSR --payload '{{\"focus\": 1}}'",
        f"    {env} electric watch",
        f"    curl {doors[0]}/readyz",
        "  stop: Ctrl-C stops every process (each drains)",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
