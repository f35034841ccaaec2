"""PID 1 of a fresh PID namespace (``unshare --pid --fork --mount-proc``), driven by a test.

One JSON request per stdin line, one JSON answer per stdout line:
  {"op": "spawn", "argv": [...], "log": PATH}  -> {"pid": N}      (pid as seen in the namespace)
  {"op": "last_pid", "value": N}               -> {}              (/proc/sys/kernel/ns_last_pid)
  {"op": "kill", "pid": N, "sig": S}           -> {}
  {"op": "gone", "pid": N}                     -> {}              (after N is dead and reaped)
  {"op": "exited", "pid": N}                   -> {"state": S}    (after N exited: "Z" unreaped, "" reaped)
  {"op": "alive", "pid": N}                    -> {"alive": bool}
  {"op": "ps"}                                 -> {"procs": [{"pid", "ppid", "pgrp", "state", "argv"}]}
As the namespace's init it reaps every orphan (an exec child whose worker died lands here).
"""

import json
import os
import signal
import subprocess
import sys
import time

reaped: dict[int, int] = {}


def reap(*_: object) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        reaped[pid] = status


signal.signal(signal.SIGCHLD, reap)


def answer(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


for raw in sys.stdin:
    req = json.loads(raw)
    op = req["op"]
    if op == "spawn":
        log = open(req["log"], "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(req["argv"], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        answer({"pid": proc.pid})
    elif op == "last_pid":
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(req["value"]))
        answer({})
    elif op == "kill":
        os.kill(req["pid"], req["sig"])
        answer({})
    elif op == "gone":
        # Polled: the pid is no child of this process (a worker's), so there is nothing to wait
        # on but /proc; a 5 ms step, bounded by the 30 s deadline, is the test's resolution.
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{req['pid']}") and time.monotonic() < deadline:
            time.sleep(0.005)
            reap()
        answer({"gone": not os.path.exists(f"/proc/{req['pid']}")})
    elif op == "exited":
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{req['pid']}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0].decode()
            except OSError:
                state = ""
            if state in ("", "Z", "X"):
                break
            time.sleep(0.005)
        answer({"state": state})
    elif op == "alive":
        answer({"alive": os.path.exists(f"/proc/{req['pid']}")})
    elif op == "ps":
        reap()
        procs = []
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    argv = [a.decode() for a in f.read().split(b"\0") if a]
            except OSError:
                continue  # gone meanwhile
            rest = stat[stat.rfind(b")") + 2 :].split()
            procs.append(
                {
                    "pid": int(name),
                    "ppid": int(rest[1]),
                    "pgrp": int(rest[2]),
                    "state": rest[0].decode(),
                    "argv": argv,
                }
            )
        answer({"procs": procs})
