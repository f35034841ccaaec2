"""The worker's session: two-phase shutdown, redelivery to the next worker, reconnects."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest

from electric_sdk import AsyncClient, errors
from electric_sdk.lifecycle import State
from electric_sdk.runtime import AppReloader, Worker
from electric_sdk.testing import TestServer

from .rt_support import (
    ABORTED,
    COMPLETED,
    HOT_APP,
    STARTED,
    TIMEOUT_S,
    Probe,
    probe_app,
    run_status,
    running_worker,
    state_is,
    until,
)

pytestmark = pytest.mark.anyio


async def test_shutdown_lets_the_run_finish_within_the_grace(
    electric: TestServer, client: AsyncClient
) -> None:
    probe = Probe()
    worker = Worker(probe_app(probe), electric.address)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(TIMEOUT_S):
            await tg.start(worker.run)
        await client.spawn("probe/drain")
        receipt = await client.send("probe/drain", "hold")
        with anyio.fail_after(TIMEOUT_S):
            await probe.entered.wait()
        tg.start_soon(worker.shutdown, 30.0)
        with anyio.fail_after(TIMEOUT_S):
            host = worker.host("probe/drain")
            assert host is not None
            probe.release.set()
            await worker.wait_host("probe/drain", gone=True)
        assert host.end_reason == "drained"
    # worker.run has returned; a second shutdown is a no-op
    with anyio.fail_after(TIMEOUT_S):
        await worker.shutdown(1.0)
    done = await until(client, "probe/drain", run_status(COMPLETED, receipt.key))
    assert done.raw.run.output == "partial more"
    # Drained, not stopped: the entity waits for the next worker (running; or idle when the
    # server re-offered it to this draining worker just before its session closed).
    assert (await client.get("probe/drain")).state in (State.RUNNING, State.IDLE)


async def test_grace_runs_out_and_the_message_goes_to_the_next_worker(
    electric: TestServer, client: AsyncClient
) -> None:
    first = Probe()
    worker = Worker(probe_app(first), electric.address)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(TIMEOUT_S):
            await tg.start(worker.run)
        await client.spawn("probe/redeliver")
        receipt = await client.send("probe/redeliver", "hold")
        with anyio.fail_after(TIMEOUT_S):
            await first.entered.wait()
            await worker.shutdown(0.05)  # the step stays held: the run is cancelled after the grace
    assert "end hold" not in first.log
    events = (await client.events("probe/redeliver", 0, 100)).events
    assert not any(run_status(ABORTED)(e) or run_status(COMPLETED)(e) for e in events)

    second = Probe()
    second.release.set()
    async with running_worker(probe_app(second), electric.address):
        done = await until(client, "probe/redeliver", run_status(COMPLETED, receipt.key))
    assert done.raw.run.attempt == 2
    assert second.log[0] == "start hold attempt=2"


async def test_a_lost_worker_is_replaced(electric: TestServer, client: AsyncClient) -> None:
    first = Probe()
    worker = Worker(probe_app(first), electric.address)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(TIMEOUT_S):
            await tg.start(worker.run)
        await client.spawn("probe/lost")
        receipt = await client.send("probe/lost", "hold")
        with anyio.fail_after(TIMEOUT_S):
            await first.entered.wait()
        tg.cancel_scope.cancel()  # gone without a word: no release, no records
    await until(
        client, lambda_ref := "probe/lost", lambda e: e.type == "state" and e.value["cause"] == "runtime_lost"
    )
    second = Probe()
    second.release.set()
    async with running_worker(probe_app(second), electric.address):
        await client.send(lambda_ref, "after")
        done = await until(client, "probe/lost", run_status(COMPLETED, receipt.key))
        assert done.raw.run.attempt == 2
        await until(client, "probe/lost", run_status(COMPLETED))
    starts = [e for e in (await client.events("probe/lost", 0, 200)).events if run_status(STARTED)(e)]
    assert [e.raw.run.attempt for e in starts] == [1, 2, 1]


async def test_worker_reconnects_after_a_server_restart(tmp_path: object) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = tmp_path / "electric"  # type: ignore[operator]
    config = {"listen": f"127.0.0.1:{port}", "lease_ttl_ms": 600, "heartbeat_interval_ms": 100}
    probe = Probe()
    probe.release.set()
    server = TestServer(data, **config).start()
    try:
        async with running_worker(probe_app(probe), server.address, max_backoff_s=0.2) as worker:
            async with server.async_client() as client:
                await client.spawn("probe/restart")
                one = await client.send("probe/restart", "one")
                await until(client, "probe/restart", run_status(COMPLETED, one.key))
            server.stop()
            server = TestServer(data, **config).start()
            with anyio.fail_after(TIMEOUT_S):
                await worker.wait_host("probe/restart", gone=True)
            async with server.async_client() as client:
                two = await client.send("probe/restart", "two")
                await until(client, "probe/restart", run_status(COMPLETED, two.key))
    finally:
        server.stop()


async def test_worker_authenticates_with_a_runtime_token(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[[tokens]]\ntoken = "worker-token-1"\nprincipal = "w"\nscopes = ["runtime", "read"]\ntypes = ["probe"]\n'
        '[[tokens]]\ntoken = "admin-token-1"\nprincipal = "admin"\nscopes = ["admin"]\n'
    )
    tokens.chmod(0o600)  # a tokens file others may read is refused
    probe = Probe()
    probe.release.set()
    with TestServer(tmp_path / "electric", tokens_file=tokens) as server:
        with anyio.fail_after(TIMEOUT_S), pytest.raises(errors.Unauthenticated):
            await Worker(probe_app(probe), server.address, token="wrong-token-1").run()  # not retried
        async with (
            running_worker(probe_app(probe), server.address, token="worker-token-1"),
            server.async_client(token="admin-token-1") as client,
        ):
            await client.spawn("probe/auth")
            receipt = await client.send("probe/auth", "hi")
            await until(client, "probe/auth", run_status(COMPLETED, receipt.key))


async def test_dev_reloads_the_app_on_the_wake_after_sighup(
    electric: TestServer, client: AsyncClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "hot_agents_for_reload.py"
    source.write_text(HOT_APP.format(version="v1"))
    monkeypatch.syspath_prepend(str(tmp_path))
    reloader = AppReloader("hot_agents_for_reload:app")
    async with running_worker(reloader.app, electric.address, reload_app=reloader):
        await client.spawn("hot/h")
        one = await client.send("hot/h", "a")
        assert (await until(client, "hot/h", run_status(COMPLETED, one.key))).raw.run.output == "v1"
        await client.reload("hot/h")
        await until(client, "hot/h", state_is("idle", "reload"))
        source.write_text(HOT_APP.format(version="v2"))
        two = await client.send("hot/h", "b")
        assert (await until(client, "hot/h", run_status(COMPLETED, two.key))).raw.run.output == "v2"
        events = (await client.events("hot/h", 0, 200)).events
        assert sum(state_is("idle", "reload")(e) for e in events) == 1


@pytest.mark.parametrize("draining", [False, True])
async def test_a_lost_session_is_a_warning_unless_the_worker_is_draining(
    electric: TestServer, client: AsyncClient, caplog: pytest.LogCaptureFixture, draining: bool
) -> None:
    # `make cluster` stops servers and worker at once: the servers' drain ends the worker's
    # stream while the worker drains too. Expected then, so told at INFO; while the worker
    # serves, a lost session stays a warning (it reconnects).
    from test_sdk_resilience import SeveringProxy

    proxy = SeveringProxy(int(electric.address.rsplit(":", 1)[1]))
    address = await proxy.start()
    probe = Probe()
    try:
        async with running_worker(probe_app(probe), address, max_backoff_s=0.05) as worker:
            await client.spawn("probe/cut")
            await client.send("probe/cut", "hold")
            with anyio.fail_after(TIMEOUT_S):
                await probe.entered.wait()
            caplog.set_level("INFO", logger="electric.runtime")
            heard = _SessionEnds()
            logging.getLogger("electric.runtime").addHandler(heard)
            try:
                async with anyio.create_task_group() as tg:
                    if draining:
                        tg.start_soon(worker.shutdown, 30.0)  # the held run keeps it draining
                        with anyio.fail_after(TIMEOUT_S):
                            while not worker.draining:  # shutdown's first step sets it
                                await anyio.lowlevel.checkpoint()
                    proxy.sever()
                    with anyio.fail_after(TIMEOUT_S):
                        await heard.one.wait()
                    probe.release.set()
            finally:
                logging.getLogger("electric.runtime").removeHandler(heard)
    finally:
        await proxy.close()
    ended = heard.records[0]
    assert ended.levelname == ("INFO" if draining else "WARNING"), (ended.levelname, ended.getMessage())


class _SessionEnds(logging.Handler):
    """The worker's "runtime session ended" records, and an event set at the first (the worker
    logs on the test's loop)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.one = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("runtime session ended"):
            self.records.append(record)
            self.one.set()
