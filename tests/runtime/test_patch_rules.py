"""The rules of ``ctx.patched`` one by one, in the test harness (EntityHarness: no server).

test_patches.py shows them with real workers killed with kill -9; here each
rule gets its own run: an answer holds for the whole attempt, a signal
handler and a step's own code are told True and record nothing, a patch id
is checked, and a marker is written only before a step.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from electric_sdk.errors import InvalidArgument
from electric_sdk.lifecycle import Signal
from electric_sdk.runtime import App, Context, Message, SignalInfo
from electric_sdk.runtime.patches import patched
from electric_sdk.runtime.steps import RunSteps
from electric_sdk.testing import EntityHarness, ReplayProblem, ReplayResult

pytestmark = pytest.mark.anyio


def markers(h: EntityHarness) -> list[dict[str, Any]]:
    return [
        e.value["data"]
        for e in h.events
        if e.type == "electric.step" and e.value["data"]["outcome"] == "patched"
    ]


def step_names(h: EntityHarness) -> list[tuple[int, str]]:
    return [
        (e.value["data"]["index"], e.value["data"]["name"])
        for e in h.events
        if e.type == "electric.step" and e.value["data"]["outcome"] == "ok"
    ]


class Code:
    """An app whose code a test switches between versions: ``patch`` adds the patched step N."""

    def __init__(self) -> None:
        self.patch = False
        self.answers: list[bool] = []
        self.hold: anyio.Event | None = None
        self.held = anyio.Event()
        self.app = App(code_version="rules")

        @self.app.entity("rules")
        class Rules:
            async def on_message(inner, ctx: Context, message: Message) -> None:
                await ctx.step("X", lambda: "x")
                if self.patch:
                    self.answers.append(ctx.patched("fix"))
                    if self.answers[-1]:
                        await ctx.step("N", lambda: "n")
                await ctx.step("Y", lambda: "y")
                if self.hold is not None:
                    self.held.set()
                    await self.hold.wait()  # crashed here
                if self.patch:
                    self.answers.append(ctx.patched("fix"))  # past the recorded steps now
                await ctx.step("Z", lambda: "z")

            async def on_signal(inner, ctx: Context, signal: SignalInfo) -> None:
                self.answers.append(ctx.patched("fix"))


async def test_an_answer_holds_for_the_attempt_and_is_recorded_once() -> None:
    code = Code()
    code.patch = True
    async with EntityHarness(code.app, "rules") as h:
        run = await h.send("new")
        assert run.status == "completed", run.error
        assert code.answers == [True, True]
        assert [(m["index"], m["patch"]) for m in markers(h)] == [(1, "fix")]
        assert step_names(h) == [(0, "X"), (1, "N"), (2, "Y"), (3, "Z")]


async def test_an_old_run_is_told_false_even_past_its_recorded_steps() -> None:
    code = Code()
    code.hold = anyio.Event()
    async with EntityHarness(code.app, "rules") as h:
        first = h.start("old")
        await code.held.wait()
        await h.crash()
        code.patch, code.hold = True, None
        run = await h.send("old", key=first.message.key, attempt=2)
        assert run.status == "completed", run.error
        # False at position 1 (Y recorded there), and still False past the end: one path.
        assert code.answers == [False, False]
        assert markers(h) == []
        assert step_names(h) == [(0, "X"), (1, "Y"), (2, "Z")]


async def test_a_signal_handler_is_told_true_and_records_nothing() -> None:
    code = Code()
    async with EntityHarness(code.app, "rules") as h:
        await h.signal(Signal.SIGUSR)
        assert code.answers == [True]
        assert markers(h) == []


async def test_a_steps_own_code_is_told_true_and_records_nothing() -> None:
    app = App(code_version="inner")
    answers: list[bool] = []

    @app.entity("inner")
    async def inner(ctx: Context, message: Message) -> None:
        async def check() -> str:
            answers.append(ctx.patched("fix"))
            return "checked"

        await ctx.step("check", check)

    async with EntityHarness(app, "inner") as h:
        assert (await h.send("go")).status == "completed"
        assert answers == [True]
        assert markers(h) == []


async def test_a_patch_with_no_step_after_it_writes_no_marker() -> None:
    app = App(code_version="last")

    @app.entity("last")
    async def last(ctx: Context, message: Message) -> None:
        await ctx.step("X", lambda: "x")
        ctx.output.write("new" if ctx.patched("wording") else "old")

    async with EntityHarness(app, "last") as h:
        run = await h.send("go")
        assert (run.status, run.output) == ("completed", "new")
        assert markers(h) == []  # a replay finds nothing after X, and answers True again


@pytest.mark.parametrize("bad", ["", "x" * 129])
async def test_a_patch_id_is_checked(bad: str) -> None:
    app = App(code_version="bad")

    @app.entity("bad")
    async def bad_patch(ctx: Context, message: Message) -> None:
        ctx.patched(bad)

    async with EntityHarness(app, "bad") as h:
        run = await h.send("go")
        assert run.status == "failed"
        assert run.error.startswith("InvalidArgument: a patch id is a text of 1 to 128 characters")
    with pytest.raises(InvalidArgument) as raised:  # a handler's context checks it too
        patched(RunSteps(), bad, run_key=None, attempt=0)
    assert raised.value.code == "INVALID_PATCH_ID"


def test_the_summary_line_counts_in_words() -> None:
    problem = ReplayProblem("job/a", "msg_1", 1, "nondeterministic", "B", "B2")
    assert ReplayResult(1, 1).summary() == "checked 1 run of 1 entity: all replay"
    assert ReplayResult(2, 3, (problem,), ("job/b run msg_2",)).summary() == (
        "checked 3 runs of 2 entities: 1 would fail (1 unchecked)"
    )
    assert str(problem) == "job/a run msg_1: step 1 was recorded as 'B'; the new code asks for 'B2'"
    with pytest.raises(AssertionError, match="recorded as 'B'"):
        ReplayResult(1, 1, (problem,)).assert_replays()


DOC = Path(__file__).resolve().parents[2] / "docs" / "patches.md"


def doc_versions() -> list[App]:
    """docs/patches.md's three versions of the research assistant, each on an App of its own
    (the third is the body of the function, as the page shows it)."""
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), re.S | re.M)[:3]
    blocks[2] = "@app.entity('research')\nasync def research(ctx, message):\n" + blocks[2]
    apps = []
    for n, block in enumerate(blocks, 1):
        app = App(code_version=f"v{n}")
        namespace = {"app": app, "search": lambda q: [q], "check": lambda f: [*f, "checked"], "answer": str}
        exec(compile(block, f"{DOC}:{n}", "exec"), namespace)
        apps.append(app)
    return apps


async def test_the_docs_example_runs_as_written() -> None:
    v1, v2, v3 = doc_versions()
    async with EntityHarness(v1, "research", id="r1") as h:
        old = await h.send("q")
        assert old.output == "['q']"
        # v2 takes the run v1 recorded (delivered again): the old path, replayed.
        h.etype = v2.types["research"]
        again = await h.send("q", key=old.message.key, attempt=2)
        assert (again.status, again.output) == ("completed", "['q']")
        new = await h.send("n")
        assert new.output == "['n', 'checked']"
        assert [(m["index"], m["patch"]) for m in markers(h)] == [(1, "check-sources")]
        # v3 takes the new run v2 recorded, marker and all, and new runs.
        h.etype = v3.types["research"]
        assert (await h.send("n", key=new.message.key, attempt=2)).output == "['n', 'checked']"
        assert (await h.send("m")).output == "['m', 'checked']"
