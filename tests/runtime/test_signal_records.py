"""A signal's outcome update carries the signal record's whole value (issue 19, point 6).

A reader that keeps the latest value of each key (the RFC's update semantics)
must still know who sent the signal, why, with what payload, and in which
states, once the runtime has reported the outcome.
"""

from __future__ import annotations

import pytest

from electric_sdk import AsyncClient, Event
from electric_sdk.lifecycle import Signal
from electric_sdk.testing import TestServer

from .rt_support import Probe, outcome_of, probe_app, running_worker, until

pytestmark = pytest.mark.anyio

# What the outcome changes; every other field of the value is the insert's.
REPORTED = {"outcome", "detail"}


def latest_values(events: list[Event]) -> dict[str, dict[str, object]]:
    """Each key's latest value, as a reader applying inserts and updates in order keeps it."""
    return {e.key: e.value for e in events}


async def test_an_outcome_update_keeps_the_signals_whole_value(
    electric: TestServer, client: AsyncClient
) -> None:
    probe = Probe()
    async with running_worker(probe_app(probe), electric.address):
        await client.spawn("probe/rec")
        await client.wait_for_state("probe/rec", "running", timeout=10)
        sent = [
            await client.usr("probe/rec", {"rotate": "keys"}, reason="keys leaked"),
            await client.interrupt("probe/rec", reason="nothing to stop"),  # no run: ignored
            await client.terminate("probe/rec", reason="scale down"),
        ]
        for result in sent:
            await until(client, "probe/rec", outcome_of(result.key))
        await client.wait_for_state("probe/rec", "stopped", timeout=10)
    events = (await client.events("probe/rec", limit=1000)).events
    latest = latest_values(events)
    for result in sent:
        insert = next(e for e in events if e.key == result.key and e.operation == "insert")
        update = latest[result.key]
        assert update["outcome"] != "pending", update
        assert {k: v for k, v in update.items() if k not in REPORTED} == {
            k: v for k, v in insert.value.items() if k not in REPORTED
        }
        assert update["sender"] == "anonymous"
        assert update["reason"]
        assert update["previous_state"] == "running"
    usr = latest[sent[0].key]
    assert (usr["signal"], usr["payload"], usr["outcome"]) == (
        Signal.SIGUSR.value,
        {"rotate": "keys"},
        "delivered",
    )
    assert latest[sent[2].key]["new_state"] == "stopping"
