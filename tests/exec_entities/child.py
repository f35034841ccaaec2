"""A process for exec-entity tests: says what happens to it, does what its flags say.

It prints ``ready pid=N`` once its handlers are installed, ``got LINE`` for each stdin line, and
``signal NAME`` for each signal it catches (and appends the same to ``--log``, when given: a
process whose stdout nobody reads any more still leaves evidence there).

--on-term exit|ignore|replace   SIGTERM: exit 0 / keep running / fork a replacement, then exit
--on-eof exit|ignore            stdin closed
--exit-after SECONDS            exit 0 on its own after that long

Lines on stdin: ``exit N`` exits with N; ``stray`` forks a process into the same group that exits
0 on SIGTERM and dies of SIGINT, and then says ``stray pid=N``.
"""

import argparse
import contextlib
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--on-term", default="exit")
parser.add_argument("--on-eof", default="exit")
parser.add_argument("--log")
parser.add_argument("--exit-after", type=float)
args = parser.parse_args()


def say(text: str) -> None:
    with contextlib.suppress(BrokenPipeError):  # nobody reads its stdout any more (its worker died)
        print(text, flush=True)
    if args.log:
        with open(args.log, "a") as f:
            f.write(f"{os.getpid()} {text}\n")


CAUGHT = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)


def replacement() -> None:
    """The 'replacement generation': same process group, ignores SIGTERM, logs what it gets.

    It is forked with the caught signals blocked (``on_signal``) and unblocks them once its own
    handlers are in: a SIGTERM sent to the group meanwhile waits for them, instead of running the
    old generation's handler in the replacement (which would fork yet another one)."""
    for sig in CAUGHT:
        signal.signal(sig, lambda s, _f: say(f"replacement signal {signal.Signals(s).name}"))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, CAUGHT)
    say(f"replacement pid={os.getpid()}")
    while True:
        time.sleep(3600)


def stray() -> None:
    """A process the generation leaves behind in its group."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the pipe is the generation's
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, lambda s, _f: (say("stray signal SIGTERM"), os._exit(0)))
    while True:
        time.sleep(3600)


def on_signal(signum: int, _frame: object) -> None:
    name = signal.Signals(signum).name
    say(f"signal {name}")
    if signum == signal.SIGTERM:
        if args.on_term == "exit":
            sys.exit(0)
        if args.on_term == "replace":
            signal.pthread_sigmask(signal.SIG_BLOCK, CAUGHT)  # until the replacement's handlers are in
            if os.fork() == 0:
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the pipe is the old generation's
                replacement()
            os._exit(0)


for sig in CAUGHT:
    signal.signal(sig, on_signal)
if args.exit_after is not None:
    signal.signal(signal.SIGALRM, lambda *_: sys.exit(0))
    signal.setitimer(signal.ITIMER_REAL, args.exit_after)
say(f"ready pid={os.getpid()}")
while True:
    line = sys.stdin.readline()
    if not line:
        say("eof")
        if args.on_eof == "exit":
            sys.exit(0)
        while True:
            time.sleep(3600)
    line = line.rstrip("\n")
    say(f"got {line}")
    if line == '{"control": "shutdown"}':
        sys.exit(0)
    if line.startswith("exit "):
        sys.exit(int(line.split()[1]))
    if line == "stray":
        if (pid := os.fork()) == 0:
            stray()
        say(f"stray pid={pid}")
