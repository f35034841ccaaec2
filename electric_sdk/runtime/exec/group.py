"""A generation's process group: who is left in it once its leader has exited, and its orphans.

A generation is its whole process group (as systemd's ``KillMode=control-group``
is a unit's cgroup): a process the leader forked stays in the group unless it
moves itself out (``setsid``, ``setpgid``), and it is stopped with the rest.
The group is named by the leader's PID, which the runtime keeps unreaped until
the group is empty, so the number cannot name another group meanwhile.

The worker is a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process whose
parent exits is re-parented to the worker rather than to PID 1, so it stays
visible to the worker, and when it dies its PID stays taken (a zombie) until
the worker reaps it, by its PID only, never with ``waitpid(-1)``, which could
take a child someone else in the worker is waiting for.

No event says that a group became empty: ``/proc`` is read again, at growing
intervals (``POLL_FIRST_S`` up to ``POLL_MAX_S``), while the runtime waits for it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os

from .evidence import ProcStat, proc_stat

__all__ = ["POLL_FIRST_S", "POLL_MAX_S", "become_subreaper", "left_in_group"]

log = logging.getLogger("electric.runtime.exec")

PR_SET_CHILD_SUBREAPER = 36  # include/uapi/linux/prctl.h
# How often a group is looked at while the runtime waits for it to empty.
POLL_FIRST_S = 0.005
POLL_MAX_S = 0.1


@functools.cache
def become_subreaper() -> bool:
    """Make this process a child subreaper (once); False where the platform refuses it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
            return True
        reason = os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as exc:  # no libc with prctl: not Linux
        reason = str(exc)
    log.warning("cannot become a child subreaper (%s): orphans of exec processes go to PID 1", reason)
    return False


def left_in_group(pgrp: int, leader: int) -> list[ProcStat]:
    """The live processes of group ``pgrp`` besides its ``leader``; the group's orphans that died
    since (this worker's zombies, as subreaper) are reaped on the way, each by its PID.

    Only call it while the group's number is pinned (its leader unreaped, or a pidfd of it held):
    otherwise the number may name another group."""
    left: list[ProcStat] = []
    me = os.getpid()
    names: list[str] = []
    with contextlib.suppress(OSError):
        names = os.listdir("/proc")
    for name in names:
        if not name.isdigit() or int(name) == leader:
            continue
        stat = proc_stat(int(name))
        if stat is None or stat.pgrp != pgrp:
            continue
        if not stat.exited:
            left.append(stat)
        elif stat.ppid == me:  # an orphan of the group, re-parented to us: ours to reap
            with contextlib.suppress(ChildProcessError):
                os.waitpid(stat.pid, os.WNOHANG)
    return left
