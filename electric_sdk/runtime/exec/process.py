"""One generation of an exec entity's process, and the two backends that act on it.

Both backends start the child with ``subprocess.Popen`` (never asyncio's
subprocess API: its child watcher reaps children behind our back), in its own
process group, dying with the thread that started it (the parent-death
signal, set by ``setpriv`` just before the command is executed). The child is
reaped only by ``reap()``, which the host calls once it has stopped acting on
the generation; until then the PID cannot be reused, and ``recheck()`` proves
the generation before every action.

- ``posix``: a pidfd taken right after the spawn; actions through
  ``pidfd_send_signal`` (group actions with PIDFD_SIGNAL_PROCESS_GROUP, else
  ``killpg`` while the leader is unreaped); exit seen with
  ``waitid(P_PIDFD, …, WEXITED | WNOWAIT)``, because signalling a zombie
  still succeeds.
- ``portable``: what a platform without POSIX signals offers: graceful is
  closing stdin or the shutdown line on stdin, force is the platform's
  terminate on the process handle (the unreaped child); exit is seen by a
  thread blocked in a wait on the handle, as on Windows.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import shutil
import signal
import subprocess
from abc import ABC, abstractmethod
from typing import IO

import anyio
import anyio.to_thread

from .evidence import Evidence, boot_id, observe, start_time
from .spec import SHUTDOWN_LINE, SIGNUMS, ExecSpec

__all__ = ["Child", "PortableChild", "PosixChild", "describe_status", "spawn"]

log = logging.getLogger("electric.runtime.exec")

# include/uapi/linux/pidfd.h; Linux 6.9 and newer.
PIDFD_SIGNAL_PROCESS_GROUP = 1 << 2


def describe_status(status: int | None) -> str:
    if status is None:
        return "status unknown (reaped outside the runtime, or never seen)"
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


def _status(result: os.waitid_result) -> int:
    return int(result.si_status) if result.si_code == os.CLD_EXITED else -int(result.si_status)


class Child(ABC):
    """A started generation. Subclasses say how to wait for it and how to act on it."""

    backend = ""

    def __init__(self, popen: subprocess.Popen[bytes], evidence: Evidence) -> None:
        self.popen = popen
        self.evidence = evidence
        self.frozen = False
        self.exited = anyio.Event()
        self.status: int | None = None
        self.reaped = False
        # Reaped by someone else: it is gone, but nothing says how, and nothing proves it any more.
        self.lost = False
        self.stdin: IO[bytes] | None = popen.stdin
        if self.stdin is not None:
            os.set_blocking(self.stdin.fileno(), False)  # a process that stops reading must not block us

    @property
    def pid(self) -> int:
        return self.popen.pid

    # -- observing ----------------------------------------------------------------------------

    @abstractmethod
    def _peek(self) -> os.waitid_result | None:
        """The exit, if it happened, without reaping (WNOWAIT)."""

    def exit_status(self) -> int | None:
        """The exit status once the generation exited (never reaps); ChildProcessError if it was
        reaped by someone else, which leaves nothing to prove it by."""
        if self.status is None:
            try:
                result = self._peek()
            except ChildProcessError:
                self.lost = True
                self.exited.set()
                raise
            if result is not None and result.si_pid:
                self.status = _status(result)
                self.exited.set()
        return self.status

    def gone(self) -> bool:
        """Exited (or reaped behind our back): no action may name it any more."""
        try:
            return self.exit_status() is not None
        except ChildProcessError:
            return True

    def recheck(self) -> str | None:
        """None when this generation is proved to be alive and ours; else the doubt, in words."""
        try:
            status = self.exit_status()
        except ChildProcessError:
            return f"{self.evidence.describe()} was reaped outside the runtime: nothing proves it any more"
        if status is not None:
            return f"{self.evidence.describe()} has exited ({describe_status(status)})"
        return observe(self.evidence)

    @abstractmethod
    async def watch(self) -> None:
        """Set ``exited`` when the generation exits."""

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
        """Collect the exited child: after this its PID may name another process.
        None when someone else reaped it (its status is unknown)."""
        if not self.lost:
            self.popen.wait()  # a zombie by now: returns at once
        else:
            self.popen.returncode = -1  # so Popen never waits for it again
        self.reaped = True
        self.close()
        return self.status

    def close(self) -> None:
        self.close_stdin()
        for stream in (self.popen.stdout, self.popen.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class PosixChild(Child):
    backend = "posix"

    def __init__(self, popen: subprocess.Popen[bytes], evidence: Evidence) -> None:
        super().__init__(popen, evidence)
        self.pidfd = os.pidfd_open(popen.pid)
        self._group_flag = True

    def _peek(self) -> os.waitid_result | None:
        return os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOWAIT | os.WNOHANG)

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
                self._group_flag = False  # an older kernel: killpg, safe while the leader is unreaped
        if group:
            os.killpg(self.pid, signum)
        else:
            signal.pidfd_send_signal(self.pidfd, signum)

    def close(self) -> None:
        super().close()
        with contextlib.suppress(OSError):
            os.close(self.pidfd)


class PortableChild(Child):
    backend = "portable"

    def _peek(self) -> os.waitid_result | None:
        return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)

    async def watch(self) -> None:
        # A thread blocked on the handle, as WaitForSingleObject would be; WNOWAIT leaves it unreaped.
        pid = self.pid
        with contextlib.suppress(ChildProcessError):
            await anyio.to_thread.run_sync(
                lambda: os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT), abandon_on_cancel=True
            )
        self.gone()

    def _signal(self, action: str, *, group: bool) -> None:
        if action != "terminate":
            raise OSError(errno.ENOTSUP, f"the portable backend has no {action}")
        self.popen.kill()  # TerminateProcess on the handle; on POSIX the unreaped child's pid


@functools.cache
def _launcher() -> tuple[str, ...]:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        log.warning("setpriv (util-linux) is not on PATH: exec processes will not die with their worker")
        return ()
    return (setpriv, "--pdeathsig", "KILL", "--")


def spawn(spec: ExecSpec, task_id: str, generation: int, worker_id: str, cwd: str | None) -> Child:
    """Start a generation. Call it from the event loop's thread: the parent-death signal fires
    when the thread that forked the child ends, and the loop's thread lives as long as the worker."""
    env = {**os.environ, **spec.env}
    argv = spec.argv
    # Checked here because the launcher would only fail after the fork, as an exit status.
    program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
    if program is None or not os.access(os.path.join(cwd or ".", program), os.X_OK):
        raise FileNotFoundError(errno.ENOENT, "no such executable program", argv[0])
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
    kind = PosixChild if spec.backend == "posix" else PortableChild
    return kind(popen, evidence)
