"""A worker warns once when a step's declared timeout is longer than its type's grace (issue 46,
point 2): a SIGTERM during that step may stop the entity at the deadline without its cleanup.
A type that opts in to ``sigterm_interrupts`` is not warned: its SIGTERM cuts the step."""

from __future__ import annotations

from pathlib import Path

import pytest

from electric_sdk.runtime import App, Context, Message
from electric_sdk.testing import TestServer

from .rt_support import COMPLETED, on_log, run_status, running_worker, until

pytestmark = pytest.mark.anyio

WARNING = "longer than the 0.3 s grace"


def slow_app() -> App:
    app = App(code_version="test")

    async def call() -> str:
        return "ok"

    @app.entity("long", grace_period="300ms")
    async def long(ctx: Context, message: Message) -> None:
        await ctx.step("model:answer", call, timeout="2s")
        await ctx.step("model:short", call, timeout="100ms")

    @app.entity("cut", grace_period="300ms", sigterm_interrupts=True)
    async def cut(ctx: Context, message: Message) -> None:
        await ctx.step("model:answer", call, timeout="2s")

    return app


async def test_a_step_longer_than_the_grace_is_warned_of_once(tmp_path: Path) -> None:
    warnings: list[str] = []
    with TestServer(tmp_path / "electric") as server, on_log(WARNING, lambda: warnings.append("")):
        async with server.async_client() as client, running_worker(slow_app(), server.address):
            for ref in ("long/a", "long/b", "cut/c"):
                await client.spawn(ref)
                for text in ("one", "two"):
                    receipt = await client.send(ref, text)
                    await until(client, ref, run_status(COMPLETED, receipt.key))
    assert len(warnings) == 1  # model:answer of `long`, once; not model:short, nor `cut`
