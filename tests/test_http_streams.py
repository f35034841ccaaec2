"""Entity streams over HTTP (issue 21): the Durable Streams protocol's read side and SSE.

Real servers (in-process, or a real `electric server` process where a restart or a
SIGTERM is the point) and a real HTTP client; SSE is parsed here by hand. Every read
is checked against the entity's own event log (ReadEvents' page), so a resumed read
that repeats or skips an event fails.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
from conftest import read_database
from electric_server.app import ElectricServer
from test_auth import TOKENS, TOKENS_TOML

if TYPE_CHECKING:
    from conftest import ServerProcess, StartServer

pytestmark = pytest.mark.anyio

PREFIXES = ["", "/_electric/entities"]


@dataclass
class Sse:
    """One SSE response read by hand: its events as (event, data, id), and its comments."""

    response: httpx.Response
    lines: AsyncIterator[str]
    comments: int = 0
    ids: list[str] = field(default_factory=list)

    async def next(self, comments: bool = False) -> tuple[str, str] | None:
        """The next event (comments counted; returned as ``(":", text)`` if ``comments``);
        None when the body ends."""
        name, data, event_id = "message", [], None
        async for line in self.lines:
            if line == "":
                if data:
                    if event_id is not None:
                        self.ids.append(event_id)
                    return name, "\n".join(data)
                continue
            if line.startswith(":"):
                self.comments += 1
                if comments:
                    return ":", line[1:].strip()
                continue
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "event":
                name = value
            elif key == "data":
                data.append(value)
            elif key == "id":
                event_id = value
        return None

    async def batch(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The events of the next data event (none if a control comes first) and its control."""
        events: list[dict[str, Any]] = []
        while True:
            got = await self.next()
            assert got is not None, "the SSE body ended before a control event"
            name, data = got
            if name == "data":
                events += json.loads(data)
            elif name == "control":
                return events, json.loads(data)


@contextlib.asynccontextmanager
async def sse(client: httpx.AsyncClient, url: str, **params: str) -> AsyncIterator[Sse]:
    async with client.stream("GET", url, params={"live": "sse", **params}) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        yield Sse(response, response.aiter_lines())


async def log_of(client: httpx.AsyncClient, one: str) -> list[dict[str, Any]]:
    """The entity's whole log as change messages (the plain page, offsets dropped)."""
    page = (await client.get(f"{one}/events", params={"limit": 1000})).json()
    return [{k: v for k, v in e.items() if k != "offset"} for e in page["events"]]


async def send(client: httpx.AsyncClient, one: str, *texts: str) -> None:
    for text in texts:
        r = await client.post(f"{one}/messages", json={"text": text})
        assert r.status_code == 200, r.text


async def until(condition: Callable[[], Awaitable[bool]]) -> None:
    """Until ``condition`` holds. For a reader that is waiting at the tail, the server has no event
    to await: the open watches it counts (and /metrics reports) are the fact to wait for."""
    with anyio.fail_after(10):
        while not await condition():  # noqa: ASYNC110
            await anyio.sleep(0.005)


async def watchers(server: ElectricServer, count: int) -> None:
    """Until ``count`` event watches are open (a long-poll or SSE reader is waiting)."""

    async def opened() -> bool:
        return server.watches is not None and server.watches.watching()["events"] >= count

    await until(opened)


# -- catch-up ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", PREFIXES)
async def test_catch_up_reads_the_log_as_change_messages(http: httpx.AsyncClient, prefix: str) -> None:
    one = f"{prefix}/agent/c1"
    assert (await http.put(one)).status_code == 201
    await send(http, one, "a", "b")
    first = await http.get(f"{one}/stream", params={"offset": "-1"})
    assert first.status_code == 200
    assert first.headers["content-type"] == "application/json"
    body = first.json()
    assert body == await log_of(http, one)  # exactly the log, each event without an offset
    assert all(set(e) == {"type", "key", "value", "headers"} for e in body)
    assert first.headers["stream-up-to-date"] == "true"
    assert "stream-closed" not in first.headers
    offset = first.headers["stream-next-offset"]
    # Omitting the offset is -1; at the tail: an empty array, still up to date, not cached.
    assert (await http.get(f"{one}/stream")).json() == body
    tail = await http.get(f"{one}/stream", params={"offset": offset})
    assert tail.json() == []
    assert tail.headers["stream-next-offset"] == offset
    assert tail.headers["stream-up-to-date"] == "true"
    assert tail.headers["cache-control"] == "no-store"
    await send(http, one, "c")
    more = await http.get(f"{one}/stream", params={"offset": offset})
    assert [e["value"]["text"] for e in more.json()] == ["c"]
    assert more.headers["stream-next-offset"] > offset  # offsets sort as text
    # `now`: the tail, no events.
    now = await http.get(f"{one}/stream", params={"offset": "now"})
    assert now.json() == []
    assert now.headers["stream-next-offset"] == more.headers["stream-next-offset"]


async def test_catch_up_pages_a_long_stream(http: httpx.AsyncClient) -> None:
    one = "/agent/long"
    await http.put(one)
    await send(http, one, *(f"m{i}" for i in range(1100)))
    first = await http.get(f"{one}/stream", params={"offset": "-1"})
    assert len(first.json()) == 1000
    assert "stream-up-to-date" not in first.headers  # more to read
    rest = await http.get(f"{one}/stream", params={"offset": first.headers["stream-next-offset"]})
    assert len(rest.json()) == 101
    assert rest.headers["stream-up-to-date"] == "true"


async def test_bad_offsets_and_queries_are_refused(http: httpx.AsyncClient) -> None:
    await http.put("/agent/q1")
    for params in (
        {"offset": "abc"},
        {"offset": "-2"},
        {"offset": "1" * 21},
        {"offset": " 1"},
        {"live": "forever"},
        {"live": ""},
        {"timeout": "soon"},
        {"timeout": ""},
        {"offset": "-1", "limit": "3"},
    ):
        r = await http.get("/agent/q1/stream", params=params)
        assert r.status_code == 400, (params, r.text)
        assert r.json()["error"]["code"] in {
            "INVALID_OFFSET",
            "INVALID_FIELD",
            "UNKNOWN_FIELD",
            "INVALID_DURATION",
        }, r.text
    # Of the right form but past the end (not one this server sent): not there yet, 409, as a
    # fork's offset past the head is; the largest 20 digits too.
    for offset in ("99", "9" * 20):
        r = await http.get("/agent/q1/stream", params={"offset": offset})
        assert r.status_code == 409, (offset, r.text)
        assert r.json()["error"]["code"] == "INVALID_OFFSET", r.text
    missing = await http.get("/agent/nobody/stream")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "ENTITY_NOT_FOUND"


async def test_etag_gives_304_and_changes_on_close(http: httpx.AsyncClient) -> None:
    one = "/agent/e1"
    await http.put(one)
    await send(http, one, "a")
    first = await http.get(f"{one}/stream", params={"offset": "-1"})
    etag = first.headers["etag"]
    again = await http.get(f"{one}/stream", params={"offset": "-1"}, headers={"if-none-match": etag})
    assert again.status_code == 304
    assert again.content == b""
    assert again.headers["stream-next-offset"] == first.headers["stream-next-offset"]
    await send(http, one, "b")  # new data: a new range, a new tag
    grown = await http.get(f"{one}/stream", params={"offset": "-1"}, headers={"if-none-match": etag})
    assert grown.status_code == 200
    assert len(grown.json()) == 3
    tail = grown.headers["stream-next-offset"]
    open_tail = await http.get(f"{one}/stream", params={"offset": tail})
    await http.post(f"{one}/signal", json={"signal": "SIGKILL"})
    end = (await http.get(f"{one}/stream", params={"offset": "-1"})).headers["stream-next-offset"]
    closed_tail = await http.get(
        f"{one}/stream", params={"offset": end}, headers={"if-none-match": open_tail.headers["etag"]}
    )
    assert closed_tail.status_code == 200
    assert closed_tail.headers["stream-closed"] == "true"
    assert closed_tail.headers["etag"].endswith(':c"')


# -- live ---------------------------------------------------------------------------------------------


async def test_long_poll_waits_for_the_next_commit(door: ElectricServer, http: httpx.AsyncClient) -> None:
    one = "/agent/lp"
    await http.put(one)
    tail = (await http.get(f"{one}/stream")).headers["stream-next-offset"]
    async with anyio.create_task_group() as tg:
        got: list[httpx.Response] = []

        async def poll() -> None:
            got.append(await http.get(f"{one}/stream", params={"offset": tail, "live": "long-poll"}))

        tg.start_soon(poll)
        await watchers(door, 1)  # the poll is waiting at the tail
        await send(http, one, "live")
    (response,) = got
    assert response.status_code == 200
    assert [e["value"]["text"] for e in response.json()] == ["live"]
    assert response.json() == (await log_of(http, one))[-1:]
    assert response.headers["stream-cursor"].isdigit()
    assert response.headers["stream-next-offset"] > tail


async def test_long_poll_times_out_with_204(start_server: StartServer) -> None:
    server = await start_server(http="127.0.0.1:0", http_long_poll_ms=50)
    assert server.http is not None
    async with httpx.AsyncClient(base_url=server.http.address) as client:
        await client.put("/agent/lp2")
        tail = (await client.get("/agent/lp2/stream")).headers["stream-next-offset"]
        r = await client.get("/agent/lp2/stream", params={"offset": tail, "live": "long-poll", "cursor": "1"})
        assert r.status_code == 204
        assert r.content == b""
        assert r.headers["stream-next-offset"] == tail
        assert r.headers["stream-up-to-date"] == "true"
        cursor = r.headers["stream-cursor"]
        # A client echoing a cursor at or past now gets a later one (the protocol's cache rule).
        echo = await client.get(
            "/agent/lp2/stream", params={"offset": tail, "live": "long-poll", "cursor": cursor}
        )
        assert int(echo.headers["stream-cursor"]) > int(cursor)


async def test_sse_catches_up_then_tails(http: httpx.AsyncClient) -> None:
    one = "/agent/s1"
    await http.put(one)
    await send(http, one, "a", "b")
    async with sse(http, f"{one}/stream", offset="-1") as stream:
        events, control = await stream.batch()
        assert events == await log_of(http, one)
        assert control["upToDate"] is True
        assert control["streamCursor"].isdigit()
        await send(http, one, "c")
        live, control2 = await stream.batch()
        assert [e["value"]["text"] for e in live] == ["c"]
        assert control2["streamNextOffset"] > control["streamNextOffset"]
        assert stream.ids[-1] == control2["streamNextOffset"]  # SSE ids: resumable by Last-Event-ID
    async with http.stream(
        "GET",
        f"{one}/stream",
        params={"offset": "-1", "live": "sse"},
        headers={"last-event-id": stream.ids[0]},
    ) as response:
        resumed = Sse(response, response.aiter_lines())
        events, _ = await resumed.batch()
        assert [e["value"]["text"] for e in events] == ["c"]  # from Last-Event-ID, not from -1


async def test_a_reader_that_leaves_frees_its_watch(door: ElectricServer, http: httpx.AsyncClient) -> None:
    await http.put("/agent/gone")
    async with sse(http, "/agent/gone/stream", offset="-1") as stream:
        await stream.batch()
        await watchers(door, 1)
    # The client closed the connection: the server ends the response and the watch with it.

    async def closed() -> bool:
        return door.watches is not None and door.watches.watching()["events"] == 0

    await until(closed)


async def test_sse_heartbeats_while_idle(start_server: StartServer) -> None:
    server = await start_server(http="127.0.0.1:0", sse_heartbeat_ms=5)
    assert server.http is not None
    async with httpx.AsyncClient(base_url=server.http.address) as client:
        await client.put("/agent/hb")
        async with sse(client, "/agent/hb/stream", offset="now") as stream:
            events, control = await stream.batch()
            assert events == []
            assert control["upToDate"] is True
            with anyio.fail_after(10):  # nothing is committed: only heartbeats come
                for _ in range(3):
                    assert await stream.next(comments=True) == (":", "heartbeat")


async def test_entities_sse_snapshot_then_changes(http: httpx.AsyncClient) -> None:
    await http.put("/agent/w0")
    await http.put("/other/o1")  # not the watched type
    for i, prefix in enumerate(("/entities", "/_electric/entities"), start=1):
        with anyio.fail_after(20):
            async with sse(http, prefix, type="agent") as stream:
                name, data = await stream.next() or ("", "")
                assert name == "snapshot"
                assert [e["id"] for e in json.loads(data)] == [f"w{n}" for n in range(i)]
                name, data = await stream.next() or ("", "")
                assert name == "snapshot-complete"
                await http.put(f"/other/o{i + 1}")
                await http.put(f"/agent/w{i}")
                await http.post(f"/agent/w{i}/signal", json={"signal": "SIGKILL"})
                changes = []
                while len(changes) < 2:
                    name, data = await stream.next() or ("", "")
                    assert name == "change"
                    changes += json.loads(data)
                    assert stream.ids[-1] == changes[-1]["entity"]["txid"]
                assert [(c["entity"]["id"], c["previous_state"], c["entity"]["state"]) for c in changes] == [
                    (f"w{i}", None, "spawning"),
                    (f"w{i}", "spawning", "killed"),
                ]
    listed = (await http.get("/entities", params={"type": "agent"})).json()  # the list is unchanged
    assert [e["id"] for e in listed["entities"]] == ["w0", "w1", "w2"]
    bad = await http.get("/entities", params={"live": "sse", "type": "no/such"})
    assert bad.status_code == 400


# -- closed -------------------------------------------------------------------------------------------


async def test_a_closed_stream_reads_as_closed(http: httpx.AsyncClient) -> None:
    one = "/agent/k1"
    await http.put(one)
    async with sse(http, f"{one}/stream", offset="-1") as stream:
        await stream.batch()
        await http.post(f"{one}/signal", json={"signal": "SIGKILL"})
        final: list[dict[str, Any]] = []
        while True:
            events, control = await stream.batch()
            final += events
            if control.get("streamClosed"):
                break
        assert [e["type"] for e in final] == ["signal", "state"]
        assert "streamCursor" not in control
        assert await stream.next() is None  # the server ends the response after the closing control
    end = control["streamNextOffset"]
    tail = await http.get(f"{one}/stream", params={"offset": end})
    assert tail.json() == []
    assert tail.headers["stream-closed"] == "true"
    with anyio.fail_after(10):  # no waiting on a closed stream
        poll = await http.get(f"{one}/stream", params={"offset": end, "live": "long-poll"})
    assert poll.status_code == 204
    assert poll.headers["stream-closed"] == "true"
    assert "stream-cursor" not in poll.headers
    head = await http.head(f"{one}/stream")
    assert head.status_code == 200
    assert head.headers["stream-closed"] == "true"
    assert head.headers["stream-next-offset"] == end
    assert head.content == b""
    async with sse(http, f"{one}/stream", offset="now") as at_end:
        events, control = await at_end.batch()
        assert events == []
        assert control == {"streamNextOffset": end, "streamClosed": True, "upToDate": True}
        assert await at_end.next() is None


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
async def test_writes_to_a_stream_are_refused(
    door: ElectricServer, http: httpx.AsyncClient, prefix: str, method: str
) -> None:
    await http.put("/agent/r1")
    before = read_database(door.config.database)
    r = await http.request(method, f"{prefix}/agent/r1/stream", json={"text": "no"})
    assert r.status_code == 405
    assert r.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
    assert set(r.headers["allow"].split(", ")) == {"GET", "HEAD"}
    assert read_database(door.config.database) == before


# -- auth ---------------------------------------------------------------------------------------------


async def test_stream_routes_need_read_and_keep_to_types(start_server: StartServer, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS_TOML)
    tokens.chmod(0o600)
    server = await start_server(http="127.0.0.1:0", tokens_file=tokens, http_long_poll_ms=50)
    assert server.http is not None

    def bearer(name: str) -> dict[str, str]:
        return {"authorization": f"Bearer {TOKENS[name][0]}"}

    async with httpx.AsyncClient(base_url=server.http.address, timeout=30) as client:
        for type_ in ("agent", "other"):
            assert (await client.put(f"/{type_}/a", headers=bearer("admin"))).status_code == 201
        reads = [
            ("/agent/a/stream", {}),
            ("/agent/a/stream", {"live": "long-poll", "offset": "now"}),
            ("/agent/a/stream", {"live": "sse", "offset": "now"}),
            ("/entities", {"live": "sse", "type": "agent"}),
        ]
        cases = [(None, 401), ("signaller", 403), ("worker", 403)]
        for url, params in reads:
            for who, status in cases:
                r = await client.get(url, params=params, headers=bearer(who) if who else {})
                assert r.status_code == status, (url, params, who, r.text)
            for who in ("reader", "typed"):
                async with client.stream("GET", url, params=params, headers=bearer(who)) as r:
                    assert r.status_code in {200, 204}, (url, who)
        # A principal limited to `agent` reads no other type's stream, nor every type's changes.
        for url, params in [("/other/a/stream", {}), ("/entities", {"live": "sse"})]:
            r = await client.get(url, params=params, headers=bearer("typed"))
            assert (r.status_code, r.json()["error"]["code"]) == (403, "TYPE_NOT_ALLOWED"), r.text


# -- drain and restart --------------------------------------------------------------------------------


def http_address(proc: ServerProcess) -> str:
    """The HTTP door's address: the line `electric server` prints after its gRPC one."""
    assert proc.proc.stdout is not None
    for line in proc.proc.stdout:
        proc.lines.append(line)
        if line.startswith("electric http listening on "):
            return line.split()[-1]
    raise AssertionError("no HTTP address:\n" + "".join(proc.lines))


async def test_resume_across_a_restart_exactly_once(
    server_process: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """SIGTERM ends an SSE response and a long-poll cleanly; after a restart, reads resumed from
    their last offsets get every later event once."""
    data = tmp_path / "data"
    flags = ("--http", "127.0.0.1:0", "--drain-grace", "30s")
    first = server_process(data, *flags)
    base = http_address(first)
    one = "/agent/rs"
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        await client.put(one)
        await send(client, one, "a", "b")
        seen: list[dict[str, Any]] = []
        async with sse(client, f"{one}/stream", offset="-1") as stream:
            events, control = await stream.batch()
            seen += events
            await send(client, one, "c")
            events, control = await stream.batch()
            seen += events
            sse_offset = control["streamNextOffset"]
            poll_offset = sse_offset
            async with anyio.create_task_group() as tg:
                polled: list[httpx.Response] = []

                async def poll() -> None:
                    polled.append(
                        await client.get(f"{one}/stream", params={"offset": poll_offset, "live": "long-poll"})
                    )

                tg.start_soon(poll)

                # Until the poll waits (the SSE reader is one watch, the poll the second).
                async def waiting() -> bool:
                    return _open_event_watches((await client.get("/metrics")).text) >= 2

                await until(waiting)
                first.send(signal.SIGTERM)
                # The drain ends the SSE body cleanly (a cut one raises here) well inside the grace.
                with anyio.fail_after(20):
                    assert await stream.next() is None
            (drained_poll,) = polled
            assert drained_poll.status_code == 204
            assert drained_poll.headers["stream-next-offset"] == poll_offset
        assert first.wait() == 0
    second = server_process(data, *flags)
    async with httpx.AsyncClient(base_url=http_address(second), timeout=30) as client:
        await send(client, one, "d", "e")
        async with sse(client, f"{one}/stream", offset=sse_offset) as stream:
            events, control = await stream.batch()
            assert control["upToDate"] is True
        assert seen + events == await log_of(client, one)  # nothing twice, nothing missed
        resumed = await client.get(f"{one}/stream", params={"offset": poll_offset, "live": "long-poll"})
        assert resumed.json() == events


def _open_event_watches(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("electric_watch_streams") and 'kind="events"' in line:
            return float(line.split()[-1])
    return 0.0


async def test_sse_resumes_on_another_replica(
    postgres_url: str, start_server: StartServer, tmp_path: Path
) -> None:
    """On PostgreSQL: a reader of replica A sees what replica B commits, live; when A drains,
    its SSE response ends cleanly and the reader resumes on B from its last offset, each event
    once."""
    a = await start_server(tmp_path / "a", http="127.0.0.1:0", database_url=postgres_url)
    b = await start_server(tmp_path / "b", http="127.0.0.1:0", database_url=postgres_url)
    assert a.http is not None
    assert b.http is not None
    one = "/agent/pg"
    async with (
        httpx.AsyncClient(base_url=a.http.address, timeout=30) as on_a,
        httpx.AsyncClient(base_url=b.http.address, timeout=30) as on_b,
    ):
        await on_b.put(one)
        await send(on_b, one, "a")
        seen: list[dict[str, Any]] = []
        with anyio.fail_after(30):
            async with sse(on_a, f"{one}/stream", offset="-1") as stream:
                while not seen:  # B's spawn and message reach A through the store
                    events, control = await stream.batch()
                    seen += events
                await send(on_b, one, "b")  # committed on B, read live on A
                while seen[-1]["value"].get("text") != "b":
                    events, control = await stream.batch()
                    seen += events
                await a.stop(5)  # A drains: its SSE response ends cleanly
                assert await stream.next() is None
        await send(on_b, one, "c")
        async with sse(on_b, f"{one}/stream", offset=control["streamNextOffset"]) as stream:
            events, _ = await stream.batch()
        assert seen + events == await log_of(on_b, one)


async def test_a_caller_bounds_live_reads_with_timeout(door: ElectricServer, http: httpx.AsyncClient) -> None:
    """``timeout`` bounds how long a live read holds (the server's long-poll is 20 s here): a
    long-poll at the tail answers 204 once it passes, an SSE response ends as on a drain (its
    last control event says where to resume), and the entities' SSE too, which also takes the
    list's page parameters (checked, the snapshot sent whole)."""
    one = "/agent/bounded"
    await http.put(one)
    tail = (await http.get(f"{one}/stream")).headers["stream-next-offset"]
    polled = await http.get(f"{one}/stream", params={"offset": tail, "live": "long-poll", "timeout": "20ms"})
    assert polled.status_code == 204, polled.text
    assert polled.headers["stream-next-offset"] == tail
    with anyio.fail_after(10):
        streamed = await http.get(f"{one}/stream", params={"offset": "-1", "live": "sse", "timeout": "50ms"})
    assert streamed.status_code == 200, streamed.text
    assert streamed.headers["content-type"].startswith("text/event-stream")
    last = [line for line in streamed.text.splitlines() if line.startswith("data: ")][-1]
    assert json.loads(last.removeprefix("data: "))["streamNextOffset"] == tail
    with anyio.fail_after(10):
        watched = await http.get(
            "/entities", params={"live": "sse", "timeout": "50ms", "page_size": "10", "type": "agent"}
        )
    assert watched.status_code == 200, watched.text
    assert "event: snapshot-complete" in watched.text
    for params in ({"page_size": "1001"}, {"page_token": "no-slash"}, {"timeout": "1 s"}):
        refused = await http.get("/entities", params={"live": "sse", **params})
        assert refused.status_code == 400, (params, refused.text)
    # Without live, timeout is checked and unused.
    assert (await http.get("/entities", params={"timeout": "5s"})).status_code == 200
    assert (await http.get("/entities", params={"timeout": "soon"})).status_code == 400
    assert (await http.get(f"{one}/stream", params={"timeout": "5s"})).status_code == 200
