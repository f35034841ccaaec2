"""``GET /{type}/{id}/state``: an entity's durable state over HTTP, as ``client.state`` returns it.

The state is rebuilt by the SDK's own ``state_read.load_state`` (the latest
snapshot plus the tail after it, the rules of ``durable_state``), from pages
the door reads through ``EntityService.ReadEvents`` as the caller: so the
token's ``read`` scope and its types, an unknown entity's 404 and every other
refusal are ReadEvents' own, and there is one rebuild for the worker, the
client and this route.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message
from starlette.requests import Request

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.events import event_value_json
from electric_sdk.durable_state import Collections
from electric_sdk.state_read import load_state

from ..core.service import EntityService
from . import body
from .query import Query
from .query import ref as _ref

__all__ = ["read_state", "state_request"]


def state_request(request: Request, query: Query, obj: body.JsonObject) -> Message:
    """The request the route is admitted as (its ``read`` scope and types): the stream's read."""
    return api.ReadEventsRequest(ref=_ref(request))


def _data(event: pb.Event) -> Any:
    return event_value_json(event).get("data")


async def read_state(service: EntityService, message: api.ReadEventsRequest, context: Any) -> Collections:
    """The state of ``message.ref``'s stream, read as the caller through ``ReadEvents``."""

    async def page(from_offset: int, limit: int) -> api.ReadEventsResponse:
        request = api.ReadEventsRequest(ref=message.ref, from_offset=from_offset, limit=limit)
        return await service.ReadEvents(request, context)

    head = (await page(0, 1)).head_offset
    return (await load_state(page, head, _data)).state
