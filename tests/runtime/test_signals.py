"""Each signal against a run whose step the test holds open (released by the test, never a sleep).

Immediate: SIGINT, SIGKILL, SIGUSR act while the step is still open. At step
boundaries: SIGTERM waits for the step, SIGSTOP/SIGCONT and SIGHUP act between runs.
"""

from __future__ import annotations

import anyio
import pytest
from anyio.lowlevel import checkpoint

from electric_sdk import AsyncClient
from electric_sdk.lifecycle import Signal, State
from electric_sdk.runtime import EntityHost, Worker
from electric_sdk.testing import TestServer

from .rt_support import (
    ABORTED,
    COMPLETED,
    STARTED,
    TIMEOUT_S,
    Probe,
    outcome_of,
    probe_app,
    run_status,
    running_worker,
    state_is,
    until,
)

pytestmark = pytest.mark.anyio


async def hold(client: AsyncClient, worker: Worker, probe: Probe, ref: str) -> tuple[str, EntityHost]:
    """Spawn ``ref``, send "hold", return once its step is open; (message key, host)."""
    await client.spawn(ref)
    receipt = await client.send(ref, "hold")
    with anyio.fail_after(TIMEOUT_S):
        await probe.entered.wait()
    host = worker.host(ref)
    assert host is not None
    return receipt.key, host


async def test_sigint_aborts_mid_step_with_partial_output(electric: TestServer, client: AsyncClient) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address) as worker:
        key, _ = await hold(client, worker, probe, "probe/int")
        result = await client.interrupt("probe/int")
        assert (result.previous_state, result.new_state) == (State.RUNNING, State.RUNNING)
        aborted = await until(client, "probe/int", run_status(ABORTED, key))
        assert aborted.raw.run.output == "partial"
        await until(client, "probe/int", outcome_of(result.key, "aborted"))
        assert probe.step_open is False
        assert "after step" not in probe.log  # cancelled mid-step: the run went no further
        with anyio.fail_after(TIMEOUT_S):
            await probe.seen[Signal.SIGINT].wait()
        assert probe.signals[-1].partial_output == "partial"
        assert probe.signals[-1].message_key == key  # the SIGINT named no run: the handler learns it
        # The entity stays running and takes the next message.
        nxt = await client.send("probe/int", "next")
        await until(client, "probe/int", run_status(COMPLETED, nxt.key))
        assert (await client.get("probe/int")).state is State.RUNNING


async def test_sigint_without_a_run_is_ignored(electric: TestServer, client: AsyncClient) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address) as worker:
        await client.spawn("probe/idle-int")
        with anyio.fail_after(TIMEOUT_S):
            host = await worker.wait_host("probe/idle-int")
            assert host is not None
            await host.wait_state(State.RUNNING)
        result = await client.interrupt("probe/idle-int")
        await until(client, "probe/idle-int", outcome_of(result.key, "ignored"))
        # A SIGINT that found no run does not abort the next one.
        receipt = await client.send("probe/idle-int", "later")
        await until(client, "probe/idle-int", run_status(COMPLETED, receipt.key))
    assert Signal.SIGINT not in {s.signal for s in probe.signals}


async def test_sigkill_mid_step_cancels_everything(electric: TestServer, client: AsyncClient) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address) as worker:
        key, _ = await hold(client, worker, probe, "probe/kill")
        result = await client.kill("probe/kill")
        assert result.new_state is State.KILLED
        aborted = await until(client, "probe/kill", run_status(ABORTED, key))
        assert aborted.raw.run.output == "partial"
        with anyio.fail_after(TIMEOUT_S):
            await worker.wait_host("probe/kill", gone=True)
        assert probe.step_open is False
        assert "after step" not in probe.log
        assert probe.signals == []  # SIGKILL has no handler
        with anyio.fail_after(TIMEOUT_S):
            async for _ in client.watch("probe/kill", 0):
                pass  # the stream closes once the runtime's last records are in
    assert not probe.release.is_set()


async def test_sigusr_handler_runs_while_the_step_is_open(electric: TestServer, client: AsyncClient) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address) as worker:
        key, _ = await hold(client, worker, probe, "probe/usr")
        result = await client.usr("probe/usr", {"priority": "high"})
        with anyio.fail_after(TIMEOUT_S):
            await probe.seen[Signal.SIGUSR].wait()
        assert probe.usr_during_step is True
        assert probe.step_open is True
        assert probe.signals[-1].payload == {"priority": "high"}
        await until(client, "probe/usr", outcome_of(result.key, "delivered"))
        probe.release.set()
        done = await until(client, "probe/usr", run_status(COMPLETED, key))
        assert done.raw.run.output == "partial more"


async def test_sigterm_waits_for_the_step_then_cleans_up(electric: TestServer, client: AsyncClient) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe, grace_period="10s"), electric.address) as worker:
        key, host = await hold(client, worker, probe, "probe/term")
        result = await client.terminate("probe/term")
        assert result.new_state is State.STOPPING
        with anyio.fail_after(TIMEOUT_S):
            await host.wait_state(State.STOPPING)
        await checkpoint()
        assert probe.step_open is True  # a step finishes before SIGTERM is checked
        assert Signal.SIGTERM not in {s.signal for s in probe.signals}
        assert host.grace_deadline is not None
        probe.release.set()
        stopped = await until(client, "probe/term", state_is("stopped", "cleanup_complete"))
        events = (await client.events("probe/term", 0, 100)).events
        aborted = next(e for e in events if e.type == "run" and e.raw.run.status == ABORTED)
        # Stopped at the next step's start: what it wrote after the step it finished is kept.
        assert aborted.raw.run.output == "partial more"
        assert aborted.offset < stopped.offset
        assert any(outcome_of(result.key, "shutdown_requested")(e) for e in events)
        assert aborted.raw.run.message_key == key
    assert probe.log[-2:] == ["step released", "signal SIGTERM"]
    assert "after step" not in probe.log
    # The cleanup handler receives the stopped run's partial output, as on_sigint does.
    assert probe.signals[-1].partial_output == "partial more"


async def test_sigstop_queues_and_sigcont_resumes_in_order(electric: TestServer, client: AsyncClient) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address) as worker:
        first, host = await hold(client, worker, probe, "probe/stop")
        paused = await client.pause("probe/stop")
        assert paused.new_state is State.PAUSED
        second = await client.send("probe/stop", "two")
        third = await client.send("probe/stop", "three")
        with anyio.fail_after(TIMEOUT_S):
            await host.wait_state(State.PAUSED)
        assert probe.step_open is True  # SIGSTOP lets the current run finish
        probe.release.set()
        await until(client, "probe/stop", run_status(COMPLETED, first))
        resumed = await client.resume("probe/stop")
        assert resumed.new_state is State.RUNNING
        done = await until(client, "probe/stop", run_status(COMPLETED, third.key))
        events = (await client.events("probe/stop", 0, 200)).events
        starts = [e for e in events if e.type == "run" and e.raw.run.status == STARTED]
        assert [e.raw.run.message_key for e in starts] == [first, second.key, third.key]
        sigcont = next(e for e in events if e.type == "signal" and e.key == resumed.key)
        assert all(e.offset > sigcont.offset for e in starts[1:])  # nothing ran while paused
        assert done.offset > sigcont.offset
    assert [line for line in probe.log if line.startswith("start")] == [
        "start hold attempt=1",
        "start two attempt=1",
        "start three attempt=1",
    ]


async def test_sighup_goes_idle_after_the_run(electric: TestServer, client: AsyncClient) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address) as worker:
        key, host = await hold(client, worker, probe, "probe/hup")
        result = await client.reload("probe/hup")
        assert (result.previous_state, result.new_state) == (State.RUNNING, State.RUNNING)
        await until(client, "probe/hup", outcome_of(result.key, "shutdown_requested"))
        assert probe.step_open is True
        assert (await client.get("probe/hup")).state is State.RUNNING
        probe.release.set()
        idle = await until(client, "probe/hup", state_is("idle", "reload"))
        done = await until(client, "probe/hup", run_status(COMPLETED, key))
        assert done.offset < idle.offset
        assert done.raw.run.output == "partial more"
        with anyio.fail_after(TIMEOUT_S):
            await worker.wait_host("probe/hup", gone=True)
        assert host.end_reason == "reload"
        # The next message wakes it: idle → running (wake) and the run completes.
        wake = await client.send("probe/hup", "again")
        await until(client, "probe/hup", state_is("running", "wake"))
        await until(client, "probe/hup", run_status(COMPLETED, wake.key))
        events = (await client.events("probe/hup", 0, 200)).events
        assert sum(state_is("idle", "reload")(e) for e in events) == 1  # the old SIGHUP acts once


async def test_idle_timeout_then_wake(electric: TestServer, client: AsyncClient) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address):
        await client.spawn("probe/nap", idle_timeout="100ms")
        await until(client, "probe/nap", state_is("idle", "idle_timeout"))
        receipt = await client.send("probe/nap", "wake up")
        await until(client, "probe/nap", state_is("running", "wake"))
        await until(client, "probe/nap", run_status(COMPLETED, receipt.key))
