"""`electric fork` and `electric retry` as a user runs them: their output, and their refusals'
messages and exit codes (exit_codes.py). No worker: a message cancelled before its run started
(a scoped SIGINT) has an `aborted` run, which `retry` may run again."""

from __future__ import annotations

import json

from test_cli import Run, cli, interruptible_children, kind  # noqa: F401 - fixtures

from electric_sdk import Client
from electric_sdk.cli import exit_codes


def _cancelled(sdk: Client, ref: str) -> str:
    """The key of a message of ``ref`` cancelled before its run started."""
    sdk.spawn(ref)
    key = sdk.send(ref, "first").key
    sdk.signal(ref, "SIGINT", message_key=key)
    return key


def test_fork_and_retry_commands(cli: Run, sdk: Client, kind: str) -> None:  # noqa: F811
    ref = f"{kind}/a"
    key = _cancelled(sdk, ref)

    forked = cli("--json", "fork", ref, "b", "--at", "2", "--reason", "the other plan")
    assert forked.returncode == 0, forked.stderr
    assert json.loads(forked.stdout)["state"] == "idle"
    events = sdk.events(f"{kind}/b", 2, 1).events
    assert events[0].type == "electric.fork"
    assert events[0].value["data"]["reason"] == "the other plan"
    human = cli("fork", ref, "c")
    assert human.returncode == 0, human.stderr
    assert f"/{kind}/c" in human.stdout

    retried = cli("--json", "retry", ref, key, "--reason", "again")
    assert retried.returncode == 0, retried.stderr
    receipt = json.loads(retried.stdout)
    assert (receipt["retry_of"], receipt["from_step"]) == (key, 0)
    human = cli("retry", ref, key)
    assert human.returncode == 0, human.stderr
    assert f"retry of {key} from step 0" in human.stdout


def test_their_refusals(cli: Run, sdk: Client, kind: str) -> None:  # noqa: F811
    ref = f"{kind}/a"
    key = _cancelled(sdk, ref)
    head = sdk.get(ref).head_offset

    not_a_number = cli("fork", ref, "b", "--at", "two")
    assert not_a_number.returncode == exit_codes.USAGE
    assert "must be a whole number" in not_a_number.stderr
    for at in ("-1", str(head + 1)):
        refused = cli("fork", ref, "b", "--at", at)
        assert refused.returncode == exit_codes.USAGE, refused.stderr
        assert "INVALID_OFFSET" in refused.stderr
    assert cli("retry", ref, key, "--from-step", "1").returncode == exit_codes.USAGE
    missing = cli("retry", ref, "msg_nope")
    assert missing.returncode == exit_codes.NOT_FOUND
    assert "RUN_NOT_FOUND" in missing.stderr
    assert sdk.get(ref).head_offset == head

    sdk.kill(ref)
    terminal = cli("retry", ref, key)
    assert terminal.returncode == exit_codes.PRECONDITION
    assert "fork it instead" in terminal.stderr
    assert cli("fork", ref, "b").returncode == 0
    assert cli("fork", ref, "b").returncode == exit_codes.EXISTS
