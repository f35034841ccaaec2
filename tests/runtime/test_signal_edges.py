"""The §2 clarifications and the grace deadline, against a real server and worker."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from electric_sdk import AsyncClient
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk.lifecycle import Outcome, Signal, State
from electric_sdk.runtime import Worker
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
from .test_signals import hold

pytestmark = pytest.mark.anyio


async def test_grace_runs_out_mid_step(electric: TestServer, client: AsyncClient) -> None:
    """The runtime cancels the held step at the deadline, as SIGKILL would; the server writes stopped."""
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address) as worker:
        await client.spawn("probe/slow", grace_period="300ms")
        probe_key = (await client.send("probe/slow", "hold")).key
        with anyio.fail_after(TIMEOUT_S):
            await probe.entered.wait()
        await client.terminate("probe/slow")
        await until(client, "probe/slow", state_is("stopped", "grace_expired"))
        with anyio.fail_after(TIMEOUT_S):
            await worker.wait_host("probe/slow", gone=True)
        assert probe.step_open is False
        assert "step released" in probe.log  # cancelled: the step's finally ran
        assert "after step" not in probe.log
        assert "signal SIGTERM" not in probe.log  # the run never reached a boundary
        events = (await client.events("probe/slow", 0, 100)).events
        assert not any(run_status(COMPLETED, probe_key)(e) for e in events)


async def test_cleanup_cut_off_by_the_grace(electric: TestServer, client: AsyncClient) -> None:
    probe = Probe(cleanup_release=anyio.Event())  # the cleanup never finishes by itself
    async with running_worker(probe_app(probe), electric.address) as worker:
        await client.spawn("probe/cleanup", grace_period="300ms")
        with anyio.fail_after(TIMEOUT_S):
            host = await worker.wait_host("probe/cleanup")
            assert host is not None
            await host.wait_state(State.RUNNING)
        result = await client.terminate("probe/cleanup")
        await until(client, "probe/cleanup", outcome_of(result.key, "shutdown_requested"))
        await until(client, "probe/cleanup", state_is("stopped", "grace_expired"))
        with anyio.fail_after(TIMEOUT_S):
            await worker.wait_host("probe/cleanup", gone=True)
    assert "signal SIGTERM" in probe.log
    assert not probe.seen[Signal.SIGTERM].is_set()  # cancelled inside the handler


async def test_sigint_aborts_the_run_still_finishing_in_paused(
    electric: TestServer, client: AsyncClient
) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address) as worker:
        key, host = await hold(client, worker, probe, "probe/pint")
        await client.pause("probe/pint")
        with anyio.fail_after(TIMEOUT_S):
            await host.wait_state(State.PAUSED)
        result = await client.interrupt("probe/pint")
        assert (result.previous_state, result.new_state) == (State.PAUSED, State.PAUSED)
        aborted = await until(client, "probe/pint", run_status(ABORTED, key))
        assert aborted.raw.run.output == "partial"
        await until(client, "probe/pint", outcome_of(result.key, "aborted"))
        assert (await client.get("probe/pint")).state is State.PAUSED
        # With no run left, SIGUSR in paused is "ignored (not processing)".
        usr = await client.usr("probe/pint", {"n": 1})
        await until(client, "probe/pint", outcome_of(usr.key, "ignored"))
    assert Signal.SIGUSR not in {s.signal for s in probe.signals}


async def test_sigusr_without_a_run_reaches_the_handler(electric: TestServer, client: AsyncClient) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address) as worker:
        await client.spawn("probe/usr-idle")
        with anyio.fail_after(TIMEOUT_S):
            host = await worker.wait_host("probe/usr-idle")
            assert host is not None
            await host.wait_state(State.RUNNING)
        result = await client.usr("probe/usr-idle", [1, 2])
        await until(client, "probe/usr-idle", outcome_of(result.key, "delivered"))
    assert probe.signals[-1].payload == [1, 2]
    assert probe.usr_during_step is False


async def test_sigint_scoped_to_a_queued_message_cancels_only_it(
    electric: TestServer, client: AsyncClient
) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address) as worker:
        first, _ = await hold(client, worker, probe, "probe/scoped")
        second = await client.send("probe/scoped", "two")
        cancelled = await until(client, "probe/scoped", lambda e: e.offset == second.offset)
        assert cancelled.type == "message"
        result = await client.signal("probe/scoped", "SIGINT", message_key=second.key)
        # Settled by the server, with the message's run record, in the signal's own transaction.
        assert result.outcome is Outcome.ABORTED
        aborted = await until(client, "probe/scoped", run_status(ABORTED, second.key))
        assert (aborted.txid, aborted.value["error"]) == (result.txid, "cancelled before it started")
        assert probe.step_open is True  # the other run is untouched
        probe.release.set()
        await until(client, "probe/scoped", run_status(COMPLETED, first))
        events = (await client.events("probe/scoped", 0, 100)).events
        assert not any(run_status(STARTED, second.key)(e) for e in events)
    assert "start two attempt=1" not in probe.log


async def test_paused_then_sigcont_handler_then_sigterm_from_paused(
    electric: TestServer, client: AsyncClient
) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address) as worker:
        await client.spawn("probe/pt")
        with anyio.fail_after(TIMEOUT_S):
            host = await worker.wait_host("probe/pt")
            assert host is not None
            await host.wait_state(State.RUNNING)
        await client.pause("probe/pt")
        queued = await client.send("probe/pt", "queued")
        await client.resume("probe/pt")
        with anyio.fail_after(TIMEOUT_S):
            await probe.seen[Signal.SIGCONT].wait()  # SIGCONT may be handled
        await until(client, "probe/pt", run_status(COMPLETED, queued.key))
        await client.pause("probe/pt")
        with anyio.fail_after(TIMEOUT_S):
            await host.wait_state(State.PAUSED)
        term = await client.terminate("probe/pt")
        assert (term.previous_state, term.new_state) == (State.PAUSED, State.STOPPING)
        await until(client, "probe/pt", state_is("stopped", "cleanup_complete"))
        await until(client, "probe/pt", outcome_of(term.key, "shutdown_requested"))
    assert probe.log[-1] == "signal SIGTERM"


class GatedWorker(Worker):
    """A real worker whose next STARTED write waits for the test (to order a race)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.hold_next_started = False
        self.started_waiting = anyio.Event()
        self.let_started_go = anyio.Event()
        self.acked: dict[int, anyio.Event] = {}

    async def write(self, request: rt.RuntimeWrite) -> rt.WriteResult:
        if self.hold_next_started and request.WhichOneof("op") == "run" and request.run.status == STARTED:
            self.hold_next_started = False
            self.started_waiting.set()
            await self.let_started_go.wait()
        return await super().write(request)

    def ack(self, lease: rt.Lease, offset: int) -> None:
        self.acked.setdefault(offset, anyio.Event()).set()
        super().ack(lease, offset)


async def test_a_sigint_appended_before_a_run_started_does_not_abort_it(
    electric: TestServer, client: AsyncClient
) -> None:
    """The SIGINT is delivered while the run's STARTED write is still in flight: the host waits for
    STARTED's offset, sees the signal is older, and the run goes on (ARCHITECTURE §2)."""
    probe = Probe()
    probe.release.set()
    worker = GatedWorker(probe_app(probe), electric.address)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(TIMEOUT_S):
            await tg.start(worker.run)
        await client.spawn("probe/race")
        with anyio.fail_after(TIMEOUT_S):
            host = await worker.wait_host("probe/race")
            assert host is not None
            await host.wait_state(State.RUNNING)
        worker.hold_next_started = True
        receipt = await client.send("probe/race", "hold")
        with anyio.fail_after(TIMEOUT_S):
            await worker.started_waiting.wait()
        sigint = await client.interrupt("probe/race")
        acked = worker.acked.setdefault(await _offset_of(client, sigint.key), anyio.Event())
        with anyio.fail_after(TIMEOUT_S):
            await acked.wait()  # the host has the SIGINT, while STARTED is still unwritten
        worker.let_started_go.set()
        await until(client, "probe/race", outcome_of(sigint.key, "ignored"))
        done = await until(client, "probe/race", run_status(COMPLETED, receipt.key))
        assert done.raw.run.output == "partial more"
        await worker.shutdown(1.0)


async def _offset_of(client: AsyncClient, key: str) -> int:
    event = await until(client, "probe/race", lambda e: e.key == key)
    return event.offset


async def test_every_sighup_of_a_barrage_gets_an_outcome(electric: TestServer, client: AsyncClient) -> None:
    """SIGHUPs keep coming as the entity goes idle (reload): the ones that reach the host after it
    decided to end get their outcome when its lease is released; none stays pending."""
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address) as worker:
        for round_ in range(5):
            ref = f"probe/hups{round_}"
            await client.spawn(ref)
            await client.wait_for_state(ref, "running", timeout=TIMEOUT_S)

            async def barrage(ref: str = ref) -> None:
                for _ in range(25):
                    try:
                        await client.signal(ref, "SIGHUP")
                    except Exception:
                        return

            async with anyio.create_task_group() as tg:
                for _ in range(16):
                    tg.start_soon(barrage)
            with anyio.fail_after(TIMEOUT_S):
                await worker.wait_host(ref, gone=True)
            events = (await client.events(ref, 0, 1000)).events
            inserted = [e for e in events if e.type == "signal" and e.operation == "insert"]
            pending = {e.key for e in inserted if e.value["outcome"] == "pending"}
            assert pending  # the barrage did reach the running entity
            for key in pending:
                await until(client, ref, outcome_of(key))


async def test_a_scoped_sigint_for_a_message_that_already_ran_is_answered_at_once(
    electric: TestServer, client: AsyncClient
) -> None:
    """A SIGINT scoped to a message whose run has ended touches nothing, and the server says so
    in the signal's own record (it does not wait for a runtime)."""
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address):
        await client.spawn("probe/late-int")
        done = await client.send("probe/late-int", "quick")
        await until(client, "probe/late-int", run_status(COMPLETED, done.key))
        result = await client.signal("probe/late-int", "SIGINT", message_key=done.key)
        assert result.outcome is Outcome.IGNORED
        events = (await client.events("probe/late-int", 0, 100)).events
        inserted = next(e for e in events if e.key == result.key)
        assert inserted.value["detail"] == "its message is done: its run ended, or it was cancelled"
        assert not any(outcome_of(result.key)(e) for e in events)  # no update: nothing more to say
        assert (await client.get("probe/late-int")).state is State.RUNNING
