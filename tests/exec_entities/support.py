"""Helpers for the exec tests: the child command, and reading receipts and output."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from runtime.rt_support import running_worker, state_is, until

from electric_sdk import AsyncClient, Event
from electric_sdk.runtime import App
from electric_sdk.runtime.exec import ActionPlan

CHILD = str(Path(__file__).with_name("child.py"))


def child(*flags: str) -> list[str]:
    return [sys.executable, "-u", CHILD, *flags]


def receipt(action: str, disposition: str | None = None, name: str | None = None) -> Callable[[Event], bool]:
    def match(event: Event) -> bool:
        v = event.value
        return (
            event.type == "exec"
            and v["action"] == action
            and (disposition is None or v["disposition"] == disposition)
            and (name is None or v["action_name"] == name)
        )

    return match


def line(text: str) -> Callable[[Event], bool]:
    """An output chunk holding ``text`` as one of its lines."""

    def match(event: Event) -> bool:
        return event.type == "output" and any(
            ln == text or ln.startswith(text) for ln in event.value["text"].splitlines()
        )

    return match


async def ready(client: AsyncClient, ref: str) -> int:
    """Wait for the child's ``ready pid=N`` line; return N."""
    event = await until(client, ref, line("ready pid="))
    for ln in event.value["text"].splitlines():
        if ln.startswith("ready pid="):
            return int(ln.removeprefix("ready pid="))
    raise AssertionError("no pid")


async def events(client: AsyncClient, ref: str) -> list[Event]:
    page = await client.events(ref, 0, limit=1000)
    return list(page.events)


async def receipts(client: AsyncClient, ref: str) -> list[dict[str, Any]]:
    return [e.value for e in await events(client, ref) if e.type == "exec"]


async def output(client: AsyncClient, ref: str) -> list[str]:
    return [
        ln for e in await events(client, ref) if e.type == "output" for ln in e.value["text"].splitlines()
    ]


async def exited(pid: int) -> None:
    """Until ``pid`` has exited (its pidfd turns readable, whoever its parent is)."""
    pidfd = os.pidfd_open(pid)
    try:
        with anyio.fail_after(10):
            await anyio.wait_readable(pidfd)
    finally:
        os.close(pidfd)


def alive(pid: int) -> bool:
    """Running: a zombie is not (a process whose worker died may wait as one, unreaped, in a test
    process that hosted a worker: a worker is a child subreaper)."""
    return proc_state(pid) not in ("", "Z", "X")


def proc_state(pid: int) -> str:
    """Field 3 of /proc/<pid>/stat: R, S, T (stopped), Z, ... ('' when gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""
    return stat[stat.rfind(b")") + 2 :].split()[0].decode()


def logged(path: Path, pid: int) -> list[str]:
    """What process ``pid`` wrote to its --log file."""
    if not path.exists():
        return []
    return [ln.split(" ", 1)[1] for ln in path.read_text().splitlines() if ln.split(" ", 1)[0] == str(pid)]


def exit_before(action: str, signum: int = signal.SIGKILL) -> Callable[[ActionPlan], None]:
    """An action hook: the generation exits (killed with ``signum``, left unreaped) between planning
    ``action`` and issuing it."""

    def hook(plan: ActionPlan) -> None:
        if plan.action == action:
            os.kill(plan.evidence.pid, signum)
            os.waitid(os.P_PID, plan.evidence.pid, os.WEXITED | os.WNOWAIT)

    return hook


async def spawn_and_stop(client: AsyncClient, address: str, app: App, ref: str) -> list[dict[str, Any]]:
    """Host ``app``, spawn ``ref``, wait for its process, SIGTERM it, wait for `stopped`; its receipts."""
    async with running_worker(app, address):
        await client.spawn(ref)
        await ready(client, ref)
        await client.signal(ref, "SIGTERM")
        await until(client, ref, state_is("stopped", "cleanup_complete"))
    return await receipts(client, ref)
