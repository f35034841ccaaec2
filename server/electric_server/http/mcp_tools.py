"""The MCP face's tools (docs/mcp.md), read from the HTTP door's route table: one source.

Each tool is a route of ``http/routes.py``: its description is the route's summary, and its
input schema is the route's, flattened into one object as an MCP tool takes its arguments:
``ref`` for the path's ``/{type}/{id}`` (the door's own path patterns), the route's query
parameters (their JSON Schemas as the OpenAPI document has them), and its body's properties
(``http/request_schemas.py``: a body that is ``oneOf`` several objects gets the others' fields
in each branch). ``electric_sdk/mcp_face/tools.json`` is what ``tools()`` answers, written by
``scripts/genmcptools.py`` and drift-tested, so the stdio face (``electric mcp``, which needs no
server package) and the door's ``/mcp`` list the same tools.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from .request_schemas import PATH_NAME, PATH_TYPE, Schema, request_schemas
from .routes import ROUTES, HttpRoute

__all__ = ["TOOL_ROUTES", "render", "tools"]

# tool name -> (the route's operationId, what the MCP face adds to its description).
TOOL_ROUTES: dict[str, tuple[str, str]] = {
    "list": ("listEntities", "One page: give next_page_token as page_token for the next."),
    "get": ("getEntity", ""),
    "spawn": ("spawnEntity", ""),
    "send": (
        "sendMessage",
        "Waits for the run the message starts and answers how it ended (the receipt plus run). "
        "Progress notifications follow the run's steps. Cancelling the call (notifications/cancelled; "
        "closing the response stream on 2026-07-28 HTTP) sends SIGINT scoped to this message; a "
        "dropped connection leaves the run going (docs/mcp.md).",
    ),
    "signal": ("signalEntity", ""),
    "events": ("readEvents", "One page: give next_offset as offset for the next."),
}
# Query parameters a tool leaves out: the live reads are the door's SSE, not an answer, and the
# face's send always waits for its run (its timeout stays).
OMITTED: dict[str, frozenset[str]] = {
    "listEntities": frozenset({"live", "timeout"}),
    "sendMessage": frozenset({"wait"}),
}
REF: Schema = {
    "type": "string",
    "pattern": f"^{PATH_TYPE}/{PATH_NAME}$",
    "description": "the entity, TYPE/ID, e.g. my_agent/agent_1",
}


def _route(operation: str) -> HttpRoute:
    (found,) = [r for r in ROUTES if r.operation == operation]
    return found


def _params(route: HttpRoute) -> tuple[Schema, list[str]]:
    properties: Schema = {}
    required: list[str] = []
    if "{id}" in route.path:
        properties["ref"] = REF
        required.append("ref")
    for param in route.query:
        if param.name in OMITTED.get(route.operation, ()):
            continue
        one = dict(param.schema)
        schema = {"type": "array", "items": one} if param.repeated else one
        properties[param.name] = {**schema, "description": param.description}
    return properties, required


def _merged(body: Schema, properties: Schema, required: list[str]) -> Schema:
    """The body's schema with ``properties`` beside its own, in each branch of a ``oneOf``."""
    out = copy.deepcopy(body)
    branches = out.get("oneOf", [out])
    for branch in branches:
        branch["properties"] = {**properties, **branch.get("properties", {})}
        branch["required"] = [*required, *branch.get("required", [])]
    if "oneOf" in out:
        out["type"] = "object"
    return out


def _schema(route: HttpRoute) -> Schema:
    properties, required = _params(route)
    if route.body is None:
        return {
            "type": "object",
            "required": required,
            "additionalProperties": False,
            "properties": properties,
        }
    return _merged(request_schemas()[route.body], properties, required)


def _portable(schema: Any) -> Any:
    """``schema`` with each ``"type": [...]`` as ``anyOf`` single types: the same values, in the
    form clients that map tool schemas onto one-type dialects take (the MCP inspector's
    --strict warns of the other)."""
    if isinstance(schema, list):
        return [_portable(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _portable(value) for key, value in schema.items()}
    kinds = out.get("type")
    if isinstance(kinds, list):
        del out["type"]
        one_of_each = [{"type": kind} for kind in kinds]
        if "anyOf" in out:  # its own stays: both must hold
            out["allOf"] = [*out.get("allOf", []), {"anyOf": one_of_each}]
        else:
            out["anyOf"] = one_of_each
    return out


def tools() -> list[dict[str, Any]]:
    """The tools as MCP's ``tools/list`` lists them: name, description, inputSchema."""
    out = []
    for name, (operation, more) in TOOL_ROUTES.items():
        route = _route(operation)
        # The summary only: a route's description speaks of HTTP (headers, live=sse).
        description = " ".join(filter(None, (route.summary + ".", more)))
        out.append({"name": name, "description": description, "inputSchema": _portable(_schema(route))})
    return out


def render() -> str:
    return json.dumps(tools(), indent=2, sort_keys=True) + "\n"
