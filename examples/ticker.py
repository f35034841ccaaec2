"""An exec entity's process (examples/tasks.toml): prints a tick a second, echoes each stdin
line, and on SIGTERM finishes its current tick, says goodbye and exits — before the policy's
timeout, so no force is needed. `stubborn` in tasks.toml runs it with --stubborn, which ignores
SIGTERM: its receipts show the escalation to SIGKILL."""

import signal
import sys
import threading

stop = threading.Event()
stubborn = "--stubborn" in sys.argv


def on_term(_signum: int, _frame: object) -> None:
    print("SIGTERM: " + ("ignored" if stubborn else "finishing up"), flush=True)
    if not stubborn:
        stop.set()


def echo() -> None:
    for line in sys.stdin:
        print(f"got: {line.rstrip()}", flush=True)


signal.signal(signal.SIGTERM, on_term)
threading.Thread(target=echo, daemon=True).start()
tick = 0
while not stop.wait(1.0):
    tick += 1
    print(f"tick {tick}", flush=True)
print("bye", flush=True)
