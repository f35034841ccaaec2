"""The RFC's signal table, cell by cell, end to end: a real server, a real worker, real signals.

Each test drives a fresh entity into a state with real signals and runs, sends one
signal, and checks three things against the RFC (the table below is typed from the
RFC, not derived from ``electric_sdk.lifecycle``):

1. the response: previous_state / new_state, or INVALID_SIGNAL with nothing written;
2. the event log: the signal record, the state record when the cell transitions, and
   the signal's final outcome (written by the server, or by the runtime as an update);
3. the behaviour: run aborted or not, handler called or not, messages delivered or queued.

``running`` (and, for SIGINT and SIGUSR, ``paused``) is covered both with a run in
progress (a step held open on a gate the test releases) and without one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime

import anyio
import pytest

from electric_sdk import AsyncClient, Event, errors
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import Signal, State
from electric_sdk.runtime import App, Context, Message, SignalInfo, Worker
from electric_sdk.testing import TestServer

pytestmark = pytest.mark.anyio

TIMEOUT_S = 10.0
REJECT = "server rejects"

# The RFC's table, typed from the RFC. A cell: (new state, final outcome of the signal
# record), or REJECT. "ignored"/"delivered"/"aborted" cells keep the state.
# Outcomes: ignored, transitioned, delivered, aborted, shutdown_requested (SIGHUP's
# "shuts down after the run", SIGTERM's cleanup asked for).
# fmt: off
SIGNALS = ["SIGINT", "SIGHUP", "SIGTERM", "SIGKILL", "SIGSTOP", "SIGCONT", "SIGUSR"]
RFC_TABLE: dict[str, list[tuple[str, str] | str]] = {
    #             SIGINT                     SIGHUP                              SIGTERM                              SIGKILL                     SIGSTOP                    SIGCONT                    SIGUSR
    "spawning": [("spawning", "ignored"),   ("spawning", "ignored"),            ("spawning", "ignored"),             ("killed", "transitioned"), ("spawning", "ignored"),   ("spawning", "ignored"),   ("spawning", "ignored")],
    "running":  [("running", "aborted"),    ("running", "shutdown_requested"),  ("stopping", "shutdown_requested"),  ("killed", "transitioned"), ("paused", "transitioned"), ("running", "ignored"),   ("running", "delivered")],
    "idle":     [("idle", "ignored"),       ("idle", "ignored"),                ("stopped", "transitioned"),         ("killed", "transitioned"), ("paused", "transitioned"), ("idle", "ignored"),      ("idle", "ignored")],
    "paused":   [("paused", "ignored"),     ("paused", "ignored"),              ("stopping", "shutdown_requested"),  ("killed", "transitioned"), ("paused", "ignored"),     ("running", "transitioned"), ("paused", "ignored")],
    "stopping": [("stopping", "ignored"),   ("stopping", "ignored"),            ("stopping", "ignored"),             ("killed", "transitioned"), ("stopping", "ignored"),   ("stopping", "ignored"),   ("stopping", "ignored")],
    "stopped":  [REJECT, REJECT, REJECT, REJECT, REJECT, REJECT, REJECT],
    "killed":   [REJECT, REJECT, REJECT, REJECT, REJECT, REJECT, REJECT],
}
# fmt: on

# "running" in the table means "with a run in progress" for SIGINT ("aborts current
# run"); with no run a SIGINT finds nothing to abort (ARCHITECTURE §2: ignored).
# "paused" with the run SIGSTOP let finish still in progress: SIGINT aborts it and
# SIGUSR reaches the handler (ARCHITECTURE §2 clarifications).
OVERRIDES: dict[tuple[str, str], tuple[str, str]] = {
    ("running-idle", "SIGINT"): ("running", "ignored"),
    ("paused-busy", "SIGINT"): ("paused", "aborted"),
    ("paused-busy", "SIGUSR"): ("paused", "delivered"),
}

# Scenario → table row. "running-busy": a step held open; "running-idle": no run.
SCENARIOS: dict[str, str] = {
    "spawning": "spawning",
    "running-busy": "running",
    "running-idle": "running",
    "idle": "idle",
    "paused": "paused",
    "stopping": "stopping",
    "stopped": "stopped",
    "killed": "killed",
}


def row(scenario: str) -> str:
    return SCENARIOS.get(scenario, "paused")  # "paused-busy" is a `paused` cell too


def expected(scenario: str, signal: str) -> tuple[str, str] | str:
    if (scenario, signal) in OVERRIDES:
        return OVERRIDES[scenario, signal]
    return RFC_TABLE[row(scenario)][SIGNALS.index(signal)]


CASES = [(scenario, signal) for scenario in SCENARIOS for signal in SIGNALS] + [
    ("paused-busy", "SIGINT"),
    ("paused-busy", "SIGUSR"),
]


# -- the probe entity type -------------------------------------------------------------------


@dataclass
class Probe:
    """What the entity code did, and the gates the test opens."""

    release: anyio.Event = field(default_factory=anyio.Event)
    entered: anyio.Event = field(default_factory=anyio.Event)
    cleanup_entered: anyio.Event = field(default_factory=anyio.Event)
    cleanup_release: anyio.Event | None = None
    seen: dict[str, anyio.Event] = field(default_factory=lambda: {s: anyio.Event() for s in SIGNALS})
    log: list[str] = field(default_factory=list)
    signals: list[SignalInfo] = field(default_factory=list)
    step_open: bool = False
    usr_during_step: bool | None = None

    def handled(self, signal: str) -> int:
        return sum(1 for s in self.signals if s.signal.value == signal)


def make_app(probe: Probe) -> App:
    app = App(code_version="conformance")

    @app.entity("agent", grace_period="10s", idle_timeout="30s")
    class Agent:
        async def on_message(self, ctx: Context, message: Message) -> None:
            probe.log.append(f"start {message.text}")
            if message.text == "hold":
                ctx.output.write("partial")
                async with ctx.step("tool:hold"):
                    probe.step_open = True
                    probe.entered.set()
                    try:
                        await probe.release.wait()
                    finally:
                        probe.step_open = False
                        probe.log.append("step released")
                ctx.output.write(" more")
                async with ctx.step("model:after"):
                    probe.log.append("after step")
            else:
                async with ctx.step("tool:quick"):
                    ctx.output.write(f"done {message.text}")
            probe.log.append(f"end {message.text}")

        async def on_signal(self, ctx: Context, signal: SignalInfo) -> None:
            probe.log.append(f"signal {signal.signal.value}")
            probe.signals.append(signal)
            if signal.signal is Signal.SIGUSR:
                probe.usr_during_step = probe.step_open
            if signal.signal is Signal.SIGTERM:
                probe.cleanup_entered.set()
                if probe.cleanup_release is not None:
                    await probe.cleanup_release.wait()
                probe.log.append("cleanup done")
            probe.seen[signal.signal.value].set()

    return app


@asynccontextmanager
async def running_worker(app: App, address: str) -> AsyncIterator[Worker]:
    worker = Worker(app, address)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(TIMEOUT_S):
            await tg.start(worker.run)
        try:
            yield worker
        finally:
            with anyio.fail_after(TIMEOUT_S):
                await worker.shutdown(0.2)


# -- stream helpers --------------------------------------------------------------------------

ABORTED, COMPLETED, STARTED = pb.RUN_STATUS_ABORTED, pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_STARTED


def run_status(status: int, message_key: str) -> Callable[[Event], bool]:
    return lambda e: e.type == "run" and e.raw.run.status == status and e.raw.run.message_key == message_key


def state_is(state: str, cause: str | None = None) -> Callable[[Event], bool]:
    return lambda e: (
        e.type == "state" and e.value["state"] == state and (cause is None or e.value["cause"] == cause)
    )


async def until(client: AsyncClient, ref: str, predicate: Callable[[Event], bool], start: int = 0) -> Event:
    with anyio.fail_after(TIMEOUT_S):
        async for event in client.watch(ref, start):
            if predicate(event):
                return event
    raise AssertionError(f"{ref}: the stream ended before the awaited event")


async def until_closed(client: AsyncClient, ref: str) -> list[Event]:
    """Every event, once the stream has closed (EOF: the entity is terminal and quiet)."""
    out: list[Event] = []
    with anyio.fail_after(TIMEOUT_S):
        async for event in client.watch(ref, 0):
            out.append(event)
    return out


async def all_events(client: AsyncClient, ref: str) -> list[Event]:
    return list((await client.events(ref, 0, 1000)).events)


async def wait_gate(event: anyio.Event) -> None:
    with anyio.fail_after(TIMEOUT_S):
        await event.wait()


def final_outcome(key: str) -> Callable[[Event], bool]:
    return lambda e: e.type == "signal" and e.key == key and e.value.get("outcome") not in (None, "pending")


# -- driving an entity into each state -------------------------------------------------------


@dataclass
class Setup:
    ref: str
    held: str | None = None  # key of the message whose step is held open
    queued: str | None = None  # key of a message sent while paused


async def to_running_idle(client: AsyncClient, ref: str) -> Setup:
    await client.spawn(ref)
    await client.wait_for_state(ref, "running", timeout=TIMEOUT_S)
    return Setup(ref)


async def to_running_busy(client: AsyncClient, probe: Probe, ref: str) -> Setup:
    await client.spawn(ref)
    receipt = await client.send(ref, "hold")
    await wait_gate(probe.entered)
    assert (await client.get(ref)).state is State.RUNNING
    return Setup(ref, held=receipt.key)


async def to_paused(client: AsyncClient, setup: Setup) -> Setup:
    result = await client.pause(setup.ref)
    assert (result.previous_state, result.new_state) == (State.RUNNING, State.PAUSED)
    setup.queued = (await client.send(setup.ref, "queued")).key
    return setup


async def drive(scenario: str, client: AsyncClient, probe: Probe, name: str) -> Setup:
    ref = f"agent/{name}"
    if scenario == "spawning":
        orphan = f"orphan/{name}"  # a type no worker hosts: it stays spawning
        await client.spawn(orphan)
        return Setup(orphan)
    if scenario == "running-idle":
        return await to_running_idle(client, ref)
    if scenario == "running-busy":
        return await to_running_busy(client, probe, ref)
    if scenario == "idle":
        await client.spawn(ref, idle_timeout="200ms")
        await client.wait_for_state(ref, "idle", timeout=TIMEOUT_S)
        return Setup(ref)
    if scenario == "paused":
        return await to_paused(client, await to_running_idle(client, ref))
    if scenario == "paused-busy":
        return await to_paused(client, await to_running_busy(client, probe, ref))
    if scenario == "stopping":
        probe.cleanup_release = anyio.Event()
        setup = await to_running_idle(client, ref)
        term = await client.terminate(ref)
        assert term.new_state is State.STOPPING
        await wait_gate(probe.cleanup_entered)  # the cleanup is under way, held on a gate
        return setup
    if scenario == "stopped":
        await client.spawn(ref, idle_timeout="200ms")
        await client.wait_for_state(ref, "idle", timeout=TIMEOUT_S)
        assert (await client.terminate(ref)).new_state is State.STOPPED
        await until_closed(client, ref)
        return Setup(ref)
    if scenario == "killed":
        await to_running_idle(client, ref)
        assert (await client.kill(ref)).new_state is State.KILLED
        await until_closed(client, ref)
        return Setup(ref)
    raise AssertionError(scenario)


# -- the behaviour each cell must show ---------------------------------------------------------


async def completes(client: AsyncClient, ref: str, text: str) -> Event:
    """Send a message; it runs to completion (the entity takes new work)."""
    receipt = await client.send(ref, text)
    return await until(client, ref, run_status(COMPLETED, receipt.key))


async def resumes_queued_after(client: AsyncClient, setup: Setup, sigcont_key: str) -> None:
    """The message queued while paused runs only after SIGCONT, with no reload in between."""
    assert setup.queued is not None
    done = await until(client, setup.ref, run_status(COMPLETED, setup.queued))
    events = await all_events(client, setup.ref)
    sigcont = next(e for e in events if e.type == "signal" and e.key == sigcont_key)
    started = next(e for e in events if run_status(STARTED, setup.queued)(e))
    assert sigcont.offset < started.offset < done.offset
    assert not any(state_is("idle")(e) and e.offset > sigcont.offset for e in events)


async def stays_queued_until_sigcont(client: AsyncClient, setup: Setup, state: State) -> None:
    assert (await client.get(setup.ref)).state is state
    events = await all_events(client, setup.ref)
    assert setup.queued is not None
    assert not any(run_status(STARTED, setup.queued)(e) for e in events)
    resumed = await client.resume(setup.ref)
    assert (resumed.previous_state, resumed.new_state) == (state, State.RUNNING)
    await resumes_queued_after(client, setup, resumed.key)


async def killed_and_closed(client: AsyncClient, worker: Worker, probe: Probe, ref: str) -> list[Event]:
    events = await until_closed(client, ref)
    with anyio.fail_after(TIMEOUT_S):
        await worker.wait_host(ref, gone=True)
    assert events[-1].type != "state" or events[-1].value["state"] == "killed"
    assert [e.value["state"] for e in events if e.type == "state"][-1] == "killed"
    assert probe.handled("SIGKILL") == 0
    return events


async def check_behaviour(
    scenario: str,
    signal: str,
    setup: Setup,
    result_key: str,
    client: AsyncClient,
    worker: Worker,
    probe: Probe,
) -> None:
    ref = setup.ref
    if scenario == "spawning":
        if signal == "SIGKILL":
            await until_closed(client, ref)
        else:
            assert (await client.get(ref)).state is State.SPAWNING
        return

    if scenario == "running-busy":
        assert setup.held is not None
        if signal == "SIGINT":  # aborts the run now, mid-step, with its partial output
            aborted = await until(client, ref, run_status(ABORTED, setup.held))
            assert aborted.raw.run.output == "partial"
            await wait_gate(probe.seen["SIGINT"])
            assert probe.signals[-1].partial_output == "partial"
            assert "after step" not in probe.log
            assert (await client.get(ref)).state is State.RUNNING
            await completes(client, ref, "next")
        elif signal == "SIGHUP":  # the run finishes on the current code, then idle at once
            assert probe.step_open
            probe.release.set()
            done = await until(client, ref, run_status(COMPLETED, setup.held))
            assert done.raw.run.output == "partial more"
            idle = await until(client, ref, state_is("idle", "reload"))
            assert done.offset < idle.offset
        elif signal == "SIGTERM":  # the step finishes, the run stops at the next one, cleanup runs
            assert probe.step_open
            assert probe.handled("SIGTERM") == 0
            probe.release.set()
            stopped = await until(client, ref, state_is("stopped", "cleanup_complete"))
            events = await all_events(client, ref)
            aborted = next(e for e in events if run_status(ABORTED, setup.held)(e))
            assert aborted.raw.run.output == "partial more"  # written between the two steps
            assert aborted.offset < stopped.offset
            assert probe.log[-3:] == ["step released", "signal SIGTERM", "cleanup done"]
        elif signal == "SIGKILL":  # everything cancelled now, no handler
            aborted = await until(client, ref, run_status(ABORTED, setup.held))
            assert aborted.raw.run.output == "partial"
            await killed_and_closed(client, worker, probe, ref)
            assert "after step" not in probe.log
            assert not probe.release.is_set()
        elif signal == "SIGSTOP":  # the current run finishes; the next message queues
            assert probe.step_open
            setup.queued = (await client.send(ref, "queued")).key
            probe.release.set()
            await until(client, ref, run_status(COMPLETED, setup.held))
            await stays_queued_until_sigcont(client, setup, State.PAUSED)
        elif signal == "SIGCONT":  # ignored: the run goes on undisturbed
            assert probe.step_open
            probe.release.set()
            done = await until(client, ref, run_status(COMPLETED, setup.held))
            assert done.raw.run.output == "partial more"
            assert (await client.get(ref)).state is State.RUNNING
            assert probe.handled("SIGCONT") == 0
        elif signal == "SIGUSR":  # the handler runs now, beside the open step
            await wait_gate(probe.seen["SIGUSR"])
            assert probe.usr_during_step is True
            assert probe.signals[-1].payload == {"n": 1}
            probe.release.set()
            done = await until(client, ref, run_status(COMPLETED, setup.held))
            assert done.raw.run.output == "partial more"
        return

    if scenario == "running-idle":
        if signal in ("SIGINT", "SIGCONT"):  # ignored; a later run is not aborted
            await completes(client, ref, "next")
            assert (await client.get(ref)).state is State.RUNNING
            assert probe.handled(signal) == 0
        elif signal == "SIGHUP":  # no run to wait for: idle at once; the next message wakes it
            await until(client, ref, state_is("idle", "reload"))
            with anyio.fail_after(TIMEOUT_S):
                await worker.wait_host(ref, gone=True)
            await completes(client, ref, "wake")
            await until(client, ref, state_is("running", "wake"))
        elif signal == "SIGTERM":
            await until(client, ref, state_is("stopped", "cleanup_complete"))
            assert probe.handled("SIGTERM") == 1
            assert "cleanup done" in probe.log
        elif signal == "SIGKILL":
            await killed_and_closed(client, worker, probe, ref)
        elif signal == "SIGSTOP":
            setup.queued = (await client.send(ref, "queued")).key
            await stays_queued_until_sigcont(client, setup, State.PAUSED)
        elif signal == "SIGUSR":
            await wait_gate(probe.seen["SIGUSR"])
            assert probe.usr_during_step is False
            assert probe.signals[-1].payload == {"n": 1}
        return

    if scenario == "idle":
        if signal in ("SIGINT", "SIGHUP", "SIGCONT", "SIGUSR"):  # ignored: not processing
            assert (await client.get(ref)).state is State.IDLE
            await completes(client, ref, "wake")  # a message still wakes it
            assert probe.handled(signal) == 0
        elif signal == "SIGTERM":  # straight to stopped: nothing to clean up
            events = await until_closed(client, ref)
            assert [e.value["state"] for e in events if e.type == "state"][-1] == "stopped"
            assert probe.handled("SIGTERM") == 0
        elif signal == "SIGKILL":
            events = await until_closed(client, ref)
            assert [e.value["state"] for e in events if e.type == "state"][-1] == "killed"
        elif signal == "SIGSTOP":  # paused: a message queues instead of waking it
            setup.queued = (await client.send(ref, "queued")).key
            await stays_queued_until_sigcont(client, setup, State.PAUSED)
        return

    if scenario == "paused":
        if signal in ("SIGINT", "SIGHUP", "SIGSTOP", "SIGUSR"):  # ignored: not processing
            await stays_queued_until_sigcont(client, setup, State.PAUSED)
            assert probe.handled(signal) == 0
        elif signal == "SIGTERM":  # cleanup, then stopped; the queued message never runs
            await until(client, ref, state_is("stopped", "cleanup_complete"))
            assert probe.handled("SIGTERM") == 1
            events = await until_closed(client, ref)
            assert setup.queued is not None
            assert not any(run_status(STARTED, setup.queued)(e) for e in events)
        elif signal == "SIGKILL":
            events = await killed_and_closed(client, worker, probe, ref)
            assert setup.queued is not None
            assert not any(run_status(STARTED, setup.queued)(e) for e in events)
        elif signal == "SIGCONT":  # running again: the queued message is delivered
            await resumes_queued_after(client, setup, result_key)
        return

    if scenario == "paused-busy":
        assert setup.held is not None
        if signal == "SIGINT":
            aborted = await until(client, ref, run_status(ABORTED, setup.held))
            assert aborted.raw.run.output == "partial"
            await wait_gate(probe.seen["SIGINT"])
        elif signal == "SIGUSR":
            await wait_gate(probe.seen["SIGUSR"])
            assert probe.usr_during_step is True
            probe.release.set()
            await until(client, ref, run_status(COMPLETED, setup.held))
        await stays_queued_until_sigcont(client, setup, State.PAUSED)
        return

    if scenario == "stopping":
        assert probe.cleanup_release is not None
        if signal == "SIGKILL":  # the cleanup is cancelled; never stopped
            events = await killed_and_closed(client, worker, probe, ref)
            assert "cleanup done" not in probe.log
            assert not any(state_is("stopped")(e) for e in events)
        else:  # ignored: still stopping, no handler; the cleanup then completes
            assert (await client.get(ref)).state is State.STOPPING
            probe.cleanup_release.set()
            await until(client, ref, state_is("stopped", "cleanup_complete"))
            await until_closed(client, ref)
            assert probe.handled(signal) == (1 if signal == "SIGTERM" else 0)
        return

    raise AssertionError(scenario)


# -- the test --------------------------------------------------------------------------------


@pytest.mark.both_stores
@pytest.mark.parametrize(("scenario", "signal"), CASES, ids=[f"{s}-{g}" for s, g in CASES])
async def test_cell(scenario: str, signal: str, electric: TestServer, client: AsyncClient) -> None:
    probe = Probe()
    async with running_worker(make_app(probe), electric.address) as worker:
        setup = await drive(scenario, client, probe, f"{scenario}-{signal.lower()}")
        ref = setup.ref
        cell = expected(scenario, signal)
        before = await client.get(ref)
        payload = {"n": 1} if signal == "SIGUSR" else None

        if cell == REJECT:
            head = (await client.events(ref, 0, 1000)).head_offset
            with pytest.raises(errors.InvalidSignal) as info:
                await client.signal(ref, signal, payload=payload)
            assert info.value.code == "INVALID_SIGNAL"
            assert f"Cannot signal a {row(scenario)} entity" in info.value.message
            after = await client.events(ref, 0, 1000)
            assert after.head_offset == head  # nothing written
            assert not any(e.type == "signal" and e.offset >= head for e in after.events)
            assert (await client.get(ref)).state is before.state
            return

        assert isinstance(cell, tuple)
        new_state, outcome = cell
        reason = f"conformance: {scenario} {signal}"
        result = await client.signal(ref, signal, payload=payload, reason=reason)
        # 1. the response
        assert result.signal.value == signal
        assert result.ref.url == f"/{ref}"
        assert result.previous_state is before.state
        assert (result.previous_state.value, result.new_state.value) == (row(scenario), new_state)

        # 2. the event log: the signal record, the state record iff the cell transitions, the outcome
        record = await until(client, ref, lambda e: e.type == "signal" and e.key == result.key)
        assert record.operation == "insert"
        assert record.value["signal"] == signal
        assert record.value["reason"] == reason
        assert record.value["sender"]
        assert record.txid == result.txid
        assert abs((record.timestamp - result.created_at).total_seconds()) < 1.0
        assert (record.value["previous_state"], record.value["new_state"]) == (
            result.previous_state.value,
            new_state,
        )
        if signal == "SIGUSR":
            assert record.raw.signal.HasField("payload")
        if (scenario, signal) == ("running-busy", "SIGTERM"):
            # The cleanup is asked for (outcome written) once the run stopped at its next step
            # boundary; the step is held open, so the outcome is still pending.
            assert not any(final_outcome(result.key)(e) for e in await all_events(client, ref))
        else:
            final = await until(client, ref, final_outcome(result.key), record.offset)
            assert final.value["outcome"] == outcome, final.value
        events = await all_events(client, ref)
        transition = [e for e in events if e.type == "state" and e.value.get("signal_key") == result.key]
        if new_state != result.previous_state.value:
            assert len(transition) == 1
            assert transition[0].value["state"] == new_state
            assert transition[0].value["cause"] == "signal"
            assert transition[0].txid == record.txid  # appended with the signal, atomically
            assert transition[0].offset == record.offset + 1
            if new_state == "stopping":  # the grace period's deadline (the type's 10s profile)
                deadline = datetime.fromisoformat(transition[0].value["deadline"].replace("Z", "+00:00"))
                assert 9.0 < (deadline - record.timestamp).total_seconds() <= 10.5
        else:
            assert transition == []

        # 3. the behaviour
        await check_behaviour(scenario, signal, setup, result.key, client, worker, probe)
        if (scenario, signal) == ("running-busy", "SIGTERM"):
            final = await until(client, ref, final_outcome(result.key), record.offset)
            assert final.value["outcome"] == outcome, final.value


def test_table_covers_every_cell() -> None:
    assert sorted(SIGNALS) == sorted(s.value for s in Signal)
    assert sorted(RFC_TABLE) == sorted(s.value for s in State)
    assert all(len(row) == len(SIGNALS) for row in RFC_TABLE.values())
    rows_covered = {(row(s), g) for s, g in CASES}
    assert rows_covered == {(st, g) for st in RFC_TABLE for g in SIGNALS}
