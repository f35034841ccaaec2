"""`electric run`'s interrupt waits for a stage and prints it (issue 48, "Staged receipts").

Ctrl-C (SIGINT) or SIGTERM to a real `electric run` process interrupts its run with a scoped
entity SIGINT; the command waits for that SIGINT's ``--stop-wait`` stage (``unwound`` by
default), prints each stage reached or not (``stop_stages`` with ``--json``; for people, as
`electric signal --wait` does, on stderr) and exits 130 or 143. The same real server, worker
process and entity types as test_headless.py; every wait is on the processes' output.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from electric_sdk import Client
from electric_sdk.cli import exit_codes
from electric_sdk.cli.run_cmd import SCHEMA
from electric_sdk.testing import TestServer

from .test_headless import (
    NO_SERVER,
    STARTED,
    Proc,
    record_is,
    run,
    run_held,
    run_records,
    start_worker,
    stop_worker,
    stopped,
    terminal,
)


@pytest.fixture(scope="module")
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestServer]:
    with TestServer(tmp_path_factory.mktemp("headless-stages") / "data") as s:
        yield s


@pytest.fixture(scope="module")
def worker(server: TestServer, procs: list[Proc]) -> Iterator[Proc]:
    proc = start_worker(procs, server.address)
    yield proc
    stop_worker(proc)


@pytest.fixture(scope="module")
def sdk(server: TestServer) -> Client:
    return server.client()


def stop_stages(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The one interrupt's ``stop_stages`` record, just before ``error`` and ``session_complete``."""
    found = [r for r in records if r["type"] == "stop_stages"]
    assert len(found) == 1, found
    assert records.index(found[0]) == len(records) - 3
    assert found[0]["version"] == SCHEMA
    return found[0]


def stages(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["stage"]: s for s in record["signal"]["stages"]}


@pytest.mark.parametrize(
    ("signum", "code", "wait"),
    [
        (signal.SIGINT, exit_codes.INTERRUPTED, None),  # the default: unwound
        (signal.SIGTERM, exit_codes.TERMINATED, "downstream"),
    ],
)
def test_the_interrupt_waits_for_its_stage_and_prints_each(
    server: TestServer,
    worker: Proc,
    procs: list[Proc],
    sdk: Client,
    tmp_path: Path,
    signum: int,
    code: int,
    wait: str | None,
) -> None:
    ref = f"headless/stages-{int(signum)}"
    sdk.spawn(ref)
    extra = ("--stop-wait", wait) if wait else ()
    cli = run_held(procs, server.address, ref, tmp_path / "never", *extra)
    cli.out.until(STARTED)
    cli.signal(signum)
    assert cli.wait() == code
    records = cli.records()
    error, complete = terminal(records)
    assert error["run_status"] == "aborted"
    receipt = stop_stages(records)
    expected = wait or "unwound"
    assert (receipt["wait"], receipt["reached"]) == (expected, True)
    signal_record = next(r for r in records if r["type"] == "signal")
    assert (receipt["signal"]["signal"], receipt["signal"]["key"]) == ("SIGINT", signal_record["key"])
    by_stage = stages(receipt)
    assert by_stage["accepted"]["offset"] == signal_record["offset"]
    aborted = run_records(records)[-1]
    assert aborted["value"]["status"] == "aborted"
    # unwound is the aborted run's own record: the stage is read from the stream, not inferred.
    assert (by_stage["unwound"]["reached"], by_stage["unwound"]["offset"]) == (True, aborted["offset"])
    # A run with no MCP call or child in flight reaches downstream with unwound, waited for or not.
    assert (by_stage["downstream"]["reached"], by_stage["downstream"]["offset"]) == (True, aborted["offset"])
    assert "no MCP call" in by_stage["downstream"]["detail"]
    assert complete["stop"] == {"wait": expected, "reached": True, "signal_key": signal_record["key"]}


def test_for_people_the_stages_go_to_stderr(
    server: TestServer, worker: Proc, procs: list[Proc], sdk: Client, tmp_path: Path
) -> None:
    ref = "headless/stages-people"
    sdk.spawn(ref)
    cli = run(procs, server.address, ref, "--message", f"hold {tmp_path / 'never'}", "--grace", "120s")
    cli.err.until(lambda line: re.search(r"run +run_msg_\d+ +msg_\d+ started", line) is not None)
    cli.signal(signal.SIGINT)
    assert cli.wait() == exit_codes.INTERRUPTED
    err = "".join(cli.err.all())
    assert re.search(r"/headless/stages-people: SIGINT running → running \(aborted, txid \d+\)", err), err
    assert re.search(r"\n  accepted +reached at offset \d+ \(", err), err
    assert re.search(r"\n  unwound +reached at offset \d+ \(", err), err
    assert re.search(r"\n  downstream +reached at offset \d+ .*: no MCP call.* in flight", err), err
    assert "electric: INTERRUPTED: interrupted by SIGINT: the run was aborted" in err
    assert "".join(cli.out.all()).startswith("partial pid=")  # stdout: the run's partial output


def test_stop_wait_accepted_leaves_once_the_interrupt_is_committed(
    server: TestServer, worker: Proc, procs: list[Proc], sdk: Client, tmp_path: Path
) -> None:
    """The worker is stopped, so the run cannot end: with ``accepted`` the command does not wait
    for it (well within its two-minute grace), and says the run's end was not waited for."""
    ref = "headless/stages-accepted"
    sdk.spawn(ref)
    cli = run_held(procs, server.address, ref, tmp_path / "never", "--stop-wait", "accepted")
    cli.out.until(STARTED)
    with stopped(worker):
        cli.signal(signal.SIGINT)
        assert cli.wait() == exit_codes.INTERRUPTED
    records = cli.records()
    error, complete = terminal(records)
    assert error["run_status"] == "started"
    assert "the run's end was not waited for" in error["message"]
    receipt = stop_stages(records)
    assert (receipt["wait"], receipt["reached"]) == ("accepted", True)
    by_stage = stages(receipt)
    assert by_stage["accepted"]["reached"] is True
    assert by_stage["unwound"]["detail"] == by_stage["downstream"]["detail"] == "not waited for"
    assert complete["stop"]["reached"] is True


def test_a_stage_not_reached_within_the_grace_says_so(
    server: TestServer, worker: Proc, procs: list[Proc], sdk: Client, tmp_path: Path
) -> None:
    ref = "headless/stages-grace"
    sdk.spawn(ref)
    cli = run_held(procs, server.address, ref, tmp_path / "never", "--grace", "300ms")
    cli.out.until(STARTED)
    with stopped(worker):  # the interrupt cannot end the run
        cli.signal(signal.SIGTERM)
        cli.out.until(record_is("signal", signal="SIGINT"))  # the interrupt was accepted
        assert cli.wait() == exit_codes.TERMINATED
    records = cli.records()
    error, complete = terminal(records)
    assert error["run_status"] == "unknown"
    receipt = stop_stages(records)
    assert (receipt["wait"], receipt["reached"]) == ("unwound", False)
    by_stage = stages(receipt)
    assert by_stage["accepted"]["reached"] is True
    assert by_stage["unwound"]["detail"] == "not reached within --grace 300ms"
    assert complete["stop"]["reached"] is False


def test_a_completed_run_prints_no_stages(server: TestServer, worker: Proc, procs: list[Proc]) -> None:
    cli = run(procs, server.address, "headless/stages-none", "--spawn", "--message", "hi", "--json")
    assert cli.wait() == exit_codes.OK
    records = cli.records()
    assert not any(r["type"] == "stop_stages" for r in records)
    assert records[-1]["stop"] is None


@pytest.mark.parametrize("stage", ["reaped", "terminal", "handled", "soon"])
def test_a_stage_the_interrupt_does_not_have_is_refused(procs: list[Proc], stage: str) -> None:
    cli = run(procs, NO_SERVER, "headless/x", "--message", "hi", "--stop-wait", stage)
    assert cli.wait() == exit_codes.USAGE
    err = "".join(cli.err.all())
    assert "--stop-wait" in err
    assert "accepted, unwound, downstream" in err or "'accepted', 'unwound', 'downstream'" in err
