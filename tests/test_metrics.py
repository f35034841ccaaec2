"""``GET /metrics`` (issue 21, point 5): real traffic through a real server, then the scrape parsed
with prometheus_client's own parser and held to what was done."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anyio
import grpc
import httpx
import pytest
from conftest import SeedState, StartServer
from electric_server.app import ElectricServer
from electric_server.metrics import OTHER, TOP_CODE_VERSIONS, TOP_TYPES
from electric_server.store.postgres import PostgresStore
from prometheus_client.parser import text_string_to_metric_families
from test_auth import TOKENS, TOKENS_TOML

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import runtime_service_pb2_grpc as rt_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import State
from electric_sdk.runtime_session import SESSION_ACCEPTED

pytestmark = pytest.mark.anyio

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(http: httpx.AsyncClient, **kw: Any) -> Samples:
    response = await http.get("/metrics", **kw)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[name, frozenset(labels.items())]


def family(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


class Worker:
    """A raw runtime stream: the hello, then whatever the server sends, read on demand."""

    def __init__(self, channel: grpc.aio.Channel, name: str, types: list[str], version: str) -> None:
        self.requests: asyncio.Queue[rt.ConnectRequest | None] = asyncio.Queue()
        self.hello = rt.ConnectRequest(
            hello=rt.Hello(worker_id=name, code_version=version, types=[rt.HostedType(type=t) for t in types])
        )
        self.call = rt_grpc.RuntimeServiceStub(channel).Connect(self._requests())

    async def _requests(self) -> Any:
        while (item := await self.requests.get()) is not None:
            yield item

    async def read(self) -> list[rt.ConnectResponse]:
        with anyio.fail_after(10):
            if self.hello is not None:
                assert (await self.call.initial_metadata()).get(SESSION_ACCEPTED[0]) == SESSION_ACCEPTED[1]
                self.requests.put_nowait(self.hello)
                self.hello = None
            response = await self.call.read()
        assert isinstance(response, rt.ConnectResponse), response
        return list(response.batch.responses) if response.HasField("batch") else [response]

    def close(self) -> None:
        self.requests.put_nowait(None)
        self.call.cancel()


@pytest.mark.both_stores
async def test_metrics_match_the_traffic(door: ElectricServer, http: httpx.AsyncClient) -> None:
    writes = 0
    signalled: dict[tuple[str, str], int] = {}
    for ref in ("/agent/a1", "/agent/a2", "/job/j1"):
        assert (await http.put(ref)).status_code == 201
        writes += 1
    for ref, signal in [
        ("/agent/a1", "SIGUSR"),
        ("/agent/a1", "SIGUSR"),
        ("/agent/a1", "SIGHUP"),
        ("/agent/a2", "SIGKILL"),
        ("/agent/a2", "SIGTERM"),  # a killed entity: rejected, nothing written
        ("/agent/a2", "SIGKILL"),  # likewise
    ]:
        response = await http.post(f"{ref}/signal", json={"signal": signal})
        writes += 1  # a refused write is still one of its batch's
        outcome = response.json()["outcome"] if response.status_code == 200 else "rejected"
        assert outcome == "rejected" or response.status_code == 200
        signalled[signal, outcome] = signalled.get((signal, outcome), 0) + 1
    assert signalled[("SIGTERM", "rejected")] == 1
    bulk = await http.post("/signal", json={"selector": {"type": "agent"}, "signal": "SIGINT"})
    assert bulk.json()["signalled"] + bulk.json()["ignored"] == 1  # a1; a2 is killed: skipped
    writes += 1
    signalled["SIGINT", "ignored" if bulk.json()["ignored"] else "transitioned"] = 1
    for text in ("one", "two"):
        assert (await http.post("/job/j1/messages", json={"text": text})).status_code == 200
        writes += 1

    async with grpc.aio.insecure_channel(door.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)  # type: ignore[no-untyped-call]
        events = stub.WatchEvents(api.WatchEventsRequest(ref=pb.EntityRef(type="job", id="j1")))
        entities = stub.WatchEntities(api.WatchEntitiesRequest())
        with anyio.fail_after(10):
            await events.read()  # the spawn: the watch is open
            await entities.read()  # the snapshot: likewise
        samples = await scrape(http)
        events.cancel()
        entities.cancel()

    assert {
        (dict(labels)["signal"], dict(labels)["outcome"]): count
        for labels, count in family(samples, "electric_signals_total").items()
    } == signalled
    assert value(samples, "electric_store_writes_total") == writes
    batches = value(samples, "electric_store_commit_batches_total")
    assert 1 <= batches <= writes
    assert value(samples, "electric_store_commit_seconds_count") == batches
    assert value(samples, "electric_store_commit_seconds_bucket", le="+Inf") == batches
    assert 0 < value(samples, "electric_store_commit_seconds_sum") < 10 * batches
    assert value(samples, "electric_watch_streams", kind="events") == 1
    assert value(samples, "electric_watch_streams", kind="entities") == 1
    assert value(samples, "electric_worker_sessions") == 0
    assert family(samples, "electric_workers") == {}
    assert value(samples, "electric_leases_held") == 0
    assert value(samples, "electric_grace_deadlines_pending") == 0
    # PostgreSQL's lone writes on a guess (postgres_known): a1's signals follow its spawn.
    guessed = family(samples, "electric_postgres_guessed_writes_total")
    missed = family(samples, "electric_postgres_guesses_missed_total")
    if isinstance(door.store, PostgresStore):
        assert 1 <= guessed[frozenset()] <= writes
        assert {dict(labels)["reason"] for labels in missed} == {"row", "clock", "holder"}
        assert 0 <= sum(missed.values()) <= 3 * writes
    else:
        assert (guessed, missed) == ({}, {})
    # The server's own registry: nothing of the process's default one (gc, process, platform).
    assert not any(name.startswith(("python_", "process_")) for name, _ in samples)


async def test_workers_by_type_and_version_and_leases(door: ElectricServer, http: httpx.AsyncClient) -> None:
    assert (await http.put("/agent/a1")).status_code == 201
    async with grpc.aio.insecure_channel(door.address) as channel:
        hosting_agent = Worker(channel, "w1", ["agent", "job"], "v1")
        got = await hosting_agent.read()
        while not any(r.HasField("lease_granted") for r in got):  # the welcome, then agent/a1's lease
            got += await hosting_agent.read()
        (lease,) = [r.lease_granted.lease for r in got if r.HasField("lease_granted")]
        # Exec receipts, recorded through the lease: counted by action and disposition.
        receipts = [(pb.EXEC_ACTION_START, pb.EXEC_DISPOSITION_OBSERVED)] + 2 * [
            (pb.EXEC_ACTION_FORWARD, pb.EXEC_DISPOSITION_HELD)
        ]
        for request_id, (action, disposition) in enumerate(receipts, 1):
            write = rt.RuntimeWrite(
                request_id=request_id,
                ref=lease.ref,
                epoch=lease.epoch,
                expect_state=pb.STATE_SPAWNING,
                exec=pb.ExecReceipt(task_id="t", action=action, disposition=disposition),
            )
            hosting_agent.requests.put_nowait(rt.ConnectRequest(write=write))
            answers = [r for r in await hosting_agent.read() if r.HasField("write_result")]
            assert [a.write_result.applied for a in answers] == [True], answers
        others = [Worker(channel, f"w{n}", ["job", f"t{n}"], "v2") for n in range(2, 5)]
        for worker in others:
            assert [r.WhichOneof("msg") for r in await worker.read()] == ["welcome"]
        samples = await scrape(http)
        for worker in [hosting_agent, *others]:
            worker.close()

    assert value(samples, "electric_worker_sessions") == 4
    assert value(samples, "electric_leases_held") == 1
    assert {
        (dict(labels)["action"], dict(labels)["disposition"]): count
        for labels, count in family(samples, "electric_exec_actions_total").items()
    } == {("start", "observed"): 1, ("forward", "held"): 2}
    assert {
        (dict(labels)["type"], dict(labels)["code_version"]): count
        for labels, count in family(samples, "electric_workers").items()
    } == {
        ("agent", "v1"): 1,
        ("job", "v1"): 1,
        ("job", "v2"): 3,
        ("t2", "v2"): 1,
        ("t3", "v2"): 1,
        ("t4", "v2"): 1,
    }


async def test_worker_labels_are_capped(door: ElectricServer, http: httpx.AsyncClient) -> None:
    n = TOP_TYPES + 3  # workers, each hosting "job" and a type of its own, at a version of its own
    async with grpc.aio.insecure_channel(door.address) as channel:
        workers = [Worker(channel, f"w{i}", ["job", f"t{i:02}"], f"v{i:02}") for i in range(n)]
        for worker in workers:
            assert [r.WhichOneof("msg") for r in await worker.read()] == ["welcome"]
        samples = await scrape(http)
        for worker in workers:
            worker.close()

    series = {
        (dict(labels)["type"], dict(labels)["code_version"]): count
        for labels, count in family(samples, "electric_workers").items()
    }
    assert sum(series.values()) == 2 * n  # each worker once per type it hosts, none lost
    types = {type_ for type_, _ in series}
    # "job" has the most workers; then ties go by name, and the last types are summed as _other.
    assert types == {"job", OTHER} | {f"t{i:02}" for i in range(TOP_TYPES - 1)}
    assert sum(count for (type_, _), count in series.items() if type_ == OTHER) == n - (TOP_TYPES - 1)
    job = {version: count for (type_, version), count in series.items() if type_ == "job"}
    assert job == {**{f"v{i:02}": 1 for i in range(TOP_CODE_VERSIONS)}, OTHER: n - TOP_CODE_VERSIONS}


async def test_grace_deadlines_and_reaper_lateness(
    door: ElectricServer, http: httpx.AsyncClient, seed_state: SeedState
) -> None:
    for id_, grace_ms in (("slow", 600_000), ("quick", 50)):
        assert (await http.put(f"/agent/{id_}", json={"profile": {"grace_period_ms": grace_ms}})).is_success
        await seed_state(door.store, ("agent", id_), State.RUNNING, cause="started")
        stopping = await http.post(f"/agent/{id_}/signal", json={"signal": "SIGTERM"})
        assert stopping.json()["new_state"] == "stopping"
    async with grpc.aio.insecure_channel(door.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)  # type: ignore[no-untyped-call]
        with anyio.fail_after(20):  # until the reaper has stopped "quick" and its stream closed
            async for item in stub.WatchEvents(
                api.WatchEventsRequest(ref=pb.EntityRef(type="agent", id="quick"))
            ):
                if item.WhichOneof("item") == "end_of_stream":
                    break
    samples = await scrape(http)
    assert value(samples, "electric_grace_deadlines_pending") == 1  # "slow"'s
    assert value(samples, "electric_reaper_lateness_seconds_count") == 1  # "quick"'s expiry
    assert 0 <= value(samples, "electric_reaper_lateness_seconds_sum") < 10
    assert value(samples, "electric_signals_total", signal="SIGTERM", outcome="pending") == 2


async def test_metrics_need_the_read_scope(start_server: StartServer, tmp_path: Path) -> None:
    (tokens := tmp_path / "tokens.toml").write_text(TOKENS_TOML)
    tokens.chmod(0o600)
    secured = await start_server(http="127.0.0.1:0", tokens_file=tokens)
    assert secured.http is not None
    async with httpx.AsyncClient(base_url=secured.http.address) as http:
        for name, status in [
            (None, 401),
            ("bogus", 401),
            ("reader", 200),
            ("admin", 200),
            ("signaller", 403),
            ("typed", 403),  # read, but limited to types: the metrics span them all
        ]:
            token = TOKENS[name][0] if name in TOKENS else "wrong-token-000"
            headers = {} if name is None else {"authorization": f"Bearer {token}"}
            response = await http.get("/metrics", headers=headers)
            assert response.status_code == status, (name, response.text)
            if status != 200:
                assert set(response.json()["error"]) == {"code", "message", "details"}
        samples = await scrape(http, headers={"authorization": f"Bearer {TOKENS['reader'][0]}"})
        assert value(samples, "electric_store_writes_total") == 0
