"""The door's route table (fastpaths/route_table.py) routes exactly as Starlette's router would.

For every path shape the door serves, and paths around them (other methods, trailing slashes,
empty segments, extra segments, the catch-all under /_electric), the table either hands the
request to Starlette or picks the very route and path parameters Starlette's first full match
picks; and it does take every route it can, so the fast path is not lost unnoticed.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from electric_server.app import ElectricServer
from electric_server.fastpaths.route_table import RouteTable
from starlette.routing import Match, Route

pytestmark = pytest.mark.anyio

METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"]


def _scope(method: str, path: str) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}


def _starlette_choice(routes: list[Any], scope: dict[str, Any]) -> tuple[Any, dict[str, str]] | None:
    """What Starlette's Router dispatches to: the first full match (None when there is none)."""
    for route in routes:
        match, child = route.matches(scope)
        if match is Match.FULL:
            return route.endpoint, child["path_params"]
    return None


def _paths(routes: list[Any]) -> list[str]:
    paths = {"/", "//", "/_electric", "/_electric/", "/_electric/x", "/_electric/entities/a/b/c/d"}
    for route in routes:
        if not isinstance(route, Route) or ":" in route.path:
            continue
        filled = route.path.replace("{type}", "agent").replace("{id}", "a1")
        paths |= {
            filled,
            f"{filled}/",
            f"{filled}/extra",
            filled.replace("agent", "", 1),
            filled.replace("agent", "_electric", 1),
            filled.replace("agent", "healthz", 1),
            f"{filled}\n",
        }
    return sorted(paths)


async def test_the_table_routes_as_starlette_does(door: ElectricServer) -> None:
    assert door.http is not None
    routes = door.http.routes
    table = RouteTable(routes, door.http.app)  # the fast path, whatever the switch says
    served = 0
    for path in _paths(routes):
        for method in METHODS:
            scope = _scope(method, path)
            found = table.find(scope)
            expected = _starlette_choice(routes, scope)
            if found is not None:
                assert found == expected, (method, path)
                served += 1
            elif expected is not None and not path.startswith("/_electric/") and "\n" not in path:
                # Only what a catch-all or an odd path reaches is left to Starlette.
                raise AssertionError(f"{method} {path}: Starlette routes it, the table does not")
    assert served > 40


async def test_what_the_table_leaves_is_answered_by_starlette(http: httpx.AsyncClient) -> None:
    assert (await http.post("/agent/a1")).status_code == 405  # another method of a served path
    assert (await http.get("/healthz/")).status_code in {307, 404}  # Starlette's slash rule
    unknown = await http.get("/_electric/nothing/here")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "ROUTE_NOT_FOUND"
