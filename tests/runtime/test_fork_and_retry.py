"""`electric retry` and `electric fork` with a real server (both stores) and a real worker.

A retry replays the recorded steps before its from-step (their functions are not called
again: each call is counted) and executes the rest; a fork's stream is its origin's up to the
offset, then its own records, and it wakes with the origin's durable state as of the offset.
Tests synchronize on the streams' records, never on sleeps.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from electric_sdk import AsyncClient, errors
from electric_sdk.runtime import App, Context, Message
from electric_sdk.testing import TestServer

from .rt_support import COMPLETED, FAILED, run_status, running_worker, state_is, until

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]


class Flaky:
    """Three recorded steps; ``c`` raises while ``failing``. ``calls`` counts each real call."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.failing = True

    def app(self) -> App:
        app = App(code_version="test")

        @app.entity("flaky", idle_timeout="60s")
        async def flaky(ctx: Context, message: Message) -> None:
            results = []
            for name in ("a", "b", "c"):
                results.append(await ctx.step(name, self._call, name))
            ctx.state["done"].append(message.text)
            ctx.output.write(",".join(results))

        @app.entity("notes", idle_timeout="60s")
        async def notes(ctx: Context, message: Message) -> None:
            ctx.state["seen"].append(message.text)
            said = await ctx.step("say", self._call, message.text)
            ctx.output.write(",".join([*ctx.state["seen"][:-1], said]))

        return app

    def _call(self, name: str) -> str:
        self.calls[name] += 1
        if name == "c" and self.failing:
            raise RuntimeError("c is down")
        return f"{name}{self.calls[name]}"


async def _head(client: AsyncClient, ref: str) -> int:
    return (await client.events(ref, 0, 1)).head_offset


async def test_retry_from_a_step_replays_the_steps_before_it_and_runs_the_rest(
    electric: TestServer, client: AsyncClient
) -> None:
    flaky = Flaky()
    ref = "flaky/f1"
    async with running_worker(flaky.app(), electric.address):
        await client.spawn(ref)
        first = (await client.send(ref, "go")).key
        await until(client, ref, run_status(FAILED, first))
        assert flaky.calls == {"a": 1, "b": 1, "c": 1}

        # From step 1, still failing: a is replayed, b and c run again; c fails again.
        again = await client.retry(ref, first, from_step=1, reason="b first")
        await until(client, ref, run_status(FAILED, again.key))
        assert flaky.calls == {"a": 1, "b": 2, "c": 2}

        # A retry of that retry from step 2: a comes from the first run, b from the retry.
        flaky.failing = False
        last = await client.retry(ref, again.key, from_step=2, reason="c is back")
        done = await until(client, ref, run_status(COMPLETED, last.key))
        assert flaky.calls == {"a": 1, "b": 2, "c": 3}
        assert done.raw.run.output == "a1,b2,c3"

    message = (await client.events(ref, last.offset, 1)).events[0]
    assert message.type == "message"
    assert message.value["text"] == "go"
    assert message.value["retry"] == {
        "message_key": again.key,
        "message_offset": again.offset,
        "from_step": 2,
        "sender": "anonymous",
        "reason": "c is back",
    }
    assert await client.state(ref) == {"done": ["go"]}


async def test_a_retry_is_refused_clearly_and_writes_nothing(
    electric: TestServer, client: AsyncClient
) -> None:
    flaky = Flaky()
    ref = "flaky/f2"
    async with running_worker(flaky.app(), electric.address):
        await client.spawn(ref)
        failed = (await client.send(ref, "go")).key
        await until(client, ref, run_status(FAILED, failed))
        flaky.failing = False
        completed = (await client.send(ref, "go")).key
        await until(client, ref, run_status(COMPLETED, completed))
        head = await _head(client, ref)

        with pytest.raises(errors.FailedPrecondition) as refused:
            await client.retry(ref, completed)
        assert refused.value.code == "RUN_NOT_RETRYABLE"
        assert "completed" in refused.value.message
        # The failed run recorded 3 steps (a, b, and c's error): from-step 0..3.
        for step in (-1, 4):
            with pytest.raises(errors.InvalidArgument) as refused_step:
                await client.retry(ref, failed, from_step=step)
            assert refused_step.value.code == "INVALID_STEP"
        with pytest.raises(errors.EntityNotFound) as unknown:
            await client.retry(ref, "msg_nope")
        assert unknown.value.code == "RUN_NOT_FOUND"
        assert await _head(client, ref) == head

        await client.kill(ref, reason="done with it")
        head = await _head(client, ref)
        with pytest.raises(errors.FailedPrecondition) as terminal:
            await client.retry(ref, failed)
        assert terminal.value.code == "ENTITY_TERMINAL"
        assert "fork it instead" in terminal.value.message
        assert await _head(client, ref) == head


def _same(event: Any) -> tuple[Any, ...]:
    return (event.offset, event.type, event.key, event.operation, event.value)


async def test_a_fork_reads_as_its_origin_up_to_the_offset_and_runs_with_its_state(
    electric: TestServer, client: AsyncClient
) -> None:
    flaky = Flaky()
    origin, ref = "notes/n1", "notes/n1-fork"
    async with running_worker(flaky.app(), electric.address):
        await client.spawn(origin)
        second = ""
        for text in ("m0", "m1", "m2"):
            key = (await client.send(origin, text)).key
            done = await until(client, origin, run_status(COMPLETED, key))
            if text == "m1":
                second, at = key, done.offset + 1
        assert second
        entity = await client.fork(origin, "n1-fork", at=at, reason="try another way")
        assert entity.state.value == "idle"

        events = (await client.events(ref, 0, 1000)).events
        source = (await client.events(origin, 0, at)).events
        assert [_same(e) for e in events[:at]] == [_same(e) for e in source]
        record = events[at]
        assert record.type == "electric.fork"
        assert record.value["data"] == {
            "origin": "/notes/n1",
            "offset": at,
            "sender": "anonymous",
            "reason": "try another way",
        }
        assert events[-1].type == "state"
        assert events[-1].value["state"] == "idle"
        assert await client.state(ref) == {"seen": ["m0", "m1"]}

        key = (await client.send(ref, "m9")).key
        done = await until(client, ref, run_status(COMPLETED, key))
        assert done.raw.run.output == "m0,m1,m91"  # m2 was the origin's alone
    assert await client.state(ref) == {"seen": ["m0", "m1", "m9"]}
    assert await client.state(origin) == {"seen": ["m0", "m1", "m2"]}
    runs = [e for e in (await client.events(ref, at, 1000)).events if e.type == "run"]
    assert {e.raw.run.message_key for e in runs} == {key}


async def test_a_killed_entity_can_be_forked_and_bad_offsets_write_nothing(
    electric: TestServer, client: AsyncClient
) -> None:
    flaky = Flaky()
    origin = "notes/n2"
    async with running_worker(flaky.app(), electric.address):
        await client.spawn(origin)
        key = (await client.send(origin, "m0")).key
        await until(client, origin, run_status(COMPLETED, key))
        await client.kill(origin, reason="gone")
        await until(client, origin, state_is("killed"))
        head = await _head(client, origin)

        for bad in (-1, head + 1):
            with pytest.raises(errors.InvalidArgument) as refused:
                await client.fork(origin, "n2-bad", at=bad)
            assert refused.value.code == "INVALID_OFFSET"
        with pytest.raises(errors.EntityNotFound):
            await client.get("notes/n2-bad")

        fork = await client.fork(origin, "n2-fork")
        assert fork.state.value == "idle"
        with pytest.raises(errors.EntityExists):
            await client.fork(origin, "n2-fork")
        key = (await client.send("notes/n2-fork", "m1")).key
        done = await until(client, "notes/n2-fork", run_status(COMPLETED, key))
        assert done.raw.run.output == "m0,m11"
    assert (await client.get(origin)).state.value == "killed"


async def test_a_failed_run_of_a_killed_entity_is_retried_in_its_fork(
    electric: TestServer, client: AsyncClient
) -> None:
    """The way out a refused retry names: fork the killed entity, then retry the run in the fork,
    whose stream holds the run's message and records at the same offsets."""
    flaky = Flaky()
    origin, ref = "flaky/f3", "flaky/f3-fork"
    async with running_worker(flaky.app(), electric.address):
        await client.spawn(origin)
        failed = (await client.send(origin, "go")).key
        await until(client, origin, run_status(FAILED, failed))
        await client.kill(origin)
        with pytest.raises(errors.FailedPrecondition):
            await client.retry(origin, failed, from_step=2)

        await client.fork(origin, "f3-fork", reason="retry it there")
        flaky.failing = False
        retried = await client.retry(ref, failed, from_step=2)
        done = await until(client, ref, run_status(COMPLETED, retried.key))
        assert done.raw.run.output == "a1,b1,c2"
    assert flaky.calls == {"a": 1, "b": 1, "c": 2}
    assert await client.state(ref) == {"done": ["go"]}
