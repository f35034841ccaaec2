"""The door's routing: a table by path shape in front of Starlette's router.

Starlette's ``Router`` tries each route's regex in turn, behind two middlewares and an exception
wrapper, before a request reaches its endpoint: with the door's paths, most of them for a signal.
``RouteTable`` finds a request's route by its path's segments instead (the literal ones compared,
the ``{name}`` ones taken as parameters), in Starlette's order, and calls the endpoint itself.
This is the ``route_table`` fast path (``fastpaths/__init__.py``): forced off, Starlette's app
routes every request (``routing``); bench/bench_fastpaths.py measures the two side by side.

Only what Starlette would answer the same way is served here: the first route, in order, whose
path and method both match. Everything else — a method the path does not take (405), no route
(404), a trailing slash (Starlette's redirect), a path only a ``{name:path}`` route matches, a
``root_path`` — goes to the Starlette app unchanged, which answers as it always has. The door's
endpoints answer every error themselves (their error body), so no exception middleware is missed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from . import forced

Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class _Shape:
    """A route's path as segments: ``literals`` must be equal, ``params`` are taken by name.
    A route this cannot express (a converter: ``{rest:path}`` spans segments) has no ``count``:
    a path it matches is Starlette's to route."""

    route: BaseRoute
    count: int | None
    literals: tuple[tuple[int, str], ...] = ()
    params: tuple[tuple[int, str], ...] = ()
    prefix: str = ""  # an opaque route's path up to its first parameter: what it can match


def _shape(route: BaseRoute) -> _Shape:
    if not isinstance(route, Route):
        return _Shape(route, None)
    segments = route.path.split("/")
    literals: list[tuple[int, str]] = []
    params: list[tuple[int, str]] = []
    for i, segment in enumerate(segments):
        name = segment[1:-1]
        if segment[:1] == "{" and segment[-1:] == "}" and name.isidentifier():
            params.append((i, name))
        elif "{" in segment:
            return _Shape(route, None, prefix=route.path.partition("{")[0])
        else:
            literals.append((i, segment))
    return _Shape(route, len(segments), tuple(literals), tuple(params))


class RouteTable:
    """An ASGI app: the ``routes`` (Starlette's, in order; each endpoint an async function of the
    request) served straight from their endpoints where the table matches exactly, and by
    ``fallback`` (the Starlette app of the same routes) otherwise."""

    def __init__(self, routes: list[BaseRoute], fallback: ASGIApp) -> None:
        self.routes = routes  # as Starlette has them
        self.fallback = fallback
        shapes = [_shape(route) for route in routes]
        counts = {s.count for s in shapes if s.count is not None}
        # Each segment count's candidates, in Starlette's order, the opaque routes among them.
        self._by_count = {n: [s for s in shapes if s.count in (n, None)] for n in counts}

    def find(self, scope: Scope) -> tuple[Endpoint, dict[str, str]] | None:
        """The endpoint and path parameters Starlette would dispatch to; None when it is
        Starlette's to answer (see the module's docstring)."""
        segments = scope["path"].split("/")
        for shape in self._by_count.get(len(segments), ()):
            if shape.count is None:
                if scope["path"].startswith(shape.prefix) and shape.route.matches(scope)[0] is not Match.NONE:
                    return None
                continue
            if any(segments[i] != text for i, text in shape.literals):
                continue
            params = {name: segments[i] for i, name in shape.params}
            if not all(params.values()):  # ``[^/]+``: a parameter is never empty
                continue
            methods = cast(Route, shape.route).methods
            if methods is not None and scope["method"] not in methods:
                continue  # as Starlette: a later route may take the method
            return cast(Route, shape.route).endpoint, params
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self.find(scope) if scope["type"] == "http" and not scope.get("root_path") else None
        if found is None:
            await self.fallback(scope, receive, send)
            return
        endpoint, params = found
        scope["path_params"] = params
        response = await endpoint(Request(scope, receive, send))
        await response(scope, receive, send)


def routing(routes: list[BaseRoute], starlette: ASGIApp) -> ASGIApp:
    """The door's router for ``routes``: the table in front of ``starlette`` (the Starlette app of
    the same routes), or ``starlette`` alone with the ``route_table`` fallback forced."""
    return starlette if forced("route_table") else RouteTable(routes, starlette)
