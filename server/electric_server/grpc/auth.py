"""The gRPC door's half of auth: an interceptor that checks each call's bearer token and scope.

The tokens, scopes and checks are the core's (``core/auth.py``), shared with
the HTTP door; here they meet grpc.aio's handlers: a denied call is answered
by a handler that never decodes its request (``handlers.refusal``), an
allowed one runs with its principal set and its entity types checked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from ..core.auth import (
    Principal,
    TokenTable,
    current_principal,
    method_scopes,
    principal_of,
    refusal_of,
    type_denial,
)
from ..core.errors import Malformed, abort_with
from .handlers import refusal

__all__ = ["AuthInterceptor"]


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: TokenTable) -> None:
        self.tokens = tokens

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        scopes = method_scopes(details.method)
        if handler is None or scopes is None:
            return handler  # health, reflection, unknown methods: no token needed
        values = [
            value
            for key, value in details.invocation_metadata or ()
            if key == "authorization" and isinstance(value, str)
        ]
        principal = principal_of(self.tokens, values)
        for scope in scopes:
            if (refused := refusal_of(principal, scope)) is not None:
                return refusal(handler, refused, details.method)
        assert isinstance(principal, Principal)
        return _wrap(handler, principal, details.method)


def _wrap(handler: Any, principal: Principal, method: str) -> Any:
    # grpc's stubs type handlers for the sync API; the aio server calls the
    # same slots with coroutines and async generators, hence Any here.
    async def check(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        # An undecodable request is the handler's to answer (MALFORMED_REQUEST), not a type's.
        if principal.types is not None and request is not None and request.__class__ is not Malformed:
            error = type_denial(principal, request)
            if error is not None:
                await abort_with(context, error, method)
        current_principal.set(principal)

    if handler.unary_unary is not None:
        inner_unary = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await check(request, context)
            return await inner_unary(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary, handler.request_deserializer, handler.response_serializer
        )
    if handler.unary_stream is not None:
        inner_stream = handler.unary_stream

        async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            await check(request, context)
            async for item in inner_stream(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(
            stream, handler.request_deserializer, handler.response_serializer
        )
    if handler.stream_stream is not None:
        inner_bidi = handler.stream_stream

        async def bidi(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            # The scope is checked up front; type restrictions by the service, at hello.
            await check(None, context)
            async for item in inner_bidi(requests, context):
                yield item

        return grpc.stream_stream_rpc_method_handler(
            bidi, handler.request_deserializer, handler.response_serializer
        )
    return handler
