"""``GET /{type}/{id}/state``: the entity's durable state over HTTP, the same rebuild as
``client.state``, read from a stream a real worker wrote (with a snapshot among its events)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from runtime.rt_support import COMPLETED, Probe, probe_app, run_status, running_worker, until

from electric_sdk.durable_state import SNAPSHOT_EVENT, SnapshotPolicy
from electric_sdk.testing import TestServer

pytestmark = pytest.mark.anyio


async def test_the_state_route_answers_what_client_state_rebuilds(tmp_path: Path) -> None:
    with TestServer(tmp_path / "electric", http="127.0.0.1:0") as electric:
        async with (
            electric.async_client() as client,
            running_worker(probe_app(Probe(), snapshots=SnapshotPolicy(every_ops=2)), electric.address),
            httpx.AsyncClient(base_url=electric.http_address) as http,
        ):
            await client.spawn("probe/s1")
            for note in ("a", "b", "c", "d", "<e>"):
                key = (await client.send("probe/s1", f"remember {note}")).key
                await until(client, "probe/s1", run_status(COMPLETED, key))
            events = (await client.events("probe/s1", 0, 1000)).events
            assert any(e.type == SNAPSHOT_EVENT for e in events)  # the rebuild starts from one
            expected = {"notes": ["a", "b", "c", "d", "<e>"]}
            assert await client.state("probe/s1") == expected
            for prefix in ("", "/_electric/entities"):
                answer = await http.get(f"{prefix}/probe/s1/state")
                assert answer.status_code == 200, answer.text
                assert answer.json() == expected
            missing = await http.get("/probe/nope/state")
            assert missing.status_code == 404
            assert missing.json()["error"]["code"] == "ENTITY_NOT_FOUND"
