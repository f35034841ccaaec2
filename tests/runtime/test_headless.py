"""`electric run`: headless runs as real processes, and their own signals (seed 004).

A real server (TestServer, in this process) and a real `electric worker` process host
the entity types of headless_app.py, whose held steps wait for a file the test creates.
Every `electric run` is a subprocess whose stdout is a pipe; the tests synchronize on
its output (the run's own NDJSON records, its stderr notes), never on sleeps. A bound on
a wait (WAIT_S) is only there to fail a broken test instead of hanging it.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from electric_sdk import Client, Event, errors
from electric_sdk.cli import exit_codes
from electric_sdk.cli.run_cmd import SCHEMA
from electric_sdk.testing import TestServer

ROOT = Path(__file__).resolve().parents[2]
ELECTRIC = [sys.executable, "-m", "electric_sdk.cli.main"]
APP = "tests.runtime.headless_app"
WAIT_S = 30.0
# Far longer than any wait in these tests: an exit well within WAIT_S was not the grace's doing,
# and a run that is interrupted has all the time it needs to be recorded aborted.
LONG_GRACE = "120s"
# Nothing listens on port 1 of the loopback.
NO_SERVER = "127.0.0.1:1"


# -- processes ------------------------------------------------------------------------------------


class Lines:
    """A pipe read line by line on a thread, so that every wait on it is bounded."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.seen.append(line)
            self._queue.put(line)
        self._queue.put(None)

    def until(self, wanted: Callable[[str], bool], timeout: float = WAIT_S) -> str:
        """The next line for which ``wanted`` is true (the lines before it are skipped)."""
        while True:
            try:
                line = self._queue.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"timed out; so far:\n{''.join(self.seen)}") from None
            if line is None:
                raise AssertionError(f"the stream ended; it had:\n{''.join(self.seen)}")
            if wanted(line):
                return line

    def all(self) -> list[str]:
        """Every line, once the stream has ended."""
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "the stream did not end"
        return list(self.seen)


class Proc:
    def __init__(self, args: list[str], stdin: int | None = subprocess.DEVNULL) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTRIC_")}
        self.popen = subprocess.Popen(
            args,
            cwd=ROOT,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "PYTHONUNBUFFERED": "1"},
        )
        assert self.popen.stdout is not None
        assert self.popen.stderr is not None
        self.out = Lines(self.popen.stdout)
        self.err = Lines(self.popen.stderr)

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def wait(self, timeout: float = WAIT_S) -> int:
        return self.popen.wait(timeout)

    def records(self) -> list[dict[str, Any]]:
        """Every stdout line as JSON (each must be one complete JSON value)."""
        return [json.loads(line) for line in self.out.all()]

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(WAIT_S)
        for stream in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture(scope="module")
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestServer]:
    with TestServer(tmp_path_factory.mktemp("headless") / "data") as s:
        yield s


def start_worker(procs: list[Proc], address: str, app: str = "app") -> Proc:
    worker = Proc([*ELECTRIC, "--address", address, "worker", f"{APP}:{app}", "--grace", "5s"])
    procs.append(worker)
    worker.out.until(lambda line: "connecting to" in line)
    return worker


def stop_worker(worker: Proc) -> None:
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


@pytest.fixture(scope="module")
def worker(server: TestServer, procs: list[Proc]) -> Iterator[Proc]:
    """One worker hosting `headless` for the whole module; `headless_late` stays unhosted."""
    proc = start_worker(procs, server.address)
    yield proc
    stop_worker(proc)


@pytest.fixture(scope="module")
def sdk(server: TestServer) -> Client:
    return server.client()


def run(procs: list[Proc], address: str, *args: str, stdin: int | None = subprocess.DEVNULL) -> Proc:
    proc = Proc([*ELECTRIC, "--address", address, "run", *args], stdin=stdin)
    procs.append(proc)
    return proc


def run_held(procs: list[Proc], address: str, ref: str, gate: Path, *args: str) -> Proc:
    """`electric run --json` of a message whose step waits for ``gate``, with a long grace."""
    return run(procs, address, ref, "--message", f"hold {gate}", "--json", "--grace", LONG_GRACE, *args)


@contextlib.contextmanager
def stopped(proc: Proc) -> Iterator[None]:
    """``proc`` stopped by SIGSTOP (as Ctrl-Z does) for the block, then continued: a stopped
    worker neither ends its runs nor hears an interrupt until then."""
    proc.signal(signal.SIGSTOP)
    try:
        os.waitpid(proc.popen.pid, os.WUNTRACED)  # returns once it has stopped (it is our child)
        yield
    finally:
        proc.signal(signal.SIGCONT)


# -- what the tests look for ----------------------------------------------------------------------


def record_is(type_: str, **value: Any) -> Callable[[str], bool]:
    """A stdout line whose record has this type and, in its ``value``, these fields."""

    def match(line: str) -> bool:
        record = json.loads(line)
        inner = record.get("value", {})
        return record["type"] == type_ and all(inner.get(k) == v for k, v in value.items())

    return match


STARTED = record_is("run", status="started")


def wait_run_end(sdk: Client, ref: str, message_key: str, from_offset: int) -> Event:
    """The record that ends the message's run, read through the SDK (another client's view)."""
    for event in sdk.watch(ref, from_offset):
        if (
            event.type == "run"
            and event.value["message_key"] == message_key
            and event.value["status"] in ("completed", "failed", "aborted")
        ):
            return event
    raise AssertionError("the stream ended before the run did")


def wait_run_started(sdk: Client, ref: str, message_key: str, from_offset: int) -> None:
    for event in sdk.watch(ref, from_offset):
        if event.type == "run" and (event.value["message_key"], event.value["status"]) == (
            message_key,
            "started",
        ):
            return
    raise AssertionError("the stream ended before the run started")


def terminal(records: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The last two records: ``error`` then ``session_complete``, both in the schema's version."""
    error, complete = records[-2], records[-1]
    assert (error["type"], complete["type"]) == ("error", "session_complete")
    assert error["version"] == complete["version"] == SCHEMA
    assert error["name"] == complete["status"]
    assert error["run_status"] == complete["run"]["status"]
    return error, complete


def run_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] == "run"]


def interrupted_before_its_run(procs: list[Proc], address: str, ref: str) -> list[dict[str, Any]]:
    """`electric run --json` of a message that cannot start yet, interrupted with SIGINT: its
    records, once it has exited 130 (within WAIT_S: far less than its grace) with `cancelled`."""
    cli = run(procs, address, ref, "--message", "mine", "--json", "--grace", LONG_GRACE)
    cli.out.until(record_is("session_start"))
    cli.signal(signal.SIGINT)
    assert cli.wait() == exit_codes.INTERRUPTED
    records = cli.records()
    error, complete = terminal(records)
    assert (error["name"], error["signal"], error["run_status"]) == ("interrupted", "SIGINT", "cancelled")
    assert complete["run"]["started"] is False
    return records


def settled_interrupt(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The run record of the command's message, written in its one interrupt's transaction: the
    interrupt's outcome is final at once (`aborted`), and the message was cancelled unstarted."""
    interrupts = [r for r in records if r["type"] == "signal"]
    assert len(interrupts) == 1
    interrupt, cancelled = interrupts[0], run_records(records)[-1]
    assert (interrupt["value"]["signal"], interrupt["value"]["outcome"]) == ("SIGINT", "aborted")
    assert interrupt["headers"]["operation"] == "insert"
    assert cancelled["value"]["status"] == "aborted"
    assert cancelled["headers"]["txid"] == interrupt["headers"]["txid"]
    return cancelled


def statuses_of(sdk: Client, ref: str, message_key: str) -> list[str]:
    """Every run record of the message, read from the entity's stream (another client's view)."""
    events, offset = [], 0
    while True:
        page = sdk.events(ref, offset, limit=500)
        events.extend(page.events)
        if not page.events:
            break
        offset = page.next_offset
    return [e.value["status"] for e in events if e.type == "run" and e.value["message_key"] == message_key]


# -- a run to its end -----------------------------------------------------------------------------


def test_a_completed_run_prints_its_events_then_session_complete(
    server: TestServer, worker: Proc, procs: list[Proc]
) -> None:
    cli = run(procs, server.address, "headless/done", "--spawn", "--message", "hello", "--json")
    assert cli.wait() == exit_codes.OK
    records = cli.records()
    assert all("type" in r for r in records)
    start, complete = records[0], records[-1]
    assert start["type"] == "session_start"
    assert (start["version"], start["url"], start["spawned"]) == (SCHEMA, "/headless/done", True)
    key = start["message_key"]
    assert records[1]["type"] == "message"
    assert (records[1]["key"], records[1]["value"]["text"]) == (key, "hello")
    runs = run_records(records)
    assert [r["value"]["status"] for r in runs] == ["started", "step", "completed"]
    assert all(r["value"]["message_key"] == key for r in runs)
    assert any(r["type"] == "progress" for r in records)  # a custom event written during the run
    assert complete["type"] == "session_complete"
    assert (complete["version"], complete["status"], complete["exit_code"]) == (SCHEMA, "completed", 0)
    assert complete["run"]["status"] == "completed"
    assert complete["run"]["output"].startswith("echo hello pid=")
    assert not any(r["type"] == "error" for r in records)
    assert cli.err.all() == []


def test_for_people_the_output_goes_to_stdout_and_the_progress_to_stderr(
    server: TestServer, worker: Proc, procs: list[Proc]
) -> None:
    cli = run(procs, server.address, "headless/people", "--spawn", "--message", "-", stdin=subprocess.PIPE)
    assert cli.popen.stdin is not None
    cli.popen.stdin.write("read from stdin")
    cli.popen.stdin.close()
    assert cli.wait() == 0
    assert re.fullmatch(r"echo read from stdin pid=\d+\n", "".join(cli.out.all()))
    progress = "".join(cli.err.all())
    assert "/headless/people: message msg_" in progress
    assert re.search(r"run +run_msg_\d+ +msg_\d+ completed", progress)


# -- the first signal -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signum", "code", "name"),
    [
        (signal.SIGINT, exit_codes.INTERRUPTED, "interrupted"),
        (signal.SIGTERM, exit_codes.TERMINATED, "terminated"),
    ],
)
def test_the_first_signal_aborts_its_own_run_and_nothing_else(
    server: TestServer,
    worker: Proc,
    procs: list[Proc],
    sdk: Client,
    tmp_path: Path,
    signum: int,
    code: int,
    name: str,
) -> None:
    ref = f"headless/first-{name}"
    sdk.spawn(ref)
    # --timeout is set (and long): a signal is still never reported as a timeout.
    cli = run_held(procs, server.address, ref, tmp_path / "never", "--timeout", "1h")
    cli.out.until(STARTED)
    other = sdk.send(ref, "another client's")  # queued behind the CLI's run
    cli.signal(signum)
    assert cli.wait() == code
    records = cli.records()
    error, complete = terminal(records)
    assert (error["name"], error["signal"], error["run_status"]) == (
        name,
        signal.Signals(signum).name,
        "aborted",
    )
    assert (complete["exit_code"], complete["run"]["started"]) == (code, True)
    assert complete["run"]["output"].startswith("partial pid=")
    # The run's own events come first, its ABORTED record last of them; the other message is not there.
    runs = run_records(records)
    assert runs[-1]["value"]["status"] == "aborted"
    assert records.index(runs[-1]) < len(records) - 2
    assert {r["value"]["message_key"] for r in runs} == {complete["message_key"]}
    interrupt = next(r for r in records if r["type"] == "signal")
    assert (interrupt["value"]["signal"], interrupt["value"]["message_key"]) == (
        "SIGINT",
        complete["message_key"],
    )
    # The other client's message runs to completion on the same entity, which keeps running.
    end = wait_run_end(sdk, ref, other.key, other.offset)
    assert end.value["status"] == "completed"
    assert end.value["output"].startswith("echo another client's")
    assert sdk.get(ref).state.value == "running"
    assert f"received {signal.Signals(signum).name}" in "".join(cli.err.all())


def test_an_interrupt_cancels_its_queued_message_not_the_run_in_progress(
    server: TestServer, worker: Proc, procs: list[Proc], sdk: Client, tmp_path: Path
) -> None:
    ref, gate = "headless/queued", tmp_path / "gate"
    sdk.spawn(ref)
    held = sdk.send(ref, f"hold {gate}")  # another client's run, in progress while the CLI's message queues
    wait_run_started(sdk, ref, held.key, held.offset)
    interrupted_before_its_run(procs, server.address, ref)
    gate.touch()
    end = wait_run_end(sdk, ref, held.key, held.offset)
    assert end.value["status"] == "completed"
    assert end.value["output"].endswith(" done")


def test_an_interrupt_before_any_worker_cancels_the_message_at_once(
    server: TestServer, procs: list[Proc], sdk: Client
) -> None:
    """No worker hosts the entity: the server cancels the message in the scoped SIGINT's own
    transaction (no run of it can start meanwhile), and a worker that comes later never runs it."""
    ref = "headless_late/late"
    sdk.spawn(ref)
    records = interrupted_before_its_run(procs, server.address, ref)
    assert settled_interrupt(records)["value"]["error"] == "cancelled before it started"
    late = start_worker(procs, server.address, "late_app")
    after = sdk.send(ref, "after")
    assert wait_run_end(sdk, ref, after.key, after.offset).value["status"] == "completed"
    assert statuses_of(sdk, ref, records[-1]["message_key"]) == ["aborted"]
    stop_worker(late)


def test_an_interrupt_cancels_a_message_queued_while_paused_at_once(
    server: TestServer, worker: Proc, procs: list[Proc], sdk: Client
) -> None:
    """A paused entity delivers no message: the interrupt cancels the CLI's at once (it does not
    wait, pending, for SIGCONT), and after SIGCONT the message is skipped."""
    ref = "headless/paused"
    sdk.spawn(ref)
    sdk.wait_for_state(ref, "running", timeout=WAIT_S)  # the worker took it up
    sdk.signal(ref, "SIGSTOP")
    records = interrupted_before_its_run(procs, server.address, ref)
    assert records[0]["state"] == "paused"  # session_start: the entity's state when it was sent
    settled_interrupt(records)
    sdk.signal(ref, "SIGCONT")
    after = sdk.send(ref, "after")
    end = wait_run_end(sdk, ref, after.key, after.offset)
    assert end.value["status"] == "completed"
    assert statuses_of(sdk, ref, records[-1]["message_key"]) == ["aborted"]  # it never ran
    assert sdk.get(ref).state.value == "running"


def test_a_cancelled_message_never_runs_on_the_next_worker(
    server: TestServer, procs: list[Proc], sdk: Client, tmp_path: Path
) -> None:
    """A message cancelled while another ran stays cancelled for the worker that takes the entity
    up next (the record keeps it, not the worker that had it queued)."""
    ref, gate = "headless_late/next-worker", tmp_path / "gate"
    first = start_worker(procs, server.address, "late_app")
    sdk.spawn(ref)
    held = sdk.send(ref, f"hold {gate}")
    wait_run_started(sdk, ref, held.key, held.offset)
    mine = interrupted_before_its_run(procs, server.address, ref)[-1]["message_key"]
    gate.touch()
    assert wait_run_end(sdk, ref, held.key, held.offset).value["status"] == "completed"
    stop_worker(first)  # drained: the entity's lease goes back, to be offered to the next worker
    second = start_worker(procs, server.address, "late_app")
    after = sdk.send(ref, "after")
    assert wait_run_end(sdk, ref, after.key, after.offset).value["status"] == "completed"
    assert statuses_of(sdk, ref, mine) == ["aborted"]
    stop_worker(second)


# -- a second signal, the grace, --timeout --------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [(signal.SIGINT, signal.SIGINT), (signal.SIGTERM, signal.SIGTERM), (signal.SIGINT, signal.SIGTERM)],
)
def test_a_second_signal_exits_at_once(
    server: TestServer, worker: Proc, procs: list[Proc], sdk: Client, tmp_path: Path, first: int, second: int
) -> None:
    ref = f"headless/second-{int(first)}-{int(second)}"
    sdk.spawn(ref)
    cli = run_held(procs, server.address, ref, tmp_path / "never")
    cli.out.until(STARTED)
    with stopped(worker):  # the interrupt cannot end the run
        cli.signal(first)
        cli.err.until(lambda line: f"received {signal.Signals(first).name}" in line)
        cli.signal(second)
        assert cli.wait() == 128 + second  # within WAIT_S, far less than the grace
    records = cli.records()  # every line complete JSON, and no terminal records: nothing more was said
    assert records[0]["type"] == "session_start"
    assert not any(r["type"] in ("error", "session_complete") for r in records)


def test_when_the_grace_runs_out_the_run_is_unknown(
    server: TestServer, worker: Proc, procs: list[Proc], sdk: Client, tmp_path: Path
) -> None:
    ref = "headless/grace"
    sdk.spawn(ref)
    cli = run_held(procs, server.address, ref, tmp_path / "never", "--grace", "200ms")
    cli.out.until(STARTED)
    with stopped(worker):  # the interrupt cannot end the run
        cli.signal(signal.SIGTERM)
        assert cli.wait() == exit_codes.TERMINATED
    error, complete = terminal(cli.records())
    assert (error["name"], error["run_status"]) == ("terminated", "unknown")
    assert "not seen within the grace" in error["message"]
    assert complete["exit_code"] == exit_codes.TERMINATED


def test_timeout_exits_124_and_interrupts_the_run(
    server: TestServer, worker: Proc, procs: list[Proc], sdk: Client, tmp_path: Path
) -> None:
    ref = "headless/timeout"
    sdk.spawn(ref)
    cli = run_held(procs, server.address, ref, tmp_path / "never", "--timeout", "300ms")
    assert cli.wait() == exit_codes.TIMEOUT == 124
    error, complete = terminal(cli.records())
    assert (error["name"], error["code"], error["signal"]) == ("timeout", "TIMEOUT", None)
    # Interrupted wherever the timeout found it: started (aborted) or still queued (cancelled).
    assert error["run_status"] in ("aborted", "cancelled")
    assert complete["exit_code"] == 124


def test_a_signal_after_the_timeout_is_reported_as_the_signal(
    server: TestServer, worker: Proc, procs: list[Proc], sdk: Client, tmp_path: Path
) -> None:
    """--timeout fires while the run goes on (its worker is stopped); a SIGTERM during the
    timeout's grace takes over (the interrupt is already under way); then the run is aborted."""
    ref = "headless/timeout-then-term"
    sdk.spawn(ref)
    cli = run_held(procs, server.address, ref, tmp_path / "never", "--timeout", "200ms")
    start = json.loads(cli.out.until(record_is("session_start")))
    with contextlib.ExitStack() as worker_stopped:
        # The command is stopped until its run has started and its worker is stopped, so that the
        # timeout finds the run started and the interrupt cannot end it.
        with stopped(cli):
            wait_run_started(sdk, ref, start["message_key"], start["message_offset"])
            worker_stopped.enter_context(stopped(worker))
        cli.err.until(lambda line: "--timeout 200ms expired" in line)
        cli.signal(signal.SIGTERM)
        cli.err.until(lambda line: "received SIGTERM" in line)
    assert cli.wait() == exit_codes.TERMINATED
    records = cli.records()
    error, _ = terminal(records)
    assert (error["name"], error["signal"], error["run_status"]) == ("terminated", "SIGTERM", "aborted")
    assert "after --timeout had expired" in error["message"]
    assert not any(r.get("name") == "timeout" or r.get("status") == "timeout" for r in records)


# -- signal dispositions --------------------------------------------------------------------------

DISPOSITIONS = r"""
import json, os, signal, sys
from electric_sdk.cli.main import main


def custom(signum, frame):
    print("custom handler ran", flush=True)


def snapshot():
    # The kernel's view of SIGINT and SIGTERM (gRPC's C core adds handlers of its own for
    # other signals when it starts, which are none of the command's business).
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    ours = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    return {
        "sigint_is_custom": signal.getsignal(signal.SIGINT) is custom,
        "sigterm": str(signal.getsignal(signal.SIGTERM)),
        "caught": int(status["SigCgt"], 16) & ours,
        "ignored": int(status["SigIgn"], 16) & ours,
        "wakeup_fd": wakeup,
    }


signal.signal(signal.SIGINT, custom)
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # whatever this process inherited
print("before " + json.dumps(snapshot()), flush=True)
code = main(["--address", sys.argv[1], "run", sys.argv[2], "--message", sys.argv[3], "--json"])
print("after " + json.dumps(snapshot()), flush=True)
os.kill(os.getpid(), signal.SIGINT)  # reaches the script's own handler again
print(f"exit {code}", flush=True)
"""


def _caught(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigCgt")


def test_the_handlers_exist_only_around_the_run(
    server: TestServer, worker: Proc, procs: list[Proc], sdk: Client, tmp_path: Path
) -> None:
    ref, gate = "headless/dispositions", tmp_path / "gate"
    sdk.spawn(ref)
    script = Proc([sys.executable, "-c", DISPOSITIONS, server.address, ref, f"hold {gate}"])
    procs.append(script)
    before = json.loads(script.out.until(lambda line: line.startswith("before "))[7:])
    term_bit = 1 << (signal.SIGTERM - 1)
    assert before["sigterm"] == str(signal.SIG_DFL)
    assert not before["caught"] & term_bit
    script.out.until(STARTED)
    assert _caught(script.popen.pid) & term_bit  # during the run: SIGTERM is the command's
    gate.touch()
    after = json.loads(script.out.until(lambda line: line.startswith("after "))[6:])
    assert after == before
    script.out.until(lambda line: line == "custom handler ran\n")
    assert script.out.until(lambda line: line.startswith("exit ")) == "exit 0\n"
    assert script.wait() == 0


# -- how else a run ends --------------------------------------------------------------------------


def test_an_entity_that_does_not_exist_is_not_created_without_spawn(
    server: TestServer, procs: list[Proc], sdk: Client
) -> None:
    cli = run(procs, server.address, "headless/nobody", "--message", "hi", "--json")
    assert cli.wait() == exit_codes.NOT_FOUND
    records = cli.records()
    assert len(records) == 2
    error, complete = terminal(records)
    assert (error["name"], error["code"], error["run_status"]) == (
        "entity_not_found",
        "ENTITY_NOT_FOUND",
        "not_sent",
    )
    assert complete["message_key"] is None
    assert "add --spawn" in "".join(cli.err.all())
    with pytest.raises(errors.EntityNotFound):
        sdk.get("headless/nobody")


def test_a_failed_run_has_its_own_exit_code(server: TestServer, worker: Proc, procs: list[Proc]) -> None:
    cli = run(procs, server.address, "headless/fails", "--spawn", "--message", "fail", "--json")
    assert cli.wait() == exit_codes.RUN_FAILED
    error, complete = terminal(cli.records())
    assert (error["name"], error["run_status"]) == ("run_failed", "failed")
    assert "asked to fail" in complete["run"]["error"]


@pytest.mark.parametrize("how", ["kill", "terminate"])
def test_an_entity_stopped_mid_run(
    server: TestServer, worker: Proc, procs: list[Proc], sdk: Client, tmp_path: Path, how: str
) -> None:
    ref, gate = f"headless/stopped-{how}", tmp_path / "gate"
    sdk.spawn(ref)
    cli = run_held(procs, server.address, ref, gate)
    cli.out.until(STARTED)
    if how == "kill":
        sdk.kill(ref, reason="test")
    else:
        sdk.terminate(ref, reason="test")
        cli.out.until(record_is("state", state="stopping"))
        gate.touch()  # the step ends: the run stops at that boundary
    assert cli.wait() == exit_codes.RUN_ABORTED
    error, complete = terminal(cli.records())
    assert (error["name"], error["run_status"]) == ("entity_stopped", "aborted")
    assert complete["entity_state"] in ("stopping", "stopped", "killed")


def test_a_stopped_entity_takes_no_message(server: TestServer, procs: list[Proc], sdk: Client) -> None:
    sdk.spawn("headless_late/gone")
    sdk.kill("headless_late/gone")
    cli = run(procs, server.address, "headless_late/gone", "--message", "hi", "--json")
    assert cli.wait() == exit_codes.PRECONDITION
    error, _ = terminal(cli.records())
    assert (error["name"], error["run_status"]) == ("entity_terminal", "not_sent")


def test_an_unreachable_server(procs: list[Proc]) -> None:
    cli = run(procs, NO_SERVER, "headless/x", "--message", "hi", "--json", "--call-timeout", "500ms")
    assert cli.wait() == exit_codes.UNAVAILABLE
    error, complete = terminal(cli.records())
    # Refused at once, or, on a loaded machine, the 500 ms deadline passes first while retrying:
    # both are "the server did not answer", one exit code (docs/cli.md).
    assert error["name"] in ("unavailable", "deadline_exceeded")
    assert complete["exit_code"] == exit_codes.UNAVAILABLE


@pytest.mark.parametrize(
    ("args", "code"),
    [(("--json",), "EMPTY_MESSAGE"), (("-m", "hi", "--grace", "soon", "--json"), "INVALID_DURATION")],
)
def test_bad_arguments_exit_2_before_anything_is_sent(
    procs: list[Proc], args: tuple[str, ...], code: str
) -> None:
    cli = run(procs, NO_SERVER, "headless/x", *args)
    assert cli.wait() == exit_codes.USAGE
    error, _ = terminal(cli.records())
    assert error["code"] == code


# -- the exit-code table --------------------------------------------------------------------------


def test_docs_carry_the_exit_code_table_of_the_module() -> None:
    docs = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert exit_codes.render_into(docs) == docs, "run `python -m electric_sdk.cli.exit_codes docs/cli.md`"
    assert exit_codes.markdown_table() in docs
    codes = {v for k, v in vars(exit_codes).items() if k.isupper() and isinstance(v, int)}
    assert codes == set(exit_codes.MEANINGS)
    help_text = " ".join(
        subprocess.run([*ELECTRIC, "--help"], capture_output=True, text=True, check=True).stdout.split()
    )
    assert exit_codes.SUMMARY in help_text
