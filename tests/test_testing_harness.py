"""electric_sdk.testing's harness: an entity's handlers called directly, without a server, with
a clock the test moves (a 30 s grace takes no time)."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import anyio
import anyio.to_thread
import httpx
import pytest
from helpers import emitter_app
from runtime.rt_support import COMPLETED, run_status, running_worker, until

from electric_sdk.durable_state import STEP_EVENT
from electric_sdk.lifecycle import Signal, State
from electric_sdk.models import Event
from electric_sdk.runtime import App, Context, Message, SignalInfo
from electric_sdk.testing import EntityHarness, ManualClock, TestServer

pytestmark = pytest.mark.anyio


class Gates:
    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.release = anyio.Event()
        self.calls: dict[str, int] = {}
        self.signals: list[SignalInfo] = []


def agent_app(g: Gates, *, sigterm_interrupts: bool = False) -> App:
    app = App(code_version="test")

    @app.entity("agent", grace_period="30s", idle_timeout="60s", sigterm_interrupts=sigterm_interrupts)
    class Agent:
        async def on_message(self, ctx: Context, message: Message) -> str:
            ctx.state["history"].append(message.text)
            if message.text in ("hold", "unwind"):
                ctx.output.write("partial")
                try:
                    async with ctx.step("tool:hold"):
                        g.entered.set()
                        await g.release.wait()
                finally:
                    if message.text == "unwind":
                        ctx.output.write(" (cut)")  # written while a cut run unwinds
                async with ctx.step("tool:after"):
                    ctx.output.write(" after")
                return ""
            first = await ctx.step("tool:search", self.search, message.text)
            second = await ctx.step("model:answer", self.answer, first)
            return f"{first} {second} tone={ctx.state['prefs'].get('tone', '-')}"

        def search(self, text: str) -> str:
            g.calls["search"] = g.calls.get("search", 0) + 1
            return f"found:{text}"

        async def answer(self, found: str) -> str:
            g.calls["answer"] = g.calls.get("answer", 0) + 1
            if g.calls["answer"] == 1 and found == "found:crash":
                g.entered.set()
                await g.release.wait()  # the worker dies here
            return "answered"

        async def on_signal(self, ctx: Context, signal: SignalInfo) -> None:
            g.signals.append(signal)
            if signal.signal is Signal.SIGUSR:
                ctx.state["prefs"]["tone"] = signal.payload
            if signal.signal is Signal.SIGTERM:
                await g.release.wait()  # a cleanup that waits (for the test's release or the grace)

    return app


async def test_a_run_with_state_steps_and_a_handler() -> None:
    g = Gates()
    async with EntityHarness(agent_app(g), "agent") as h:
        await h.signal("SIGUSR", payload="brief")
        run = await h.send("q")
        assert (run.status, run.output) == ("completed", "found:q answered tone=brief")
        assert h.state == {"prefs": {"tone": "brief"}, "history": ["q"]}
        steps = [e.value["data"] for e in h.events if e.type == "electric.step"]
        assert [(s["name"], s["outcome"]) for s in steps] == [("tool:search", "ok"), ("model:answer", "ok")]


async def test_an_emit_a_server_would_refuse_raises_in_the_harness_too() -> None:
    """The server's rule for custom event types (electric_sdk.event_types) holds without one."""
    async with EntityHarness(emitter_app(), "emitter") as h:
        for kind, said in [
            ("state", "INVALID_EVENT_TYPE"),
            ("two\nlines", "INVALID_EVENT_TYPE"),
            ("", "INVALID_EVENT_TYPE"),
            ("x" * 129, "INVALID_EVENT_TYPE"),
            ("electric.mine", "RESERVED_EVENT_TYPE"),
            ("fine", "kept"),
        ]:
            assert (await h.send(kind)).output.startswith(said), kind
        assert [e.type for e in h.events if e.type != "run"].count("fine") == 1
        assert not {"state", "two\nlines", "", "x" * 129} & {e.type for e in h.events}


async def test_a_run_delivered_again_replays_its_recorded_steps() -> None:
    g = Gates()
    async with EntityHarness(agent_app(g), "agent") as h:
        first = h.start("crash")
        await g.entered.wait()
        await h.crash()
        assert first.status == "lost"
        assert h.state == {"history": ["crash"]}  # written with the search step's record
        run = await h.send("crash", key=first.message.key, attempt=2)
        assert run.status == "completed"
        assert g.calls == {"search": 1, "answer": 2}  # the recorded search was replayed
        assert h.state == {"history": ["crash"]}  # not appended twice


async def test_sigint_aborts_at_once_and_the_handler_names_the_run() -> None:
    g = Gates()
    async with EntityHarness(agent_app(g), "agent") as h:
        run = h.start("hold")
        await g.entered.wait()
        await h.signal(Signal.SIGINT)
        assert (await run.wait()).status == "aborted"
        assert run.output == "partial"
        assert (g.signals[-1].signal, g.signals[-1].message_key) == (Signal.SIGINT, run.message.key)
        assert g.signals[-1].partial_output == "partial"


async def test_sigint_does_not_wait_for_a_thread() -> None:
    app = App(code_version="test")
    gate = anyio.Event()
    finished: list[str] = []

    def block() -> None:
        while not finished:
            time.sleep(0.001)

    @app.entity("t")
    async def t(ctx: Context, message: Message) -> None:
        gate.set()
        await anyio.to_thread.run_sync(block)

    async with EntityHarness(app, "t") as h:
        run = h.start("x")
        await gate.wait()
        await h.signal(Signal.SIGINT)
        assert (await run.wait()).status == "aborted"
        finished.append("done")  # the abandoned thread ends now


async def test_a_30s_grace_expires_when_the_clock_says_so() -> None:
    g, clock = Gates(), ManualClock()
    async with EntityHarness(agent_app(g), "agent", clock=clock) as h:  # the type's grace: 30 s
        await h.signal("SIGTERM")
        assert h.lifecycle is State.STOPPING
        assert h.grace_deadline == clock.now() + timedelta(seconds=30)
        clock.advance(29.999)
        await anyio.lowlevel.checkpoint()
        assert h.lifecycle is State.STOPPING
        clock.advance(0.001)
        assert await h.wait_lifecycle(State.STOPPED) is State.STOPPED
        assert h.causes[-1] == "grace_expired"  # no wall time passed: only the clock moved


async def test_sigterm_stops_the_run_at_its_next_step_and_the_cleanup_gets_its_output() -> None:
    g = Gates()
    async with EntityHarness(agent_app(g), "agent") as h:
        run = h.start("hold")
        await g.entered.wait()
        await h.signal("SIGTERM")
        g.release.set()
        assert (await run.wait()).status == "aborted"
        await h.wait_lifecycle(State.STOPPED)
        assert h.causes[-1] == "cleanup_complete"
        assert g.signals[-1].partial_output == "partial"


async def test_a_sigterm_that_interrupts_cuts_the_step_and_the_cleanup_gets_its_output() -> None:
    g = Gates()
    async with EntityHarness(agent_app(g, sigterm_interrupts=True), "agent") as h:
        run = h.start("hold")
        await g.entered.wait()
        await h.signal("SIGTERM")  # the step is never released: the SIGTERM cuts it
        assert (await run.wait()).status == "aborted"
        g.release.set()  # the cleanup's own wait
        await h.wait_lifecycle(State.STOPPED)
        assert h.causes[-1] == "cleanup_complete"
        assert g.signals[-1].partial_output == "partial"
        assert h.state == {"history": ["hold"]}


async def test_an_interrupted_cleanup_gets_the_output_at_the_cut_as_on_a_worker() -> None:
    """As tests/runtime/test_state_at_the_end.py shows on a worker: the cleanup's partial output
    is the run's output when the SIGTERM cut it; the run's record has what it wrote unwinding."""
    g = Gates()
    async with EntityHarness(agent_app(g, sigterm_interrupts=True), "agent") as h:
        run = h.start("unwind")
        await g.entered.wait()
        await h.signal("SIGTERM")
        ended = await run.wait()
        assert (ended.status, ended.output) == ("aborted", "partial (cut)")
        g.release.set()  # the cleanup's own wait
        await h.wait_lifecycle(State.STOPPED)
        assert g.signals[-1].partial_output == "partial"


async def test_the_idle_timeout_counts_on_the_clock_and_a_message_wakes_it() -> None:
    g, clock = Gates(), ManualClock()
    idle = timedelta(minutes=5)  # the test's own, over the type's 60 s
    async with EntityHarness(agent_app(g), "agent", clock=clock, idle_timeout=idle) as h:
        await h.send("q")
        clock.advance(299)
        await anyio.lowlevel.checkpoint()
        assert h.lifecycle is State.RUNNING
        clock.advance(1)
        await h.wait_lifecycle(State.IDLE)
        assert h.causes == ["idle_timeout"]
        await h.signal("SIGUSR", payload="x")  # idle: ignored, no handler runs
        assert g.signals == []
        await h.send("again")
        assert h.causes == ["idle_timeout", "wake"]


def talker_app() -> App:
    app = App(code_version="test")

    @app.entity("talker")
    class Talker:
        async def on_message(self, ctx: Context, message: Message) -> str:
            ctx.state["seen"].append(message.text)
            found = await ctx.step("tool:look", lambda: f"found {message.text}")
            async with ctx.step("tool:think"):  # a step as a block: a run event marks its start
                ctx.output.write("thought ")
            await ctx.emit("note", {"text": message.text, "n": [1, 2.5, True, None]})
            return found

        async def on_signal(self, ctx: Context, signal: SignalInfo) -> None:
            await ctx.emit("steered", signal.payload)

    return app


def _by_type(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e.type == kind]


async def test_the_harness_the_client_and_the_http_stream_give_one_event_shape(tmp_path: Path) -> None:
    """Issue 47: events read through the harness, the client (``events()``, ``watch()``) and the HTTP
    stream come in one shape: the harness's and the client's are ``Event``s with the same fields,
    and ``to_json()`` is what the HTTP stream sends."""
    app = talker_app()
    async with EntityHarness(app, "talker") as h:
        await h.send("hello")
        await h.signal("SIGUSR", payload={"tone": "short"})
    harness = h.events

    with TestServer(tmp_path / "electric", http="127.0.0.1:0") as server:
        async with server.async_client() as client, running_worker(app, server.address):
            await client.spawn("talker/t1")
            await client.send("talker/t1", "hello")
            await until(client, "talker/t1", run_status(COMPLETED))
            await client.signal("talker/t1", "SIGUSR", payload={"tone": "short"})
            steered = await until(client, "talker/t1", lambda e: e.type == "steered")
            # The signal's outcome is written after the handler's event: every read below waits
            # for it, so that each sees the same stream.
            await until(client, "talker/t1", lambda e: e.type == "signal" and e.operation == "update")
            page = await client.events("talker/t1", 0, limit=1000)
            watched = []
            async for event in client.watch("talker/t1"):
                watched.append(event)
                if event.offset == steered.offset:
                    break
            async with httpx.AsyncClient(base_url=server.http_address) as http:
                got = await http.get("/talker/t1/events", params={"offset": 0, "limit": 1000})
                assert got.status_code == 200, got.text
                over_http = got.json()["events"]
    read = list(page.events)
    assert all(type(e) is Event for e in [*harness, *read, *watched])
    assert watched == read[: len(watched)]
    assert [e.to_json() for e in read] == over_http
    assert {tuple(e.to_json()) for e in harness} == {tuple(e.to_json()) for e in read}  # the same fields

    # The run as the stream records it: its message, start, records, steps and end, in order.
    def run(events: list[Event]) -> list[tuple[str, str, str]]:
        kinds = ("message", "run", "note", STEP_EVENT)
        return [(e.type, e.operation, e.value.get("status", "")) for e in events if e.type in kinds]

    assert run(harness) == run(read)
    # What the entity's code wrote reads the same from the harness as from the server.
    for kind in ("note", "steered"):
        assert [e.value for e in _by_type(harness, kind)] == [e.value for e in _by_type(read, kind)]
    [h_step], [s_step] = (
        [e for e in _by_type(events, "run") if e.value["status"] == "step"] for events in (harness, read)
    )
    assert set(h_step.value) == set(s_step.value)
    assert (h_step.value["step"], h_step.value["attempt"]) == (s_step.value["step"], s_step.value["attempt"])
    [h_record], [s_record] = (_by_type(events, STEP_EVENT) for events in (harness, read))
    data = ("name", "outcome", "result", "ops")
    assert [h_record.value["data"][k] for k in data] == [s_record.value["data"][k] for k in data]
    h_signal, s_signal = _by_type(harness, "signal")[-1], _by_type(read, "signal")[-1]  # as settled
    same = ("signal", "payload", "outcome", "previous_state", "new_state")  # the sender is whoever sent
    assert [h_signal.value[k] for k in same] == [s_signal.value[k] for k in same]


async def test_a_run_that_asks_ends_input_required_in_the_harness() -> None:
    """ctx.ask ends the run as on a server; the harness records the question (it has no reply)."""
    app = App("asking")

    @app.entity("asker")
    async def asker(ctx: Context, message: Message) -> None:
        await ctx.ask(f"why {message.text}?")

    async with EntityHarness(app, "asker") as h:
        run = await h.send("now")
        assert (run.status, run.question) == ("input_required", "why now?")
        ended = [e.value for e in h.events if e.type == "run" and e.value["status"] == "input_required"]
        assert [e["question"] for e in ended] == ["why now?"]
