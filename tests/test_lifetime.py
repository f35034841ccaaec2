"""``lifetime.TaskGroup``: a component's tasks are cancelled and awaited when it is left, and a
task's crash is logged when it happens and raised when the group is left."""

from __future__ import annotations

import asyncio
import inspect
import logging

import pytest
from electric_server.lifetime import Component, TaskGroup

pytestmark = pytest.mark.anyio


async def test_leaving_cancels_and_awaits_every_task_even_those_started_while_leaving() -> None:
    started = asyncio.Event()
    ended: list[str] = []
    group = TaskGroup("test")

    async def late() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("late")

    async def forever() -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            group.start_soon(late(), name="late")  # e.g. a session's close, on its way out
            ended.append("forever")

    async with group:
        task = group.start_soon(forever(), name="forever")
        await started.wait()
    assert task.cancelled()
    assert ended == ["forever", "late"]
    assert len(group) == 0


async def test_a_crash_is_logged_at_once_and_raised_when_the_group_is_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    group = TaskGroup("the test's component")

    async def crash() -> None:
        raise ValueError("a bug")

    task = group.start_soon(crash(), name="crasher")
    await asyncio.wait([task])  # the group heard of the end first: its callback came first
    logged = [r for r in caplog.records if r.name == "electric_server.lifetime"]
    assert [r.getMessage() for r in logged] == ["the test's component: task crasher crashed"]
    assert logged[0].levelno == logging.ERROR
    assert logged[0].exc_info is not None
    with pytest.raises(BaseExceptionGroup) as raised:
        await group.aclose()
    assert [str(e) for e in raised.value.exceptions] == ["a bug"]
    assert "the test's component: 1 task(s) crashed" in str(raised.value)


async def test_an_expected_exception_ends_its_task_as_meant_and_nothing_else(
    caplog: pytest.LogCaptureFixture,
) -> None:
    group = TaskGroup("test", expected=(LookupError,))

    async def refused() -> None:
        raise KeyError("refused, and said so elsewhere")

    async def crash() -> None:
        raise ValueError("a bug")

    await asyncio.wait([group.start_soon(refused()), group.start_soon(crash(), name="crasher")])
    assert [r.getMessage() for r in caplog.records if r.name == "electric_server.lifetime"] == [
        "test: task crasher crashed"
    ]
    with pytest.raises(BaseExceptionGroup) as raised:
        await group.aclose()
    assert [str(e) for e in raised.value.exceptions] == ["a bug"]


async def test_a_crash_does_not_cancel_its_siblings() -> None:
    group = TaskGroup("test")
    release = asyncio.Event()

    async def crash() -> None:
        raise ValueError("a bug")

    async def sibling() -> str:
        await release.wait()
        return "done"

    sibling_task = group.start_soon(sibling())
    crash_task = group.start_soon(crash())
    await asyncio.wait([crash_task])
    release.set()
    assert await sibling_task == "done"
    with pytest.raises(BaseExceptionGroup):
        await group.aclose()


async def test_an_exception_leaving_the_block_goes_on_in_place_of_the_crashes() -> None:
    async def crash() -> None:
        raise ValueError("a bug")

    async def block() -> None:
        async with TaskGroup("test") as group:
            await asyncio.wait([group.start_soon(crash())])
            raise KeyError("the block's own")

    with pytest.raises(KeyError):
        await block()


async def test_nothing_starts_in_a_group_that_was_left() -> None:
    group = TaskGroup("the runtime")
    await group.aclose()

    async def step() -> None:
        pass

    coro = step()
    with pytest.raises(RuntimeError, match="the runtime has stopped"):
        group.start_soon(coro)
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED  # not reported as never awaited


async def test_wait_lets_tasks_end_by_themselves() -> None:
    group = TaskGroup("test")
    stop = asyncio.Event()

    async def until_told() -> None:
        await stop.wait()

    task = group.start_soon(until_told())
    waiting = asyncio.ensure_future(group.wait())
    await asyncio.wait([waiting], timeout=0)
    assert not waiting.done()  # the task runs on: wait cancels nothing
    stop.set()
    await waiting
    assert task.done()
    assert not task.cancelled()
    await group.aclose()


class _Steps(Component):
    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.steps: list[str] = []

    async def start(self) -> None:
        self.steps.append("start")
        if self.fail:
            raise OSError("refused")

    async def stop(self) -> None:
        self.steps.append("stop")


async def test_a_component_is_stopped_when_left_and_when_its_start_fails() -> None:
    async with _Steps(fail=False) as good:
        assert good.steps == ["start"]
    assert good.steps == ["start", "stop"]
    refusing = _Steps(fail=True)
    with pytest.raises(OSError, match="refused"):
        await refusing.__aenter__()
    assert refusing.steps == ["start", "stop"]  # what the start did is undone; its error goes on
