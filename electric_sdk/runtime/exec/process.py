"""One generation of an exec entity's process, and the two backends that act on it.

Both backends start the child with ``subprocess.Popen`` (never asyncio's
subprocess API: its child watcher reaps children behind our back), in its own
process group, through the launcher (``launcher.py``), which sets the
parent-death signal so that the process dies with the thread that started it.
The child is reaped only by ``reap()``, which the host calls once it has
stopped acting on the generation; until then the PID cannot be reused, and
``recheck()`` proves the generation before every action.

- ``posix``: the generation is its whole process group (``group.py``): once
  the leader has exited, what is left of the group gets the shutdown policy,
  and the leader is reaped only when the group is empty, so the group's number
  stays ours. A pidfd is taken right after the spawn; actions go through
  ``pidfd_send_signal`` (group actions with PIDFD_SIGNAL_PROCESS_GROUP, else
  ``killpg`` while the leader is unreaped); exit is seen with
  ``waitid(P_PIDFD, …, WEXITED | WNOWAIT)``, because signalling a zombie
  still succeeds.
- ``portable``: what a platform without POSIX signals offers: graceful is
  closing stdin or the shutdown line on stdin, force is the platform's
  terminate on the process handle (the unreaped child); exit is seen by a
  thread blocked in a wait on the handle, as on Windows. It acts on the
  process only, not on its group.

``Adopted`` is a generation another worker started, proved alive with a pidfd
(``evidence.prove``) and taken over: signalled through that pidfd, never
reaped here (it is not this worker's child).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
from abc import ABC, abstractmethod
from datetime import datetime
from pathlib import Path
from typing import IO

import anyio
import anyio.to_thread

from .evidence import Evidence, ProcStat, boot_id, observe, start_time
from .group import POLL_FIRST_S, POLL_MAX_S, become_subreaper, left_in_group
from .spec import SHUTDOWN_LINE, SIGNUMS, ExecSpec

__all__ = ["Adopted", "Child", "PortableChild", "PosixChild", "describe_left", "describe_status", "spawn"]

log = logging.getLogger("electric.runtime.exec")

# include/uapi/linux/pidfd.h; Linux 6.9 and newer.
PIDFD_SIGNAL_PROCESS_GROUP = 1 << 2
LAUNCHER = str(Path(__file__).with_name("launcher.py"))


def describe_status(status: int | None) -> str:
    if status is None:
        return "status unknown (reaped outside the runtime, or never seen)"
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


def describe_left(left: list[ProcStat]) -> str:
    """``2 processes left in its group (pids 41, 43)``."""
    pids = ", ".join(str(p.pid) for p in left)
    if len(left) == 1:
        return f"1 process left in its group (pid {pids})"
    return f"{len(left)} processes left in its group (pids {pids})"


def _status(result: os.waitid_result) -> int:
    return int(result.si_status) if result.si_code == os.CLD_EXITED else -int(result.si_status)


class Child(ABC):
    """A generation: its leader (the process started, or taken over) and what it left in its group.
    Subclasses say how to wait for it and how to act on it."""

    backend = ""

    def __init__(self, evidence: Evidence, popen: subprocess.Popen[bytes] | None) -> None:
        self.popen = popen
        self.evidence = evidence
        self.frozen = False
        # The leader exited (or was reaped behind our back).
        self.exited = anyio.Event()
        self.status: int | None = None
        self.reaped = False
        # Its exit is recorded once (ExecHost._settle), by whoever saw it end first: set when done.
        self.settled: anyio.Event | None = None
        # The shutdown policy under way on it (Enforcer.shut_down), and why it began: one per
        # generation, so its graceful action is sent once. Set when that shutdown is over.
        self.shutting_down: tuple[anyio.Event, str] | None = None
        # A graceful action a worker before this one issued to it (taken over), as (its name, its
        # deadline): not sent again; its deadline stands.
        self.graceful_issued: tuple[str, datetime] | None = None
        # Reaped by someone else: it is gone, but nothing says how, and nothing proves it any more.
        self.lost = False
        # Its leader exited and its group was seen empty: over for good (nothing joins such a group
        # but on purpose), so the group is not looked at again.
        self._over = False
        self.stdin: IO[bytes] | None = popen.stdin if popen is not None else None
        if self.stdin is not None:
            os.set_blocking(self.stdin.fileno(), False)  # a process that stops reading must not block us

    @property
    def pid(self) -> int:
        return self.evidence.pid

    @property
    def adopted(self) -> bool:
        """Started by another worker and taken over: no pipes of ours, and its exit status is its parent's."""
        return self.popen is None

    # -- observing ----------------------------------------------------------------------------

    @abstractmethod
    def _peek(self) -> tuple[bool, int | None]:
        """Whether the leader exited, and its status when that is ours to know, without reaping."""

    def gone(self) -> bool:
        """The leader exited (or was reaped behind our back): no action may name it alone any more."""
        if not self.exited.is_set():
            try:
                exited, status = self._peek()
            except ChildProcessError:
                self.lost = True
                exited, status = True, None
            if exited:
                self.status = status
                self.exited.set()
        return self.exited.is_set()

    def leftovers(self) -> list[ProcStat]:
        """The live processes of the generation's group besides its leader; none for a backend that
        acts on the process only."""
        return []

    def done(self) -> bool:
        """The generation is over: its leader exited and nothing is left in its group."""
        if not self._over:
            self._over = self.gone() and not self.leftovers()
        return self._over

    def describe_exit(self) -> str:
        return describe_status(self.status)

    def recheck(self, *, group: bool = False) -> str | None:
        """None when this generation is proved to be alive and ours (for a group action: its leader,
        or the rest of its group while the leader pins the group's number); else the doubt, in words."""
        if not self.gone():
            return observe(self.evidence)
        if self.lost:
            return f"{self.evidence.describe()} was reaped outside the runtime: nothing proves it any more"
        if group and self.leftovers():
            return None
        return f"{self.evidence.describe()} has exited ({self.describe_exit()})"

    @abstractmethod
    async def watch(self) -> None:
        """Set ``exited`` when the leader exits."""

    async def wait_done(self) -> None:
        """Until the leader has exited (someone runs ``watch``) and its group is empty. No event says
        that a group emptied: it is looked at again, at growing intervals."""
        await self.exited.wait()
        pause = POLL_FIRST_S
        while not self.done():
            await anyio.sleep(pause)
            pause = min(pause * 2, POLL_MAX_S)

    # -- acting ---------------------------------------------------------------------------------

    def send(self, action: str, *, group: bool) -> None:
        """Issue ``action`` (after ``recheck`` said yes); OSError when the platform refused it."""
        if action == "stdin:close":
            self.close_stdin()
        elif action == "stdin:shutdown":
            self.write_line(SHUTDOWN_LINE)
        else:
            self._signal(action, group=group)

    @abstractmethod
    def _signal(self, action: str, *, group: bool) -> None:
        """A signal (or the platform's force) to the generation, or its whole group."""

    def _stdin_fd(self) -> int:
        if self.stdin is None or self.stdin.closed:
            raise BrokenPipeError(errno.EPIPE, "stdin is closed")
        return self.stdin.fileno()

    def write_line(self, line: str) -> None:
        """The shutdown line, now: BlockingIOError when the pipe is full (the process is not
        reading), BrokenPipeError when nobody reads it any more."""
        data = line.encode() + b"\n"
        if os.write(self._stdin_fd(), data) != len(data):
            raise BlockingIOError(errno.EAGAIN, "stdin is full: the process is not reading it")

    async def write(self, line: str) -> None:
        """A message's line; waits while the pipe is full (stdin is non-blocking)."""
        view = memoryview(line.encode() + b"\n")
        while view:
            try:
                view = view[os.write(self._stdin_fd(), view) :]
            except BlockingIOError:
                await anyio.wait_writable(self._stdin_fd())

    def close_stdin(self) -> None:
        if self.stdin is not None and not self.stdin.closed:
            with contextlib.suppress(OSError):
                self.stdin.close()

    def reap(self) -> int | None:
        """Collect the exited leader: after this its PID may name another process. None when its
        status is unknown (someone else reaped it, or it is not this worker's child)."""
        if self.popen is not None:
            if not self.lost:
                self.popen.wait()  # a zombie by now: returns at once (waitpid on its PID only)
            else:
                self.popen.returncode = -1  # so Popen never waits for it again
        self.reaped = True
        self.close()
        return self.status

    def close(self) -> None:
        self.close_stdin()
        for stream in (self.popen.stdout, self.popen.stderr) if self.popen is not None else ():
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class PosixChild(Child):
    backend = "posix"

    def __init__(
        self, evidence: Evidence, popen: subprocess.Popen[bytes] | None = None, pidfd: int | None = None
    ) -> None:
        super().__init__(evidence, popen)
        self.pidfd = pidfd if pidfd is not None else os.pidfd_open(evidence.pid)
        self._group_flag = True

    def _peek(self) -> tuple[bool, int | None]:
        result = os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        if result is None or not result.si_pid:
            return False, None
        return True, _status(result)

    def leftovers(self) -> list[ProcStat]:
        if self.lost or self.reaped:
            return []  # its leader was reaped: the group's number proves nothing any more
        return left_in_group(self.pid, self.pid)

    async def watch(self) -> None:
        # The pidfd turns readable when the process exits (not when it is reaped).
        while not self.gone():
            await anyio.wait_readable(self.pidfd)

    def _signal(self, action: str, *, group: bool) -> None:
        signum = SIGNUMS[action]
        if group and self._group_flag:
            try:
                signal.pidfd_send_signal(self.pidfd, signum, None, PIDFD_SIGNAL_PROCESS_GROUP)
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._group_flag = False  # an older kernel
        if group:
            self._killpg(signum)
        else:
            signal.pidfd_send_signal(self.pidfd, signum)

    def _killpg(self, signum: int) -> None:
        os.killpg(self.pid, signum)  # safe: the leader stays unreaped until its group is empty

    def close(self) -> None:
        super().close()
        with contextlib.suppress(OSError):
            os.close(self.pidfd)


class Adopted(PosixChild):
    """A generation another worker started, proved with a pidfd (``evidence.prove``) and taken over.

    It is not this worker's child: its exit is seen when the pidfd turns readable, its status goes
    to its parent, and it is never reaped here. Its group is reached through the pidfd only, which
    names the group the leader led even once the leader is gone; ``killpg`` (older kernels) could
    reach a later group with the same number, so it is refused."""

    def __init__(self, evidence: Evidence, pidfd: int) -> None:
        super().__init__(evidence, None, pidfd)

    def _peek(self) -> tuple[bool, int | None]:
        return bool(select.select([self.pidfd], [], [], 0)[0]), None

    def describe_exit(self) -> str:
        return "its exit status went to its parent: it is not this worker's child"

    def _killpg(self, signum: int) -> None:
        raise OSError(
            errno.ENOTSUP,
            "this kernel cannot signal a group through a pidfd (Linux 6.9 can), and the leader of a "
            "generation taken over is not this worker's to keep unreaped",
        )


class PortableChild(Child):
    backend = "portable"

    def _peek(self) -> tuple[bool, int | None]:
        result = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        if result is None or not result.si_pid:
            return False, None
        return True, _status(result)

    async def watch(self) -> None:
        # A thread blocked on the handle, as WaitForSingleObject would be; WNOWAIT leaves it unreaped.
        pid = self.pid
        with contextlib.suppress(ChildProcessError):
            await anyio.to_thread.run_sync(
                lambda: os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT), abandon_on_cancel=True
            )
        self.gone()

    def _signal(self, action: str, *, group: bool) -> None:
        if action != "terminate" or self.popen is None:
            raise OSError(errno.ENOTSUP, f"the portable backend has no {action}")
        self.popen.kill()  # TerminateProcess on the handle; on POSIX the unreaped child's pid


def _launcher() -> list[str]:
    """The launcher's command line, where the platform has a parent-death signal (Linux)."""
    if not sys.platform.startswith("linux"):
        _warn_once("this platform has no parent-death signal: exec processes may outlive their worker")
        return []
    if not sys.executable:
        raise FileNotFoundError(errno.ENOENT, "no Python interpreter to run the exec launcher with")
    return [sys.executable, "-I", "-S", LAUNCHER, str(os.getpid()), "--"]


@functools.cache
def _warn_once(text: str) -> None:
    log.warning("%s", text)


def spawn(spec: ExecSpec, task_id: str, generation: int, worker_id: str, cwd: str | None) -> Child:
    """Start a generation. Call it from the event loop's thread: the parent-death signal fires
    when the thread that forked the child ends, and the loop's thread lives as long as the worker."""
    env = {**os.environ, **spec.env}
    argv = spec.argv
    # Checked here because the launcher would only fail after the fork, as an exit status.
    program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
    if program is None or not os.access(os.path.join(cwd or ".", program), os.X_OK):
        raise FileNotFoundError(errno.ENOENT, "no such executable program", argv[0])
    if spec.backend == "posix":
        become_subreaper()  # what the generation leaves behind stays ours to observe and reap
    popen = subprocess.Popen(
        [*_launcher(), *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
        process_group=0,
        close_fds=True,
        bufsize=0,
    )
    started = start_time(popen.pid)  # readable until reaped, even as a zombie
    evidence = Evidence(task_id, generation, popen.pid, started or 0, boot_id(), worker_id)
    if spec.backend == "posix":
        return PosixChild(evidence, popen)
    return PortableChild(evidence, popen)
