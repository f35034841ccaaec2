"""Entity types for the `electric run` and worker-drain tests, hosted by real `electric worker` processes.

A message's text says what its run does, so a test drives each run from outside:

- ``hold PATH``: writes "partial", then a step that waits until PATH exists (the test
  creates it when it wants the run to go on), then writes " done";
- ``fail``: raises, so the run is recorded FAILED;
- anything else: one quick step that echoes the text, and a custom ``progress`` event.

Every output names the worker process's pid, so a test can tell which worker ran it.
``app`` hosts the type ``headless``; ``late_app`` hosts ``headless_late``, which no worker
hosts until a test starts one for it.
"""

from __future__ import annotations

import os

import anyio

from electric_sdk.runtime import App, Context, Message

# How often a held step looks for its file. Polling with anyio.sleep keeps the step
# cancellable at once (a SIGINT aborts it mid-wait); a thread blocked on a FIFO would not be.
POLL_S = 0.01


async def _run(ctx: Context, message: Message) -> None:
    command, _, argument = message.text.partition(" ")
    if command == "hold":
        ctx.output.write(f"partial pid={os.getpid()}")
        async with ctx.step("tool:hold"):
            # The file is created by the test process: no event of ours can say it is there.
            while not await anyio.Path(argument).exists():  # noqa: ASYNC110
                await anyio.sleep(POLL_S)
        async with ctx.step("tool:finish"):  # a SIGTERM during the hold stops the run here
            ctx.output.write(" done")
    elif command == "fail":
        async with ctx.step("tool:fail"):
            raise RuntimeError("asked to fail")
    else:
        async with ctx.step("tool:echo"):
            ctx.output.write(f"echo {message.text} pid={os.getpid()}")
        await ctx.emit("progress", {"text": message.text})


def _app(type_name: str) -> App:
    app = App(code_version="headless-test")

    @app.entity(type_name, grace_period="5s", idle_timeout="60s")
    async def headless(ctx: Context, message: Message) -> None:
        await _run(ctx, message)

    return app


app = _app("headless")
late_app = _app("headless_late")
