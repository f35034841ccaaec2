"""Clients and workers given several addresses (issue 20: replicas): calls spread over those that
answer, a dead one is passed over, and a malformed list is a clear error before any call."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import anyio
import pytest

from electric_sdk import AsyncClient, Client, ClientOptions, errors
from electric_sdk.channels import channel_target
from electric_sdk.runtime import Worker
from electric_sdk.testing import TestServer

from .rt_support import COMPLETED, TIMEOUT_S, Probe, probe_app, run_status, running_worker, until

pytestmark = pytest.mark.anyio


def dead_address() -> str:
    """A loopback port nobody listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize(
    "address", ["nonsense", "a:0", "a:65536", "a:7700,", ",", "a:7700,b", "[::1]:x", "host:port"]
)
def test_a_malformed_address_is_refused_before_any_call(address: str) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        Client(address)
    assert caught.value.code == "INVALID_ADDRESS"


@pytest.mark.parametrize(
    ("address", "target", "balanced"),
    [
        ("127.0.0.1:7700", "127.0.0.1:7700", False),
        ("[::1]:7700", "[::1]:7700", False),
        ("127.0.0.1:7700,127.0.0.2:7701", "ipv4:127.0.0.1:7700,127.0.0.2:7701", True),
        (["::1:7700", "[::2]:7701"], "ipv6:[::1]:7700,[::2]:7701", True),
        ("localhost:7700", "localhost:7700", True),
        ("unix:/run/electric.sock", "unix:/run/electric.sock", True),
    ],
)
def test_the_channel_target(address: str | list[str], target: str, balanced: bool) -> None:
    got = channel_target(address)
    assert got.target == target
    assert (("grpc.lb_policy_name", "round_robin") in got.options) is balanced


def test_names_and_literals_mixed_are_resolved_once() -> None:
    got = channel_target("localhost:7700,127.0.0.2:7701")
    assert got.target.startswith("ipv4:")
    assert "127.0.0.1:7700" in got.target
    assert "127.0.0.2:7701" in got.target
    assert ("grpc.default_authority", "localhost") in got.options


def test_calls_spread_over_every_replica_that_answers(tmp_path: Path) -> None:
    """Two servers (each its own store, so where a spawn landed shows): a client given both and a
    dead port spreads its spawns over both live ones, round robin, and never fails a call."""
    with TestServer(tmp_path / "a") as a, TestServer(tmp_path / "b") as b:
        with Client([a.address, dead_address(), b.address]) as client:
            for i in range(20):
                client.spawn(f"spread/s{i:02}")
        on_a = {e.ref.id for e in a.client().list(type="spread")}
        on_b = {e.ref.id for e in b.client().list(type="spread")}
        assert on_a
        assert on_b
        assert on_a | on_b == {f"s{i:02}" for i in range(20)}
        assert not on_a & on_b


def test_a_replica_that_goes_away_is_passed_over(tmp_path: Path) -> None:
    with TestServer(tmp_path / "a") as a, TestServer(tmp_path / "b") as b:
        with Client(f"{a.address},{b.address}") as client:
            client.spawn("gone/before")
            a.stop()
            for i in range(10):  # every call after the stop is served by b
                client.spawn(f"gone/after{i}")
        assert len(b.client().list(type="gone")) >= 10


async def test_a_worker_given_a_dead_address_first_serves_from_the_live_one(tmp_path: Path) -> None:
    probe = Probe()
    with TestServer(tmp_path / "data") as server:
        async with (
            AsyncClient(server.address) as client,
            running_worker(probe_app(probe), f"{dead_address()},{server.address}"),
        ):
            await client.spawn("probe/p1")
            receipt = await client.send("probe/p1", "hi")
            with anyio.fail_after(TIMEOUT_S):
                await until(client, "probe/p1", run_status(COMPLETED, receipt.key))


def test_a_name_that_does_not_resolve_is_left_out_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A replica that is gone may take its name with it (a Kubernetes pod's does): the others
    still make the channel."""
    with caplog.at_level(logging.WARNING, "electric.client"):
        got = channel_target(["no-such-host.invalid:7700", "localhost:7701"])
    assert got.target == "ipv4:127.0.0.1:7701"
    assert "no-such-host.invalid" in caplog.text


def test_no_name_that_resolves_is_unavailable_naming_each() -> None:
    with pytest.raises(errors.Unavailable) as caught:
        channel_target(["no-such-host.invalid:7700", "nor-this.invalid:7701"])
    assert caught.value.code == "UNRESOLVED_ADDRESS"
    assert "no-such-host.invalid" in str(caught.value)
    assert "nor-this.invalid" in str(caught.value)


def test_a_client_given_a_name_gone_from_dns_serves_from_the_others(tmp_path: Path) -> None:
    with TestServer(tmp_path / "data") as server:
        port = server.address.rpartition(":")[2]
        with Client(["gone-replica.invalid:7700", f"localhost:{port}"]) as client:
            client.spawn("dns/d1")
            assert client.get("dns/d1").state.value == "spawning"


async def test_a_worker_whose_replicas_names_do_not_resolve_keeps_trying() -> None:
    """Names are resolved when a session's channel opens, not when the worker is made: a worker
    whose replicas' names do not resolve (DNS not yet, or for a moment, answering) retries, as it
    does for a replica that does not answer, instead of ending."""
    options = ClientOptions(address="gone-a.invalid:7700,gone-b.invalid:7701")  # taken: well formed
    tries = 0
    twice = anyio.Event()

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            nonlocal tries
            if "UNRESOLVED_ADDRESS" in record.getMessage():
                tries += 1
                if tries == 2:
                    twice.set()

    handler = Count(logging.WARNING)
    logging.getLogger("electric.runtime").addHandler(handler)
    try:
        worker = Worker(probe_app(Probe()), options=options)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(TIMEOUT_S):
                await twice.wait()
            tg.cancel_scope.cancel()
    finally:
        logging.getLogger("electric.runtime").removeHandler(handler)
