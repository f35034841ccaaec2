"""The exec launcher: ``python -I -S launcher.py WORKER_PID -- COMMAND...``.

Run by path with the worker's own interpreter, between the fork and the
command: it sets the parent-death signal (SIGKILL), checks that its parent is
still the worker, and then executes the command in its place (same PID, same
start time: the generation's evidence is the launcher's). So an exec process
dies with its worker without any external binary, and without a
``preexec_fn``, which is unsafe in a process with threads (the worker has
gRPC's).

The check closes the race the signal alone leaves: a worker that died after
the fork but before the ``prctl`` would never send the signal; the launcher
then finds another parent (init, or a subreaper) and kills itself, as the
signal would have. It imports nothing of electric (it runs with ``-S``, so
it starts in milliseconds) and is not imported by it.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # include/uapi/linux/prctl.h
USAGE = 2
NOT_EXECUTED = 127  # as a shell says of a command it cannot run


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--" or not argv[1].isdigit():
        sys.stderr.write("usage: launcher.py WORKER_PID -- COMMAND [ARG...]\n")
        sys.exit(USAGE)
    worker, command = int(argv[1]), argv[3:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        error = ctypes.get_errno()
        sys.stderr.write(f"electric launcher: cannot set the parent-death signal: {os.strerror(error)}\n")
        sys.exit(NOT_EXECUTED)
    if os.getppid() != worker:  # the worker died before the prctl: its signal will never come
        os.kill(os.getpid(), signal.SIGKILL)
    # The interpreter ignores these at its start, and an ignored signal stays ignored across exec.
    for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"electric launcher: cannot execute {command[0]!r}: {exc.strerror}\n")
        sys.exit(NOT_EXECUTED)


if __name__ == "__main__":
    main(sys.argv)
