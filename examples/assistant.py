"""A durable research assistant, for `electric dev examples.assistant:app` (model-free: its tools
and model are fakes that take real time).

- Each message is a question: a recorded search step (retried on
  ConnectionError, 5 s per try) and a recorded answer step. A worker killed
  mid-run costs nothing already done: the run delivered again replays the
  recorded steps and runs only the rest.
- ``ctx.state["history"]`` keeps the conversation, ``ctx.state["prefs"]``
  the user's preferences: both survive worker and server restarts, SIGHUP
  reloads and idle timeouts (read them with `electric state assistant/ID`).
- SIGUSR ``{"tone": "short"}`` steers the next answer, even mid-run.
- SIGTERM writes a summary of the conversation (a ``summary`` event) within
  the grace period.
"""

from __future__ import annotations

import os
from typing import Any

import anyio

from electric_sdk.lifecycle import Signal
from electric_sdk.runtime import App, Context, Message, Retry, SignalInfo

app = App("assistant")

STEP_S = float(os.environ.get("ASSISTANT_STEP_S", "0.5"))  # how long each fake call takes
SEARCH_RETRY = Retry(attempts=4, backoff="200ms", on=(ConnectionError,))


async def search(query: str) -> list[str]:
    """A fake search tool: three sources about the query."""
    await anyio.sleep(STEP_S)
    return [f"{source}: notes on {query}" for source in ("web", "papers", "wiki")]


async def answer(question: str, sources: list[str], tone: str) -> str:
    """A fake model: a long or a short answer from the sources."""
    await anyio.sleep(STEP_S)
    if tone == "short":
        return f"{question}: see {len(sources)} sources."
    return f"On {question!r}, {len(sources)} sources agree: " + "; ".join(sources) + "."


@app.entity("assistant", grace_period="10s", idle_timeout="5m")
class Assistant:
    async def on_message(self, ctx: Context, message: Message) -> str:
        history = ctx.state.list("history", dict)
        history.append({"role": "user", "text": message.text})
        sources = await ctx.step("tool:search", search, message.text, retry=SEARCH_RETRY, timeout="5s")
        tone = ctx.state.map("prefs", str).get("tone") or "long"  # SIGUSR may have changed it
        reply = await ctx.step("model:answer", answer, message.text, sources, tone, timeout="30s")
        history.append({"role": "assistant", "text": reply})
        ctx.output.write(reply)
        return reply

    async def on_signal(self, ctx: Context, signal: SignalInfo) -> None:
        payload: Any = signal.payload
        if signal.signal is Signal.SIGUSR and isinstance(payload, dict) and "tone" in payload:
            ctx.state.map("prefs", str)["tone"] = str(payload["tone"])
        elif signal.signal is Signal.SIGTERM:
            turns = ctx.state.list("history", dict)
            questions = [turn["text"] for turn in turns if turn["role"] == "user"]
            await ctx.emit("summary", {"turns": len(turns), "questions": questions})
