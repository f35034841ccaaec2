"""The app `electric worker --metrics` hosts in tests/runtime/test_worker_metrics.py.

``probe`` answers each message by its text: ``fail`` raises, ``wait`` waits until a
SIGINT aborts it, anything else completes. Its only handler is ``on_sigusr``: a payload
of ``"fail"`` makes it raise. Both outcomes are records the worker writes after the
handler returned, so a test that sees them knows the handler's latency was counted.
"""

from __future__ import annotations

import anyio

from electric_sdk.runtime import App, Context, Message, SignalInfo

app = App("metrics-probe")


@app.entity("probe", idle_timeout="10m")
class Probe:
    async def on_message(self, ctx: Context, message: Message) -> str:
        if message.text == "fail":
            raise RuntimeError("asked to fail")
        if message.text == "wait":
            async with ctx.step("wait"):
                await anyio.sleep_forever()
        return "done"

    async def on_sigusr(self, ctx: Context, signal: SignalInfo) -> None:
        if signal.payload == "fail":
            raise RuntimeError("asked to fail")
