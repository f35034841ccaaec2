"""The door's route table (fastpaths/route_table.py) routes exactly as Starlette's own ``Router``.

The door's Starlette routes (``starlette_routes``, every route of http/routes.py and its aliases
under ``/_electric/entities``, the catch-all under ``/_electric``) are built once with endpoints
that answer their route's name and path parameters. The route table in front of the Starlette
app of those routes (as the door serves them) and a bare ``starlette.routing.Router`` of the same
routes then answer each request: the same status (a 404, a 405 and its ``Allow``, Starlette's
trailing-slash redirect), and for a match the same endpoint and path parameters. The requests
are every route's paths and a systematic set around them (near-misses, wrong methods, trailing
and doubled slashes, percent-encoded segments, the aliases), then paths hypothesis generates.
And the table does take every route it can, so the fast path is not lost unnoticed.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from electric_server.fastpaths.route_table import RouteTable
from electric_server.http.admission import Endpoint
from electric_server.http.door import route_error, starlette_routes
from electric_server.http.routes import HttpRoute
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route, Router
from starlette.types import ASGIApp, Message

METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"]
# Path parameters as a client writes them (percent-encoded where it must); the server sees them decoded.
SEGMENTS = [
    "agent",
    "a1",
    "A-1.b_c",
    "_electric",
    "entities",
    "healthz",
    "%20",
    "%C3%BC",
    "a%2Fb",
    "%25",
    ".",
    "..",
]
Answer = tuple[int, str, str]  # status; the endpoint's answer (what it is, its parameters); Allow or Location


def _probe(route: HttpRoute) -> Endpoint:
    """An endpoint that answers which route it is and the path parameters it was given."""

    async def endpoint(request: Request) -> Response:
        params = ",".join(f"{k}={v}" for k, v in sorted(request.path_params.items()))
        return PlainTextResponse(f"{route.method} {route.operation} {params}")

    return endpoint


ROUTES: list[BaseRoute] = starlette_routes(_probe)
STARLETTE = Starlette(routes=ROUTES, exception_handlers={HTTPException: route_error})
TABLE = RouteTable(ROUTES, STARLETTE)  # as the door serves: the table, Starlette behind it
ORACLE = Router(routes=ROUTES)  # Starlette's own router, nothing in front of it
TEMPLATES = sorted(r.path for r in ROUTES if isinstance(r, Route))


def _scope(method: str, raw_path: str) -> dict[str, Any]:
    """The scope uvicorn makes of a request line's path: ``path`` decoded, ``raw_path`` as sent."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "server": ("door", 80),
        "client": ("127.0.0.1", 50000),
        "root_path": "",
        "path": urllib.parse.unquote(raw_path),
        "raw_path": raw_path.encode("ascii"),
        "query_string": b"",
        "headers": [(b"host", b"door")],
    }


async def _answer(app: ASGIApp, method: str, raw_path: str) -> Answer:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    try:
        await app(_scope(method, raw_path), receive, send)
    except HTTPException as exc:  # a bare Router lets the catch-all's refusal out
        return exc.status_code, "", (exc.headers or {}).get("Allow", "")
    status = sent[0]["status"]
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    body = b"".join(m.get("body", b"") for m in sent[1:]).decode()
    return status, body if status == 200 else "", headers.get("allow", headers.get("location", ""))


def _same(method: str, raw_path: str) -> Answer:
    """The table's answer, checked against Starlette's Router's."""
    table, oracle = asyncio.run(_both(method, raw_path))
    assert table == oracle, (method, raw_path)
    return table


async def _both(method: str, raw_path: str) -> tuple[Answer, Answer]:
    return await _answer(TABLE, method, raw_path), await _answer(ORACLE, method, raw_path)


def _filled(template: str, fill: Callable[[str], str]) -> str:
    return "/".join(fill(part[1:-1]) if part.startswith("{") else part for part in template.split("/"))


def _near(path: str) -> Iterator[str]:
    """A path, and the near-misses around it."""
    yield path
    yield f"{path}/"
    yield f"{path}/extra"
    yield path.rsplit("/", 1)[0] or "/"
    yield path.replace("/", "//", 1)
    yield path.upper()
    yield f"/_electric/entities{path}"
    yield f"{path}%0A"  # a trailing newline: a regex's $ matches before it


def _systematic() -> Iterator[str]:
    yield from ("/", "//", "/_electric", "/_electric/", "/_electric/x", "/_electric/entities/a/b/c/d")
    for template in TEMPLATES:
        if ":" in template:  # the catch-all: its paths are the others' near-misses
            continue
        for segment in SEGMENTS:
            yield from _near(_filled(template, lambda _name, s=segment: s))
        yield _filled(template, lambda name: "" if name == "id" else "agent")  # an empty parameter


def test_the_table_routes_every_systematic_path_as_starlettes_router() -> None:
    answered = {_same(method, path)[0] for path in sorted(set(_systematic())) for method in METHODS}
    assert answered >= {200, 307, 404, 405}  # every kind of answer was compared


def test_the_table_serves_every_route_itself() -> None:
    """Where Starlette's Router picks a route of the table (not the catch-all under /_electric),
    for each route's paths and methods, the table picks it itself: the fast path is taken."""
    served = 0
    for route in ROUTES:
        if not isinstance(route, Route) or ":" in route.path:
            continue
        for segment in SEGMENTS:
            raw_path = _filled(route.path, lambda _name, s=segment: s)
            for method in route.methods or ():
                if _same(method, raw_path)[0] == 200:  # a route's endpoint answered
                    assert TABLE.find(_scope(method, raw_path)) is not None, (method, raw_path)
                    served += 1
    assert served > 200


# A segment as a client may write it: safe characters, and others percent-encoded.
_segment = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=8
).map(lambda text: urllib.parse.quote(text, safe="-._~!$&'()*+,;=:@"))
_mutation = st.sampled_from(["", "/", "//", "/extra", "prefix", "drop", "double", "upper"])


@st.composite
def _requests(draw: st.DrawFn) -> tuple[str, str]:
    template = draw(st.sampled_from([t for t in TEMPLATES if ":" not in t] + ["/_electric/{rest}"]))
    path = _filled(template, lambda _name: draw(_segment))
    mutation = draw(_mutation)
    if mutation == "prefix":
        path = f"/_electric/entities{path}"
    elif mutation == "drop":
        path = path.rsplit("/", 1)[0] or "/"
    elif mutation == "double":
        path = path.replace("/", "//", 1)
    elif mutation == "upper":
        path = path.upper()
    else:
        path += mutation
    return draw(st.sampled_from(METHODS)), path


@settings(max_examples=400, deadline=None, database=None)
@given(_requests())
def test_the_table_routes_generated_paths_as_starlettes_router(request: tuple[str, str]) -> None:
    _same(*request)


@pytest.mark.anyio
async def test_what_the_table_leaves_is_answered_by_starlette(http: httpx.AsyncClient) -> None:
    assert (await http.post("/agent/a1")).status_code == 405  # another method of a served path
    assert (await http.get("/healthz/")).status_code in {307, 404}  # Starlette's slash rule
    unknown = await http.get("/_electric/nothing/here")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "ROUTE_NOT_FOUND"
