"""A server on a manual clock (``TestServer(clock=ManualClock())``): a 30 s grace passes when the
test advances the clock, in no wall time, and not a millisecond before its deadline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest
from electric_server import ConfigError

from electric_sdk.testing import ManualClock, TestServer

from .rt_support import STARTED, TIMEOUT_S, Probe, probe_app, run_status, running_worker, state_is, until

pytestmark = pytest.mark.anyio


async def test_a_30s_grace_expires_when_the_server_clock_is_advanced(tmp_path: Path) -> None:
    clock = ManualClock(datetime.now(UTC))
    # A lease that outlives the advance: this test is about the grace, not the worker's heartbeats.
    with TestServer(tmp_path / "electric", clock=clock, lease_ttl_ms=600_000) as electric:
        assert TIMEOUT_S < 30  # every wait below would fail before a real 30 s grace ran out
        probe = Probe()
        async with electric.async_client() as client, running_worker(probe_app(probe), electric.address):
            await client.spawn("probe/slow", grace_period="30s")
            await client.send("probe/slow", "hold")
            with anyio.fail_after(TIMEOUT_S):
                await probe.entered.wait()
            await client.terminate("probe/slow")
            stopping = await until(client, "probe/slow", state_is("stopping"))
            deadline = datetime.fromisoformat(stopping.value["deadline"])
            assert deadline == stopping.timestamp + timedelta(seconds=30)  # by the manual clock
            clock.advance(29.999)  # were the grace judged now, `stopped` would carry this time
            clock.advance(0.001)
            stopped = await until(client, "probe/slow", state_is("stopped", "grace_expired"))
            assert stopped.timestamp >= deadline  # not before the deadline, by the clock


async def test_an_idle_timeout_passes_when_the_clock_is_advanced(tmp_path: Path) -> None:
    clock = ManualClock(datetime.now(UTC))
    with TestServer(tmp_path / "electric", clock=clock, lease_ttl_ms=600_000) as electric:
        async with (
            electric.async_client() as client,
            running_worker(probe_app(Probe(), idle_timeout="60s"), electric.address, clock=clock),
        ):
            await client.spawn("probe/idle")
            # The host counts idle from its start, before it writes `running`: no race with it.
            running = await until(client, "probe/idle", state_is("running"))
            clock.advance(59.999)  # were the idle timeout judged now, `idle` would carry this time
            clock.advance(0.001)
            idle = await until(client, "probe/idle", state_is("idle", "idle_timeout"), running.offset)
            # Not before the timeout, by the clock the worker and the server share.
            assert idle.timestamp >= running.timestamp + timedelta(seconds=60)


async def test_a_lease_ends_when_the_clock_passes_its_ttl(tmp_path: Path) -> None:
    """The worker heartbeats in wall time, every few seconds: an advance past the lease TTL finds
    its session quiet, the sweep (woken by the advance) ends it, and the run goes to attempt 2."""
    clock = ManualClock(datetime.now(UTC))
    with TestServer(tmp_path / "electric", clock=clock, lease_ttl_ms=10_000) as electric:
        probe = Probe()
        async with electric.async_client() as client, running_worker(probe_app(probe), electric.address):
            await client.spawn("probe/lease")
            receipt = await client.send("probe/lease", "hold")
            with anyio.fail_after(TIMEOUT_S):
                await probe.entered.wait()
            clock.advance(10.001)
            lost = await until(
                client, "probe/lease", lambda e: e.type == "state" and e.value["cause"] == "runtime_lost"
            )
            again = await until(client, "probe/lease", run_status(STARTED, receipt.key), lost.offset)
            assert again.raw.run.attempt == 2


def test_a_manual_clock_on_postgresql_is_refused(tmp_path: Path) -> None:
    # Refused before anything connects: no database need listen at this address.
    server = TestServer(tmp_path / "electric", clock=ManualClock(), database_url="postgresql://127.0.0.1:1/x")
    with pytest.raises(ConfigError, match="manual clock is for the SQLite store"):
        server.start()
