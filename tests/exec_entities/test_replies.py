"""Exec replies (issue 46): a type that says how a message's reply is read from stdout has runs
that complete with that reply as their output, so `send --wait run` and `electric run` answer it.

Real processes (bc, and small Python programs), a real server on either store and a worker on
the test's loop; every wait is on the stream, never a sleep.
"""

from __future__ import annotations

import shutil
import sys

import anyio
import pytest
from runtime.rt_support import running_worker, until

from electric_sdk import AsyncClient
from electric_sdk.runtime import App, DefinitionError
from electric_sdk.runtime.exec import Reply, parse_exec_file
from electric_sdk.testing import TestServer

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]

BC = shutil.which("bc")
PI = "3.14159265358979323844"  # 2*a(1)*2: four times atan(1)
# Echoes each line's words one per line, then END; "exit" prints "part" and exits; "mute" says nothing.
WORDS = (
    "import sys\n"
    "for line in sys.stdin:\n"
    "    line = line.strip()\n"
    "    if line == 'exit':\n"
    "        print('part', flush=True); sys.exit(0)\n"
    "    if line == 'mute':\n"
    "        continue\n"
    "    for w in line.split(): print(w)\n"
    "    print('END', flush=True)\n"
)


def _run_started(event: object) -> bool:
    value = getattr(event, "value", {})
    return getattr(event, "type", "") == "run" and value.get("status") == "started"


def words(*flags: str) -> list[str]:
    return [sys.executable, "-u", "-c", WORDS, *flags]


@pytest.mark.skipif(BC is None, reason="bc is not installed (apt-get install -y bc)")
async def test_bc_answers_with_its_output(electric: TestServer, client: AsyncClient) -> None:
    app = App(code_version="t")
    app.exec("calc", ["bc", "-lq"], keep=True, reply=Reply.lines(1))
    async with running_worker(app, electric.address):
        await client.spawn("calc/c1")
        result = await client.send("calc/c1", "2*a(1)*2", wait="run", timeout="30s")
        assert (result.status, result.output) == ("completed", PI)
        second = await client.send("calc/c1", "6*7", wait="run", timeout="30s")
        assert (second.status, second.output) == ("completed", "42")


@pytest.mark.skipif(BC is None, reason="bc is not installed (apt-get install -y bc)")
async def test_electric_run_prints_the_reply(electric: TestServer, client: AsyncClient) -> None:
    app = App(code_version="t")
    app.exec("calc", ["bc", "-lq"], keep=True, reply=Reply.lines(1))
    async with running_worker(app, electric.address):
        await client.spawn("calc/c1")
        done = await anyio.run_process(
            [sys.executable, "-m", "electric_sdk.cli.main", "--address", electric.address, "run", "calc/c1",
             "--message", "2*a(1)*2"],
            check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == PI


async def test_until_line_and_idle(electric: TestServer, client: AsyncClient) -> None:
    app = App(code_version="t")
    app.exec("words", words(), keep=True, reply=Reply.until_line("END"))
    app.exec("quiet", words(), keep=True, reply=Reply.idle("300ms"))
    async with running_worker(app, electric.address):
        await client.spawn("words/a")
        await client.spawn("quiet/a")
        result = await client.send("words/a", "a b c", wait="run", timeout="30s")
        assert (result.status, result.output) == ("completed", "a\nb\nc")
        result = await client.send("quiet/a", "x y", wait="run", timeout="30s")
        assert (result.status, result.output) == ("completed", "x\ny\nEND")


async def test_stdout_ending_first_aborts_with_what_was_read(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="t")
    app.exec("words", words(), reply=Reply.until_line("END"))
    async with running_worker(app, electric.address):
        await client.spawn("words/a")
        result = await client.send("words/a", "exit", wait="run", timeout="30s")
        assert (result.status, result.output) == ("aborted", "part")
        assert result.error is not None
        assert "stdout ended" in result.error


async def test_sigint_aborts_the_wait_for_a_reply(electric: TestServer, client: AsyncClient) -> None:
    app = App(code_version="t")
    app.exec("words", words(), keep=True, reply=Reply.until_line("END"))
    async with running_worker(app, electric.address):
        await client.spawn("words/a")
        receipt = await client.send("words/a", "mute")

        await until(client, "words/a", _run_started, receipt.offset)
        await client.interrupt("words/a", reason="test")
        result = await client.wait_run(receipt, 30)
        assert result.status == "aborted"


async def test_a_reply_past_its_timeout_fails_with_what_was_read(
    electric: TestServer, client: AsyncClient
) -> None:
    """Two lines where three are read: the reply never completes; its timeout fails the run with
    the two, and the entity takes its next message."""
    app = App(code_version="t")
    app.exec("words", words(), keep=True, reply=Reply.lines(3, timeout="300ms"))
    async with running_worker(app, electric.address):
        await client.spawn("words/a")
        result = await client.send("words/a", "x", wait="run", timeout="30s")
        assert (result.status, result.output) == ("failed", "x\nEND")
        assert result.error == "no reply (3 lines) within its timeout (300 ms)"
        result = await client.send("words/a", "y z", wait="run", timeout="30s")
        assert (result.status, result.output) == ("completed", "y\nz\nEND")


async def test_sigterm_during_a_reply_stops_the_process_and_ends_the_wait(
    electric: TestServer, client: AsyncClient
) -> None:
    app = App(code_version="t")
    app.exec("words", words(), keep=True, reply=Reply.until_line("END"))
    async with running_worker(app, electric.address):
        await client.spawn("words/a")
        receipt = await client.send("words/a", "mute")

        await until(client, "words/a", _run_started, receipt.offset)
        await client.terminate("words/a", reason="test")
        result = await client.wait_run(receipt, 30)
        assert result.status == "aborted"
        assert result.error is not None
        assert "stdout ended" in result.error
        await until(client, "words/a", lambda e: e.type == "state" and e.value["state"] == "stopped")


def test_toml_reply() -> None:
    text = '[[exec]]\nid = "calc"\ncommand = ["bc", "-lq"]\nreply = { lines = 1 }\n'
    (etype,) = parse_exec_file(text)
    assert etype.spec.reply == Reply.lines(1)
    text = '[[exec]]\nid = "w"\ncommand = "cat"\nreply = { until_line = "END" }\n'
    assert parse_exec_file(text)[0].spec.reply == Reply.until_line("END")
    text = '[[exec]]\nid = "w"\ncommand = "cat"\nreply = { idle = "200ms" }\n'
    assert parse_exec_file(text)[0].spec.reply == Reply.idle("200ms")
    text = '[[exec]]\nid = "w"\ncommand = "cat"\nreply = { lines = 2, timeout = "5s" }\n'
    assert parse_exec_file(text)[0].spec.reply == Reply.lines(2, timeout="5s")
    bad_replies = (
        "{ lines = 0 }",
        '{ until_line = "" }',
        '{ idle = "0ms" }',
        '{ soon = "1s" }',
        '"END"',
        '{ timeout = "1s" }',
        '{ lines = 1, timeout = "0s" }',
        "{ lines = 1, timeout = 5 }",
        '{ lines = 1, timeout = "soon" }',
    )
    for bad in bad_replies:
        with pytest.raises(DefinitionError, match="reply"):
            parse_exec_file(f'[[exec]]\nid = "w"\ncommand = "cat"\nreply = {bad}\n')
