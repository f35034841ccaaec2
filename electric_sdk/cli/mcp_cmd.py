"""``electric mcp``: the MCP face on stdio (docs/mcp.md), a client of the server like every other
command (``--address``, ``--token``).

The face is ``electric_sdk.mcp_face`` (the tools, the send that waits, cancel and drop); here is
its backend: the SDK's ``AsyncClient``, answering the same JSON the HTTP door renders
(``_wire.rendering``), so a tool answers alike on stdio and on the door's ``/mcp``. The signals
it sends are recorded with the token's principal as sender (``anonymous`` without tokens).
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio

from .. import errors
from .._proto.electric.v1 import entity_service_pb2 as api
from .._wire.entities import entity_url
from .._wire.rendering import entity_json, event_json, message_receipt_json
from ..arguments import json_argument, parse_ref, parse_states
from ..client import AsyncClient
from ..client._sends import new_idempotency_key
from ..mcp_face import Refusal, build_server
from .commands import Invocation

__all__ = ["ClientBackend", "command"]

SUMMARY = "serve the control plane as MCP tools on stdio (list get spawn send signal events)"


def _refused(exc: errors.ElectricError) -> Refusal:
    return Refusal(exc.code, exc.message)


class ClientBackend:
    """The face's backend over an ``AsyncClient``: each ElectricError becomes a ``Refusal``."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def _call(self, rpc: str, request: Any) -> Any:
        try:
            return await self.client._call(rpc, request)
        except errors.ElectricError as exc:
            raise _refused(exc) from None

    async def list(self, args: Mapping[str, Any]) -> dict[str, Any]:
        try:
            states = parse_states(args.get("state"))
        except (ValueError, errors.ElectricError) as exc:
            raise Refusal("UNKNOWN_STATE", str(exc)) from None
        from .._wire.enums import state_to_pb

        request = api.ListEntitiesRequest(
            type=str(args.get("type") or ""),
            states=[state_to_pb(s) for s in states],
            page_size=int(args.get("page_size") or 0),
            page_token=str(args.get("page_token") or ""),
        )
        m = await self._call("ListEntities", request)
        return {"entities": [entity_json(e) for e in m.entities], "next_page_token": m.next_page_token}

    async def get(self, ref: str) -> dict[str, Any]:
        m = await self._call("GetEntity", api.GetEntityRequest(ref=self._ref(ref)))
        return entity_json(m.entity)

    async def spawn(self, ref: str, args: Mapping[str, Any]) -> dict[str, Any]:
        profile = args.get("profile") or {}
        parent = args.get("parent")
        try:
            entity = await self.client.spawn(
                ref,
                grace_period=_ms(profile.get("grace_period_ms")),
                idle_timeout=_ms(profile.get("idle_timeout_ms")),
                parent=parent.strip("/") if isinstance(parent, str) else None,
            )
        except errors.ElectricError as exc:
            raise _refused(exc) from None
        return entity.to_json()

    async def send(self, ref: str, text: str, data: Any) -> dict[str, Any]:
        r = self._ref(ref)
        if self.client.options.token:
            # The send waits by reading the stream: a token without `read` is refused here, before
            # anything is sent, as the HTTP door's wait=run refuses it.
            await self._call("GetEntity", api.GetEntityRequest(ref=r))
        request = api.SendMessageRequest(ref=r, text=text, idempotency_key=new_idempotency_key())
        if data is not None:
            try:
                request.data.CopyFrom(json_argument(data, "data"))
            except errors.ElectricError as exc:
                raise _refused(exc) from None
        return message_receipt_json(entity_url(r.type, r.id), await self._call("SendMessage", request))

    async def follow(self, ref: str, offset: int) -> AsyncIterator[tuple[str, str, dict[str, Any], int]]:
        try:
            async for event in self.client.watch(ref, offset):
                yield event.type, event.key, event.value, event.offset
        except errors.ElectricError as exc:
            raise _refused(exc) from None

    async def signal(self, ref: str, args: Mapping[str, Any]) -> dict[str, Any]:
        try:
            result = await self.client.signal(
                ref,
                str(args.get("signal", "")),
                reason=str(args.get("reason", "")),
                payload=args.get("payload"),
                message_key=str(args.get("message_key", "")),
                interrupt=bool(args.get("interrupt", False)),
                wait=args.get("wait"),
                timeout=args.get("timeout"),
            )
        except errors.ElectricError as exc:
            raise _refused(exc) from None
        return result.to_json()

    async def events(self, ref: str, offset: int, limit: int) -> dict[str, Any]:
        request = api.ReadEventsRequest(ref=self._ref(ref), from_offset=offset, limit=limit)
        m = await self._call("ReadEvents", request)
        return {
            "events": [event_json(e) for e in m.events],
            "next_offset": m.next_offset,
            "head_offset": m.head_offset,
            "end_of_stream": m.end_of_stream,
        }

    @staticmethod
    def _ref(ref: str) -> Any:
        try:
            return parse_ref(ref).to_pb()
        except (ValueError, errors.ElectricError) as exc:
            raise Refusal("INVALID_NAME", str(exc)) from None


def _ms(value: Any) -> str | None:
    return None if value is None else f"{int(value)}ms"


async def serve(client: AsyncClient) -> None:
    """Serve the face on this process's stdin and stdout until stdin closes."""
    from mcp.server.stdio import stdio_server

    server = build_server(ClientBackend(client), http=False)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def command(ctx: Invocation, args: argparse.Namespace) -> int:
    try:
        import mcp.server.stdio  # noqa: F401
    except ModuleNotFoundError as exc:
        raise errors.InvalidArgument(
            f"electric mcp needs the mcp extra ({exc.name} is not installed): pip install 'electric-sdk[mcp]'",
            code="USAGE",
        ) from None

    async def main() -> None:
        async with AsyncClient(options=ctx.options) as client:
            await serve(client)

    anyio.run(main)
    return 0
