"""Model-free example agents whose steps take real time, for `electric dev examples.agents:app`.

- ``research``: plans, searches, reads and writes a report: several tool and
  model steps, about 12 s in all. SIGINT mid-step aborts it with the
  partial report; SIGTERM stops it at the next step boundary, then cleans up;
  SIGUSR ``{"focus": "..."}`` redirects the remaining steps.
- ``chat``: answers each message word by word (one model step per reply).
"""

from __future__ import annotations

from typing import Any

import anyio

from electric_sdk.runtime import App, Context, Message, SignalInfo

app = App("examples")

# How long each fake tool or model call takes: a run lasts about 12 s, long enough to signal it by
# hand (the README's SIGINT step), while SIGTERM's next step boundary stays well within the grace.
STEP_S = 2.0


@app.entity("research", grace_period="10s", idle_timeout="60s")
class Research:
    """A research agent: plan → search ×3 → read → write, with a focus SIGUSR can change."""

    def __init__(self) -> None:
        self.focus: str | None = None
        self.reports = 0

    async def on_message(self, ctx: Context, message: Message) -> str:
        topic = message.text or "something"
        async with ctx.step("model:plan"):
            await anyio.sleep(STEP_S)
            ctx.output.write(f"# Research: {topic}\n")
        for source in ("web", "papers", "notes"):
            async with ctx.step(f"tool:search:{source}"):
                await anyio.sleep(STEP_S)
                angle = f" (focus: {self.focus})" if self.focus else ""
                ctx.output.write(f"- searched {source} for {topic}{angle}\n")
        async with ctx.step("tool:read"):
            await anyio.sleep(STEP_S)
            ctx.output.write("- read 3 sources\n")
        async with ctx.step("model:write"):
            for word in f"{topic} is well covered; see the sources above.".split():
                await anyio.sleep(STEP_S / 8)
                ctx.output.write(word + " ")
        self.reports += 1
        await ctx.emit("report", {"topic": topic, "reports": self.reports})
        return ctx.output.text

    async def on_signal(self, ctx: Context, signal: SignalInfo) -> None:
        payload: Any = signal.payload
        if signal.signal.value == "SIGUSR" and isinstance(payload, dict) and "focus" in payload:
            self.focus = str(payload["focus"])  # the run loop reads it at its next step
            await ctx.emit("focus_changed", {"focus": self.focus})
        elif signal.signal.value == "SIGINT":
            await ctx.emit("interrupted", {"partial_chars": len(signal.partial_output or "")})
        elif signal.signal.value == "SIGTERM":
            async with ctx.step("cleanup:save"):
                await anyio.sleep(STEP_S / 2)  # save state, well within the grace
            await ctx.emit("saved", {"reports": self.reports})


@app.entity("chat", grace_period="5s", idle_timeout="30s")
async def chat(ctx: Context, message: Message) -> None:
    """Echo the message back word by word, as a model would stream it."""
    async with ctx.step("model:reply"):
        for word in f"You said: {message.text}".split():
            await anyio.sleep(0.15)
            ctx.output.write(word + " ")
