"""Parallel recorded steps, typed results and ``ctx.step_key``, in the harness (no server): each
parallel step is recorded and replayed by its name or key, whatever the order its task reached
``ctx.step``; a pair that cannot be told apart is refused; state changes follow the records.
The crash paths with real processes are in test_parallel_steps_e2e.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

import anyio
import pydantic
import pytest

from electric_sdk.errors import InvalidStepResult
from electric_sdk.event_text import step_summary
from electric_sdk.runtime import App, Context, JSONCodec, Message, Retry
from electric_sdk.testing import EntityHarness

pytestmark = pytest.mark.anyio


@dataclass
class Hit:
    url: str
    score: float


class Answer(pydantic.BaseModel):
    text: str
    hits: list[Hit]


class Gates:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.keys: dict[str, list[str]] = {}
        self.release = anyio.Event()
        self.held = anyio.Event()


def parallel_app(g: Gates) -> App:
    app = App(code_version="test")

    async def tool(ctx: Context, name: str, order: list[str]) -> str:
        g.calls[name] += 1
        g.keys.setdefault(name, []).append(ctx.step_key)
        if name == "c" and g.calls[name] == 1:
            g.held.set()
            await g.release.wait()  # the worker dies here, a and b done
        if name == "flaky" and g.calls[name] < 3:
            raise ConnectionError("try again")
        ctx.state["seen"].append(name)  # the step's own change: written with its record
        order.append(name)
        return name.upper()

    @app.entity("fan", idle_timeout="60s")
    async def fan(ctx: Context, message: Message) -> str:
        ctx.state["asked"].append(message.text)  # written with the first parallel record
        order: list[str] = []
        names = message.text.split(",")
        if message.text == "reversed":
            names = ["c", "b", "a"]
        retry = Retry(attempts=3, backoff="1ms", on=(ConnectionError,))
        async with anyio.create_task_group() as tg:
            results: dict[str, str] = {}

            async def one(name: str) -> None:
                results[name] = await ctx.step(f"tool:{name}", tool, ctx, name, order, retry=retry)

            for name in names:
                tg.start_soon(one, name)
        ctx.state["done"].append(message.text)  # after the group: the run's own, next position
        after = await ctx.step("model:sum", lambda: "+".join(sorted(results.values())))
        return after

    @app.entity("dup", idle_timeout="60s")
    async def dup(ctx: Context, message: Message) -> str:
        async def hit(q: str) -> str:
            g.keys.setdefault("dup", []).append(ctx.step_key)
            return q

        if message.text == "keyed":
            found = await asyncio.gather(*(ctx.step("tool:search", hit, q, key=q) for q in ("x", "y")))
            again = await ctx.step("tool:search", hit, "z")
            again2 = await ctx.step("tool:search", hit, "w")
            return ",".join([*found, again, again2])
        if message.text in ("twice", "twice-ctx"):
            # A loop's two turns of the same parallel tool calls, nothing of the run's own between.
            turns = []
            for turn in ("1", "2"):
                calls = [ctx.step("tool:search", hit, turn + "a"), ctx.step("tool:fetch", hit, turn + "b")]
                gather = ctx.gather if message.text == "twice-ctx" else asyncio.gather
                turns.append("+".join(await gather(*calls)))
            return ",".join(turns)
        found = await asyncio.gather(*(ctx.step("tool:search", hit, q) for q in ("x", "y")))
        return ",".join(found)

    @app.entity("typed", idle_timeout="60s")
    async def typed(ctx: Context, message: Message) -> str:
        async def answer() -> Answer:
            g.calls["answer"] += 1
            if g.calls["answer"] == 1:
                g.held.set()
                await g.release.wait()
            return Answer(text="ok", hits=[Hit("https://a", 0.5)])

        first = await ctx.step("tool:hit", lambda: Hit("https://b", 1.5))
        second = await ctx.step("model:answer", answer)
        assert isinstance(first, Hit)
        assert isinstance(second, Answer)
        return second.model_dump_json() + "|" + repr(first)

    return app


async def test_parallel_steps_replay_by_name_whatever_order_they_start_in() -> None:
    g = Gates()
    async with EntityHarness(parallel_app(g), "fan") as h:
        first = h.start("a,b,c")
        await g.held.wait()
        await h.crash()  # a and b recorded, c in flight
        records = [e.value["data"] for e in h.events if e.type == "electric.step"]
        assert sorted((r["index"], r["key"], r["outcome"]) for r in records) == [
            (0, "tool:a", "ok"),
            (0, "tool:b", "ok"),
        ]
        assert sorted(h.state["seen"]) == ["a", "b"]  # each step's change, with its record
        assert h.state["asked"] == ["a,b,c"]
        # Delivered again with the tasks started in another order: each answered by its name.
        run = await h.send("reversed", key=first.message.key, attempt=2)
        assert run.status == "completed", run.error
        assert run.output == "A+B+C"
        assert g.calls == {"a": 1, "b": 1, "c": 2}  # only c ran again
        assert h.state == {"asked": ["a,b,c"], "seen": ["a", "b", "c"], "done": ["reversed"]}
        # c's key is the same on both attempts; every step's key differs from the others'.
        assert g.keys["c"][0] == g.keys["c"][1]
        assert len({g.keys["a"][0], g.keys["b"][0], g.keys["c"][0]}) == 3


async def test_a_parallel_step_renamed_since_the_first_attempt_fails_the_run() -> None:
    """Delivered again with `b` renamed `x`: `b`'s record is never asked for, and the run says so
    once the group is whole (before the run's next position), rather than orphan it silently."""
    g = Gates()
    async with EntityHarness(parallel_app(g), "fan") as h:
        first = h.start("a,b,c")
        await g.held.wait()
        await h.crash()  # a and b recorded, c in flight
        run = await h.send("a,x,c", key=first.message.key, attempt=2)
        assert run.status == "failed"
        assert "NonDeterministicRun" in run.error
        assert "parallel step 'tool:b' recorded at position 0" in run.error
        assert "'tool:a', 'tool:c', 'tool:x'" in run.error
        assert "done" not in h.state  # the run's own next change was never made


async def test_a_failing_parallel_step_is_retried_alone() -> None:
    g = Gates()
    async with EntityHarness(parallel_app(g), "fan") as h:
        run = await h.send("a,flaky,b")
        assert run.status == "completed", run.error
        assert g.calls == {"a": 1, "b": 1, "flaky": 3}
        records = [e.value["data"] for e in h.events if e.type == "electric.step"]
        assert [r["outcome"] for r in records if r.get("key") == "tool:flaky"] == ["retry", "retry", "ok"]
        assert [r["index"] for r in records if r["name"] == "model:sum"] == [1]


async def test_two_parallel_steps_that_cannot_be_told_apart_are_refused() -> None:
    g = Gates()
    async with EntityHarness(parallel_app(g), "dup") as h:
        run = await h.send("plain")
        assert run.status == "failed"
        assert "two parallel steps named 'tool:search' at position 0" in run.error
        assert "key=" in run.error


async def test_two_batches_in_a_row_are_one_group_and_say_so_ctx_gather_is_a_group_each() -> None:
    g = Gates()
    async with EntityHarness(parallel_app(g), "dup") as h:
        run = await h.send("twice")
        assert run.status == "failed"
        assert "two parallel steps named 'tool:search' at position 0" in run.error
        assert "the first has ended" in run.error
        assert "ctx.gather" in run.error
        run = await h.send("twice-ctx")
        assert run.status == "completed", run.error
        assert run.output == "1a+1b,2a+2b"
        again = await h.send("twice-ctx", key=run.message.key, attempt=2)  # each from its record
        assert again.output == "1a+1b,2a+2b"
        steps = [
            e.value["data"]
            for e in h.events
            if e.type == "electric.step" and e.value["data"]["run"] == run.message.key
        ]
        assert sorted((r["index"], r["name"]) for r in steps) == [
            (0, "tool:fetch"),
            (0, "tool:search"),
            (1, "tool:fetch"),
            (1, "tool:search"),
        ]


async def test_keys_tell_parallel_steps_apart_and_step_keys_differ_for_repeated_names() -> None:
    g = Gates()
    async with EntityHarness(parallel_app(g), "dup") as h:
        run = await h.send("keyed")
        assert run.status == "completed", run.error
        assert run.output == "x,y,z,w"
        assert len(set(g.keys["dup"])) == 4  # two parallel, two repeated names in sequence
        again = await h.send("keyed", key=run.message.key, attempt=2)  # all replayed
        assert again.output == "x,y,z,w"
        assert len(g.keys["dup"]) == 4


async def test_typed_results_are_replayed_as_equal_objects() -> None:
    g = Gates()
    async with EntityHarness(parallel_app(g), "typed") as h:
        first = h.start()
        await g.held.wait()
        await h.crash()
        records = [e.value["data"] for e in h.events if e.type == "electric.step"]
        assert records[0]["result"] == {"url": "https://b", "score": 1.5}
        assert records[0]["type"] == f"{__name__}:Hit"
        run = await h.send(key=first.message.key, attempt=2)
        assert run.status == "completed", run.error
        assert run.output.endswith("|Hit(url='https://b', score=1.5)")
        original = Answer(text="ok", hits=[Hit("https://a", 0.5)])
        assert Answer.model_validate_json(run.output.split("|")[0]) == original


def test_the_codec_names_what_it_cannot_find_again() -> None:
    @dataclass
    class Local:
        x: int

    with pytest.raises(TypeError, match="register it with JSONCodec"):
        JSONCodec().encode(Local(1))
    codec = JSONCodec(types=[Local])
    data, tag = codec.encode(Local(1))
    assert codec.decode(data, tag) == Local(1)
    with pytest.raises(TypeError, match="no type"):
        JSONCodec().decode(data, tag)


async def test_an_undecodable_record_names_the_step() -> None:
    g = Gates()
    async with EntityHarness(parallel_app(g), "typed") as h:
        first = h.start()
        await g.held.wait()
        await h.crash()
        for event in h.events:
            if event.type == "electric.step":
                event.value["data"]["type"] = "gone.module:Hit"  # code that no longer has the type
        run = await h.send(key=first.message.key, attempt=2)
        assert run.status == "failed"
        assert "step 'tool:hit'" in run.error
        assert "gone.module:Hit" in run.error
        assert InvalidStepResult.__name__ in run.error


async def test_step_key_outside_a_step_is_refused() -> None:
    app = App(code_version="test")
    seen: list[Any] = []

    @app.entity("k")
    async def k(ctx: Context, message: Message) -> None:
        try:
            _ = ctx.step_key
        except RuntimeError as exc:
            seen.append(str(exc))

    async with EntityHarness(app, "k") as h:
        await h.send()
    assert len(seen) == 1
    assert "inside a recorded step" in seen[0]


async def test_ctx_gather_knows_steps_by_their_place_and_closes_its_group() -> None:
    app = App(code_version="test")
    ran: Counter[str] = Counter()
    gate = anyio.Event()
    held = anyio.Event()

    async def fetch(url: str) -> str:
        ran[url] += 1
        if url == "u3" and ran[url] == 1:
            held.set()
            await gate.wait()  # the worker dies here
        return url.upper()

    @app.entity("g")
    async def g_entity(ctx: Context, message: Message) -> str:
        urls = message.text.split(",")
        first = await ctx.gather(*(ctx.step("tool:fetch", fetch, u) for u in urls[:2]))
        second = await ctx.gather(*(ctx.step("tool:fetch", fetch, u) for u in urls[2:]))
        return ",".join(first + second)

    async with EntityHarness(app, "g") as h:
        run = h.start("u1,u2,u3,u4")
        await held.wait()
        await h.crash()
        records = [e.value["data"] for e in h.events if e.type == "electric.step"]
        assert sorted((r["index"], r["key"]) for r in records if r["outcome"] == "ok") == [
            (0, "0:tool:fetch"),
            (0, "1:tool:fetch"),
            (1, "1:tool:fetch"),
        ]
        again = await h.send("u1,u2,u3,u4", key=run.message.key, attempt=2)
        assert again.output == "U1,U2,U3,U4"
        assert ran == {"u1": 1, "u2": 1, "u3": 2, "u4": 1}


def test_electric_events_shows_a_parallel_steps_key_and_a_typed_result() -> None:
    parallel = {"index": 2, "name": "tool:fetch", "key": "q1", "outcome": "ok", "try": 1, "result": "A"}
    assert step_summary(parallel) == 'step 2 tool:fetch [key q1] ok (try 1): "A"'
    by_name = {
        **parallel,
        "key": "tool:fetch",
        "attempt": 2,
        "outcome": "retry",
        "error": {"type": "E", "message": "m"},
    }
    assert step_summary(by_name) == "step 2 tool:fetch [parallel] (attempt 2) retry (try 1): E: m"
    typed = {"index": 0, "name": "model", "outcome": "ok", "try": 1, "result": {"a": 1}, "type": "app:Answer"}
    assert step_summary(typed) == 'step 0 model ok (try 1): Answer {"a":1}'


async def test_the_runs_own_state_change_waits_for_its_parallel_steps() -> None:
    app = App(code_version="test")
    seen: list[str] = []

    @app.entity("s", state=True)
    async def s_entity(ctx: Context, message: Message) -> None:
        started, release = anyio.Event(), anyio.Event()

        async def slow() -> str:
            started.set()
            await release.wait()
            return "x"

        async with anyio.create_task_group() as tg:
            tg.start_soon(ctx.step, "tool:slow", slow)
            await started.wait()
            try:
                ctx.state["log"].append("too early")
            except RuntimeError as exc:
                seen.append(str(exc))
            release.set()
        ctx.state["log"].append("after")  # the group has ended: the run's own, next position

    async with EntityHarness(app, "s") as h:
        run = await h.send()
        assert run.status == "completed", run.error
        assert h.state == {"log": ["after"]}
    assert len(seen) == 1
    assert "while parallel steps 'tool:slow' run in other tasks" in seen[0]
