"""Input-required: ``await ctx.ask(question)`` ends the run asking; the next message is the reply.

A real server (SQLite, and PostgreSQL for ``both_stores``) and real worker processes. The
entity's step before the ask appends a line to a file, so a test sees that the reply's run
replays it from the record instead of running it again, across a worker's restart too.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from electric_sdk import AsyncClient, State
from electric_sdk.testing import TestServer, replay

from .rt_support import app_module, worker_processes

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]

WAIT_S = 30.0

APP = """
from pathlib import Path

from electric_sdk.runtime import App

app = App(code_version="ask")


def greet(text):
    with Path("greeted.log").open("a") as log:  # one line each time the step really runs
        log.write(text + "\\n")
    return "hello " + text


@app.entity("asker", idle_timeout="1h")
async def asker(ctx, message):
    greeting = await ctx.step("model:greet", greet, message.text)
    ctx.state["asked"].append(message.text)
    color = await ctx.ask(f"which color for the {message.text}?")
    size = await ctx.ask("which size?")
    ctx.output.write(f"{greeting}: {color} {size}")


@app.entity("brief", idle_timeout="100ms")
async def brief(ctx, message):
    greeting = await ctx.step("model:greet", greet, message.text)
    answer = await ctx.ask("and then?")
    ctx.output.write(f"{greeting}, then {answer}")
"""


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    return app_module(tmp_path, "ask_app", APP)


@pytest.fixture
def start_worker(app_dir: Path) -> Iterator[Callable[..., Any]]:
    with worker_processes(app_dir, "ask_app:app") as start:
        yield start


async def test_a_run_asks_and_the_next_message_replies(
    electric: TestServer, start_worker: Callable[..., Any], app_dir: Path
) -> None:
    start_worker(electric.address)
    async with AsyncClient(electric.address) as client:
        await client.spawn("asker/a1")
        asked = await client.send("asker/a1", "bike", wait="run", timeout=WAIT_S)
        assert asked.status == "input_required"
        assert asked.question == "which color for the bike?"
        entity = await client.get("asker/a1")
        assert entity.awaiting_input is not None
        assert (entity.awaiting_input.run, entity.awaiting_input.question) == (
            asked.receipt.key,
            "which color for the bike?",
        )
        assert entity.to_json()["awaiting_input"] == {
            "run": asked.receipt.key,
            "question": "which color for the bike?",
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTRIC_")}
        args = [
            sys.executable,
            "-m",
            "electric_sdk.cli.main",
            "--address",
            electric.address,
            "get",
            "asker/a1",
        ]
        shown = (await anyio.run_process(args, env=env)).stdout.decode()
        assert f"awaiting input  which color for the bike? (asked by the run of {asked.receipt.key})" in shown
        # The reply runs the same code again: the step and the first ask replay, the second asks.
        second = await client.send("asker/a1", "red", wait="run", timeout=WAIT_S)
        assert second.status == "input_required"
        assert second.question == "which size?"
        done = await client.send("asker/a1", "large", wait="run", timeout=WAIT_S)
        assert done.status == "completed", done
        assert done.output == "hello bike: red large"
        assert (await client.get("asker/a1")).awaiting_input is None
        assert (app_dir / "greeted.log").read_text() == "bike\n"  # run once, replayed twice
        assert await client.state("asker/a1") == {"asked": ["bike"]}  # its changes made once
        events = (await client.events("asker/a1", 0, limit=1000)).events
        replies = [e.value["reply"] for e in events if e.type == "message" and "reply" in e.value]
        assert replies == [
            {"ask_key": asked.receipt.key, "text": "red"},
            {"ask_key": second.receipt.key, "text": "large"},
        ]
        ends = [e.value for e in events if e.type == "run" and e.value["status"] == "input_required"]
        assert [(e["question"], e["ask_step"]) for e in ends] == [
            ("which color for the bike?", 1),
            ("which size?", 2),
        ]


async def test_a_reply_after_the_worker_restarted(
    electric: TestServer, start_worker: Callable[..., Any], app_dir: Path
) -> None:
    first = start_worker(electric.address)
    async with AsyncClient(electric.address) as client:
        await client.spawn("asker/a2")
        asked = await client.send("asker/a2", "car", wait="run", timeout=WAIT_S)
        assert asked.status == "input_required"
        first.kill()
        first.wait(WAIT_S)
        start_worker(electric.address)
        answered = await client.send("asker/a2", "blue", wait="run", timeout=WAIT_S)
        assert answered.status == "input_required", answered
        assert answered.question == "which size?"
        assert (app_dir / "greeted.log").read_text() == "car\n"


async def test_electric_run_ends_with_the_question(
    electric: TestServer, start_worker: Callable[..., Any]
) -> None:
    """A headless run that asks ends without failure: its last record names the question."""
    start_worker(electric.address)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTRIC_")}
    args = [sys.executable, "-m", "electric_sdk.cli.main", "--address", electric.address, "--json", "run"]
    done = await anyio.run_process([*args, "asker/a3", "--spawn", "--message", "boat"], check=False, env=env)
    assert done.returncode == 0, done.stderr
    last = json.loads(done.stdout.splitlines()[-1])
    assert last["type"] == "session_complete"
    assert last["status"] == "input_required"
    assert last["run"]["question"] == "which color for the boat?"


async def test_an_entity_awaiting_input_goes_idle_and_its_reply_wakes_it(
    electric: TestServer, start_worker: Callable[..., Any], app_dir: Path
) -> None:
    """The ask holds nothing: the idle timeout ends the session as between any two runs (no
    lease), and the reply wakes the entity and resumes the run."""
    start_worker(electric.address)
    async with AsyncClient(electric.address) as client:
        await client.spawn("brief/b1")
        asked = await client.send("brief/b1", "tea", wait="run", timeout=WAIT_S)
        assert asked.status == "input_required"
        await client.wait_for_state("brief/b1", State.IDLE, timeout=WAIT_S)
        entity = await client.get("brief/b1")
        assert entity.holder is None  # no lease: the idle timeout ended the session
        assert entity.awaiting_input is not None
        done = await client.send("brief/b1", "biscuits", wait="run", timeout=WAIT_S)
        assert (done.status, done.output) == ("completed", "hello tea, then biscuits")
        assert (app_dir / "greeted.log").read_text() == "tea\n"


async def test_a_fork_of_an_entity_awaiting_input_awaits_nothing(
    electric: TestServer, start_worker: Callable[..., Any]
) -> None:
    """The question is its origin's: the fork's next message is a message of its own."""
    start_worker(electric.address)
    async with AsyncClient(electric.address) as client:
        await client.spawn("asker/origin")
        asked = await client.send("asker/origin", "kite", wait="run", timeout=WAIT_S)
        assert asked.status == "input_required"
        fork = await client.fork("asker/origin", "forked")
        assert fork.awaiting_input is None
        own = await client.send("asker/forked", "sled", wait="run", timeout=WAIT_S)
        assert (own.status, own.question) == ("input_required", "which color for the sled?")
        assert (await client.get("asker/origin")).awaiting_input is not None


async def test_the_replay_check_replays_an_asking_run_to_its_ask(
    electric: TestServer, start_worker: Callable[..., Any], app_dir: Path
) -> None:
    """`testing.replay` over every run: one that ended asking replays up to its ask, where its
    record ends, and passes."""
    start_worker(electric.address)
    async with AsyncClient(electric.address) as client:
        await client.spawn("asker/r1")
        asked = await client.send("asker/r1", "bike", wait="run", timeout=WAIT_S)
        assert asked.status == "input_required"
    namespace: dict[str, Any] = {}
    exec(compile((app_dir / "ask_app.py").read_text(), "ask_app.py", "exec"), namespace)
    result = replay(namespace["app"], server=electric, types=["asker"], all_runs=True)
    result.assert_replays()
    assert (app_dir / "greeted.log").read_text() == "bike\n"  # the step answered from its record
