"""Fork and retry through the HTTP door, on both stores: the Durable Streams fork headers on a
create, the JSON routes, and every refusal with its error body, writing nothing.

No worker is needed: a message cancelled before its run started (a scoped SIGINT) has an
`aborted` run record, which is a run a retry may run again.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from electric_server.app import ElectricServer

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]

JSON = {"content-type": "application/json"}


def error_of(response: httpx.Response) -> tuple[int, str]:
    body = response.json()
    assert set(body["error"]) == {"code", "message", "details"}, body
    return response.status_code, body["error"]["code"]


async def _events(http: httpx.AsyncClient, path: str) -> list[dict[str, Any]]:
    page = await http.get(f"{path}/events", params={"limit": 1000})
    assert page.status_code == 200, page.text
    events: list[dict[str, Any]] = page.json()["events"]
    return events


def _body(event: dict[str, Any]) -> tuple[Any, ...]:
    """What a fork keeps of a copied event: all but the headers (those are its own commit's)."""
    return (event["offset"], event["type"], event["key"], event["headers"]["operation"], event["value"])


async def _origin(http: httpx.AsyncClient, path: str) -> tuple[str, str]:
    """An entity with a cancelled message (its run `aborted`) and a queued one."""
    assert (await http.put(path)).status_code == 201
    cancelled = (await http.post(f"{path}/messages", json={"text": "first"})).json()["key"]
    queued = (await http.post(f"{path}/messages", json={"text": "second"})).json()["key"]
    sigint = await http.post(f"{path}/signal", json={"signal": "SIGINT", "message_key": cancelled})
    assert sigint.status_code == 200, sigint.text
    return cancelled, queued


async def test_a_put_with_the_fork_headers_forks_at_the_offset(http: httpx.AsyncClient) -> None:
    await _origin(http, "/agent/o1")
    origin = await _events(http, "/agent/o1")
    head = len(origin)
    at = head - 1  # before the SIGINT's record

    forked = await http.put(
        "/agent/f1",
        headers={"Stream-Forked-From": "/agent/o1/stream", "Stream-Fork-Offset": f"{at:020d}"},
    )
    assert forked.status_code == 201, forked.text
    assert forked.json()["state"] == "idle"
    events = await _events(http, "/agent/f1")
    assert [_body(e) for e in events[:at]] == [_body(e) for e in origin[:at]]
    assert events[at]["type"] == "electric.fork"
    assert events[at]["value"]["data"] == {
        "origin": "/agent/o1",
        "offset": at,
        "sender": "anonymous",
        "reason": "",
    }
    assert events[-1]["value"] == {"state": "idle", "previous_state": None, "cause": "fork"}

    # No offset: at the head, named by the origin's path under /_electric/entities.
    whole = await http.put("/agent/f2", headers={"Stream-Forked-From": "/_electric/entities/agent/o1"})
    assert whole.status_code == 201, whole.text
    events = await _events(http, "/agent/f2")
    assert [_body(e) for e in events[:head]] == [_body(e) for e in origin]
    assert [e["type"] for e in events[head:]] == ["electric.fork", "state"]


async def test_bad_offsets_and_origins_are_refused_and_write_nothing(
    http: httpx.AsyncClient, door: ElectricServer
) -> None:
    await _origin(http, "/agent/o2")
    head = len(await _events(http, "/agent/o2"))
    for offset, status in (
        ("-1", 400),
        ("abc", 400),
        ("1.5", 400),
        ("now", 400),
        ("9" * 21, 400),
        (str(head + 1), 409),
    ):
        refused = await http.put(
            "/agent/bad", headers={"Stream-Forked-From": "/agent/o2", "Stream-Fork-Offset": offset}
        )
        assert error_of(refused) == (status, "INVALID_OFFSET"), (offset, refused.text)
    for body in ({"id": "bad", "offset": -1}, {"id": "bad", "offset": "2"}, {"id": "bad", "offset": 2.5}):
        refused = await http.post("/agent/o2/fork", json=body)
        assert error_of(refused) == (400, "INVALID_FIELD"), (body, refused.text)
    refused = await http.post("/agent/o2/fork", json={"id": "bad", "offset": head + 1})
    assert error_of(refused) == (409, "INVALID_OFFSET")  # past the head: not there yet
    for origin in ("/other/o2", "agent/o2", "/agent", "/agent/o2/events"):
        refused = await http.put("/agent/bad", headers={"Stream-Forked-From": origin})
        assert error_of(refused) == (400, "INVALID_FORK_ORIGIN"), origin
    refused = await http.put("/agent/bad", headers={"Stream-Forked-From": "/agent/nobody"})
    assert error_of(refused) == (404, "ENTITY_NOT_FOUND")
    refused = await http.put(
        "/agent/bad", headers={"Stream-Forked-From": "/agent/o2"}, json={"profile": {"grace_period_ms": 10}}
    )
    assert error_of(refused) == (400, "UNKNOWN_FIELD")
    assert error_of(await http.get("/agent/bad")) == (404, "ENTITY_NOT_FOUND")
    assert len(await _events(http, "/agent/o2")) == head
    # An existing id: refused, its stream untouched.
    assert (await http.post("/agent/o2/fork", json={"id": "f3"})).status_code == 201
    kept = await _events(http, "/agent/f3")
    refused = await http.post("/agent/o2/fork", json={"id": "f3", "offset": 1})
    assert error_of(refused) == (409, "ENTITY_EXISTS")
    assert await _events(http, "/agent/f3") == kept


async def test_the_json_fork_is_idempotent_and_forks_a_killed_entity(http: httpx.AsyncClient) -> None:
    await _origin(http, "/agent/o3")
    assert (await http.delete("/agent/o3")).status_code == 200  # SIGKILL
    key = {"Idempotency-Key": "fork-o3"}
    first = await http.post("/agent/o3/fork", json={"id": "f4", "reason": "a second life"}, headers=key)
    assert first.status_code == 201, first.text
    again = await http.post("/agent/o3/fork", json={"id": "f4", "reason": "a second life"}, headers=key)
    assert again.status_code == 201
    assert again.json() == first.json()
    assert first.json()["state"] == "idle"
    events = await _events(http, "/agent/f4")
    fork = next(e for e in events if e["type"] == "electric.fork")
    assert fork["value"]["data"]["reason"] == "a second life"
    # The fork takes messages; the killed origin does not.
    assert (await http.post("/agent/f4/messages", json={"text": "again"})).status_code == 200
    assert error_of(await http.post("/agent/o3/messages", json={"text": "again"})) == (409, "ENTITY_TERMINAL")


async def test_retry_over_http_and_its_refusals(http: httpx.AsyncClient) -> None:
    cancelled, queued = await _origin(http, "/agent/o4")
    head = len(await _events(http, "/agent/o4"))
    refusals = [
        ({"run": cancelled, "from_step": 1}, (409, "INVALID_STEP")),  # it recorded no step
        ({"run": cancelled, "from_step": -1}, (400, "INVALID_FIELD")),
        ({"run": "msg_nope"}, (404, "RUN_NOT_FOUND")),
        ({"run": queued}, (409, "RUN_NOT_RETRYABLE")),
        ({"from_step": 0}, (400, "INVALID_NAME")),
    ]
    for body, expected in refusals:
        assert error_of(await http.post("/agent/o4/retry", json=body)) == expected, body
    assert len(await _events(http, "/agent/o4")) == head

    key = {"Idempotency-Key": "retry-o4"}
    retried = await http.post("/agent/o4/retry", json={"run": cancelled, "reason": "once more"}, headers=key)
    assert retried.status_code == 200, retried.text
    receipt = retried.json()
    again = await http.post("/agent/o4/retry", json={"run": cancelled, "reason": "once more"}, headers=key)
    assert again.json() == receipt  # the same key: the first answer, one message
    assert len(await _events(http, "/agent/o4")) == receipt["offset"] + 1
    reused = await http.post("/agent/o4/retry", json={"run": cancelled, "reason": "other"}, headers=key)
    assert error_of(reused) == (400, "IDEMPOTENCY_KEY_REUSED")
    assert receipt["retry_of"] == cancelled
    assert receipt["from_step"] == 0
    message = (await _events(http, "/agent/o4"))[receipt["offset"]]
    assert message["value"]["text"] == "first"
    assert message["value"]["retry"]["reason"] == "once more"

    assert (await http.delete("/agent/o4")).status_code == 200
    refused = await http.post("/agent/o4/retry", json={"run": cancelled})
    assert error_of(refused) == (409, "ENTITY_TERMINAL")
    assert "fork it instead" in refused.json()["error"]["message"]
