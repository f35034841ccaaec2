"""Send and wait for the run (issue 46, "One way to wait"): every door, every outcome.

A real server (TestServer in this process, on either store, with its HTTP door)
and a real `electric worker` process host headless_app.py's type, whose held
step waits for a file the test creates. The tests synchronize on the stream
(another client's watch) and on the files, never on sleeps; WAIT_S only bounds
a broken test.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from electric_sdk import Client, RunNotEnded, RunResult, Signal, errors
from electric_sdk.cli import exit_codes
from electric_sdk.testing import TestServer

from .test_headless import ELECTRIC, ROOT, WAIT_S, Proc, start_worker, stop_worker, wait_run_started

TYPE = "headless"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestServer]:
    url = None
    if request.param == "postgres":
        databases = request.getfixturevalue("postgres_databases")
        url = databases.clone()
    try:
        with TestServer(
            tmp_path_factory.mktemp("send-wait") / "data", http="127.0.0.1:0", database_url=url
        ) as s:
            yield s
    finally:
        if url is not None:
            databases.drop(url)


@pytest.fixture(scope="module")
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.close()


@pytest.fixture(scope="module")
def worker(server: TestServer, procs: list[Proc]) -> Iterator[Proc]:
    proc = start_worker(procs, server.address)
    yield proc
    stop_worker(proc)


@pytest.fixture(scope="module")
def sdk(server: TestServer) -> Client:
    return server.client()


_ids = iter(range(10_000))


@pytest.fixture
def ref(sdk: Client, worker: Proc) -> str:
    ref = f"{TYPE}/w{next(_ids)}"
    sdk.spawn(ref)
    sdk.wait_for_state(ref, "running", WAIT_S)  # its worker has it: the head moves only by our sends
    return ref


def in_thread(target: Any) -> tuple[threading.Thread, list[Any]]:
    """``target()`` on a thread of its own; its result (or exception) lands in the list."""
    answer: list[Any] = []

    def run() -> None:
        try:
            answer.append(target())
        except BaseException as exc:  # handed to the test, which raises it
            answer.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, answer


def joined(thread: threading.Thread, answer: list[Any]) -> Any:
    thread.join(WAIT_S)
    assert not thread.is_alive(), "the wait did not end"
    if isinstance(answer[0], BaseException):
        raise answer[0]
    return answer[0]


def message_offset(sdk: Client, ref: str, text: str) -> tuple[str, int]:
    """The key and offset of the message with this text, once it is in the stream."""
    for event in sdk.watch(ref, 0):
        if event.type == "message" and event.value["text"] == text:
            return event.key, event.offset
    raise AssertionError("the stream ended before the message came")


# -- the SDK --------------------------------------------------------------------------------------


def test_completed_with_its_output(sdk: Client, ref: str) -> None:
    result = sdk.send(ref, "hello", wait="run", timeout="30s")
    assert isinstance(result, RunResult)
    assert (result.status, result.ok, result.error) == ("completed", True, None)
    assert result.output is not None
    assert result.output.startswith("echo hello pid=")
    assert result.attempt == 1


def test_failed_with_its_error(sdk: Client, ref: str) -> None:
    result = sdk.send(ref, "fail", wait="run")
    assert result.status == "failed"
    assert result.error is not None
    assert "asked to fail" in result.error


def test_aborted_with_its_partial_output(sdk: Client, ref: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    thread, answer = in_thread(lambda: sdk.send(ref, f"hold {gate}", wait="run"))
    key, offset = message_offset(sdk, ref, f"hold {gate}")
    wait_run_started(sdk, ref, key, offset)
    sdk.interrupt(ref, reason="test")
    result = joined(thread, answer)
    assert (result.receipt.key, result.status) == (key, "aborted")
    assert result.output is not None
    assert result.output.startswith("partial pid=")


def test_cancelled_before_it_started(sdk: Client, ref: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    first = sdk.send(ref, f"hold {gate}")
    wait_run_started(sdk, ref, first.key, first.offset)
    thread, answer = in_thread(lambda: sdk.send(ref, "queued behind", wait="run"))
    key, _ = message_offset(sdk, ref, "queued behind")
    sdk.signal(ref, Signal.SIGINT, reason="test", message_key=key)
    result = joined(thread, answer)
    assert (result.status, result.receipt.key) == ("cancelled", key)
    gate.touch()
    assert sdk.send(ref, "after", wait="run").status == "completed"


def test_timeout_says_the_run_had_not_ended_and_the_message_stays(
    sdk: Client, ref: str, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    with pytest.raises(RunNotEnded) as caught:
        sdk.send(ref, f"hold {gate}", wait="run", timeout="300ms")
    error = caught.value
    assert isinstance(error, errors.DeadlineExceeded)
    assert error.code == "RUN_NOT_ENDED"
    assert error.run_status in ("queued", "started")
    # Still delivered: its run goes on, and completes once released.
    wait_run_started(sdk, ref, error.receipt.key, error.receipt.offset)
    gate.touch()
    for event in sdk.watch(ref, error.receipt.offset):
        mine = event.type == "run" and event.value["message_key"] == error.receipt.key
        if mine and event.value["status"] == "completed":
            break
    else:
        raise AssertionError("the stream ended before the run did")


def test_bad_wait_or_timeout_sends_nothing(sdk: Client, ref: str) -> None:
    head = sdk.get(ref).head_offset
    with pytest.raises(errors.InvalidArgument):
        sdk.send(ref, "x", wait="stopped", timeout="1s")  # type: ignore[call-overload]
    with pytest.raises(errors.InvalidArgument):
        sdk.send(ref, "x", timeout="1s")
    with pytest.raises(errors.InvalidArgument):
        sdk.send(ref, "x", wait="run", timeout="soon")
    assert sdk.get(ref).head_offset == head


# -- the CLI --------------------------------------------------------------------------------------


def cli(server: TestServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ELECTRIC, "--address", server.address, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )


def test_cli_send_wait_run(server: TestServer, ref: str, tmp_path: Path) -> None:
    done = cli(server, "send", ref, "hi", "--wait", "run", "--json")
    assert done.returncode == exit_codes.OK, done.stderr
    record = json.loads(done.stdout)
    assert (record["status"], record["ended"]) == ("completed", True)
    assert record["output"].startswith("echo hi pid=")

    failed = cli(server, "send", ref, "fail", "--wait", "run")
    assert failed.returncode == exit_codes.RUN_FAILED
    assert "run failed" in failed.stdout

    gate = tmp_path / "gate"
    late = cli(server, "send", ref, f"hold {gate}", "--wait", "run", "--timeout", "300ms", "--json")
    assert late.returncode == exit_codes.TIMEOUT, late.stderr
    record = json.loads(late.stdout)
    assert record["ended"] is False
    assert "RUN_NOT_ENDED" in late.stderr
    # --timeout 0 with --wait answers at once with how far the run got, as the SDK's timeout=0;
    # the call itself keeps its default deadline. Without --wait, 0 is no deadline: refused.
    now = cli(server, "send", ref, f"hold {gate}", "--wait", "run", "--timeout", "0", "--json")
    assert now.returncode == exit_codes.TIMEOUT, now.stderr
    assert json.loads(now.stdout)["ended"] is False
    refused = cli(server, "get", ref, "--timeout", "0ms")
    assert refused.returncode == exit_codes.USAGE, refused.stderr
    assert "--timeout must be more than 0" in refused.stderr
    gate.touch()


# -- HTTP -----------------------------------------------------------------------------------------


def test_http_send_wait_run(server: TestServer, sdk: Client, ref: str, tmp_path: Path) -> None:
    with httpx.Client(base_url=server.http_address, timeout=WAIT_S) as http:
        path = f"/{ref}/messages"
        answer = http.post(path, params={"wait": "run", "timeout": "30s"}, json={"text": "web"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        run = body["run"]
        assert (run["status"], run["ended"], run["message_key"]) == ("completed", True, body["key"])
        assert run["output"].startswith("echo web pid=")

        failed = http.post(path, params={"wait": "run"}, json={"text": "fail"}).json()["run"]
        assert failed["status"] == "failed"
        assert "asked to fail" in failed["error"]

        gate = tmp_path / "gate"
        late = http.post(path, params={"wait": "run", "timeout": "300ms"}, json={"text": f"hold {gate}"})
        assert late.status_code == 200
        late_body = late.json()
        assert late_body["run"]["ended"] is False
        assert late_body["run"]["status"] in ("queued", "started")
        # The same request with the same key resumes the wait, without a second message.
        key = {"Idempotency-Key": "resume-1"}
        first = http.post(path, params={"wait": "run", "timeout": "1ms"}, json={"text": "again"}, headers=key)
        gate.touch()
        again = http.post(path, params={"wait": "run"}, json={"text": "again"}, headers=key).json()
        assert again["key"] == first.json()["key"]
        assert again["run"]["status"] == "completed"

        head = sdk.get(ref).head_offset
        # (A timeout without wait is checked and unused, as the OpenAPI document allows it.)
        for params in (
            {"wait": "stopped"},
            {"wait": ""},
            {"timeout": "soon"},
            {"wait": "run", "timeout": "soon"},
        ):
            refused = http.post(path, params=params, json={"text": "x"})
            assert refused.status_code == 400, params
        assert sdk.get(ref).head_offset == head


def test_cli_send_wait_run_cancelled_exits_9(
    server: TestServer, sdk: Client, ref: str, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    first = sdk.send(ref, f"hold {gate}")
    wait_run_started(sdk, ref, first.key, first.offset)
    proc = subprocess.Popen(
        [*ELECTRIC, "--address", server.address, "send", ref, "behind", "--wait", "run", "--json"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        key, _ = message_offset(sdk, ref, "behind")
        sdk.signal(ref, Signal.SIGINT, reason="test", message_key=key)
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT_S)
    assert proc.returncode == exit_codes.RUN_ABORTED, err
    record = json.loads(out)
    assert (record["status"], record["ended"], record["receipt"]["key"]) == ("cancelled", True, key)
    gate.touch()
