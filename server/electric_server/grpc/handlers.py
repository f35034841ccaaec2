"""Every handler registered on the server decodes its requests under a guard.

grpc.aio decodes a request with the handler's ``request_deserializer``. For a
unary request it does so before the handler runs, and a failure there (bytes
that are no protobuf, a string that is no UTF-8, a JSON value nested deeper
than protobuf decodes) is logged with its traceback and answered ``UNKNOWN``;
for a streamed request the failure surfaces in the handler's request iterator.
``guard_server`` wraps each deserializer once, as the services are
registered (so the calls grpc's own acceptor takes and those the extra
acceptors take are served by the same handlers): an undecodable unary request
becomes a ``Malformed`` holding its ``INVALID_ARGUMENT`` error, which the
handler answers (``errors.translate`` does it for our services, with no extra
call per request; a wrapper here does it for health and reflection); an
undecodable stream message raises that error in the request iterator.

A method that its servicer leaves to the generated base class (whose stub
raises ``NotImplementedError``, which grpc logs with a traceback on every
call) is answered ``UNIMPLEMENTED``/``METHOD_NOT_IMPLEMENTED`` instead, without
running the stub: a client probing a method is no error of the server's.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from ..core.errors import ApiError, Malformed, abort_with, decode_error

Deserializer = Callable[[bytes], Any]
if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]


def _unary_decoder(deserialize: Deserializer) -> Deserializer:
    def decode(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # whatever the decoder raises, the body is the client's mistake
            return Malformed(decode_error(exc))

    return decode


def _stream_decoder(deserialize: Deserializer) -> Deserializer:
    def decode(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:
            raise decode_error(exc) from None

    return decode


def _passing_bytes(serialize: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """A response serializer that sends a message a handler encoded already (bytes) as it is:
    a watch fans one event out to thousands of streams, encoded once (event_feed.py)."""
    if serialize is None:
        return None

    def encode(message: Any) -> bytes:
        return message if message.__class__ is bytes else serialize(message)

    return encode


def guarded(handler: Handler, method: str) -> Handler:
    """``handler`` with its requests decoded under the guard (see the module's docstring),
    and its responses encoded unless they are bytes already."""
    deserialize = handler.request_deserializer
    if deserialize is None:
        return handler  # raw bytes: nothing to decode
    serialize = _passing_bytes(handler.response_serializer)
    # grpc's stubs type handlers for the sync API; the aio server calls the
    # same slots with coroutines and async generators, hence Any here.
    h: Any = handler
    if _generated_stub(h.unary_unary or h.unary_stream or h.stream_unary or h.stream_stream):
        return _unimplemented(h, method)
    if h.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            _checked_unary(h.unary_unary, method), _unary_decoder(deserialize), serialize
        )
    if h.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            _checked_unary(h.unary_stream, method), _unary_decoder(deserialize), serialize
        )
    if h.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            _checked_stream(h.stream_unary, method), _stream_decoder(deserialize), serialize
        )
    return grpc.stream_stream_rpc_method_handler(
        _checked_stream(h.stream_stream, method), _stream_decoder(deserialize), serialize
    )


def _generated_stub(behavior: Any) -> bool:
    """Whether ``behavior`` is a generated servicer's own method, not overridden: protoc puts
    those classes in ``*_pb2_grpc`` modules, and a servicer's overrides live in its own."""
    function = getattr(behavior, "__func__", behavior)
    return str(getattr(function, "__module__", "")).endswith("_pb2_grpc")


def _unimplemented(handler: Any, method: str) -> Handler:
    return refusal(
        handler,
        ApiError(
            grpc.StatusCode.UNIMPLEMENTED,
            "METHOD_NOT_IMPLEMENTED",
            f"{method} is not implemented by this server",
            {"method": method},
        ),
        method,
    )


def refusal(handler: Any, error: ApiError, method: str) -> Handler:
    """A handler of ``handler``'s kind that answers ``error`` and never decodes the request (no
    deserializer: the body stays bytes; a stream is not read at all)."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await abort_with(context, error, method)

    serialize = handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(refuse, None, serialize)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse, None, serialize)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(refuse, None, serialize)
    return grpc.stream_stream_rpc_method_handler(refuse, None, serialize)


def _checks(behavior: Any) -> bool:
    """Whether a handler answers a Malformed request and a decode error itself (errors.translate)."""
    return bool(getattr(behavior, "checks_malformed", False))


def _checked_unary(behavior: Any, method: str) -> Any:
    """A unary-request behavior that answers a Malformed request (a coroutine, or an async
    generator for a streamed response, as grpc.aio calls either)."""
    if _checks(behavior):
        return behavior
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            if request.__class__ is Malformed:
                await abort_with(context, request.error, method)
            async for item in behavior(request, context):
                yield item

        return stream

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if request.__class__ is Malformed:
            await abort_with(context, request.error, method)
        return await behavior(request, context)

    return unary


def _checked_stream(behavior: Any, method: str) -> Any:
    """A streamed-request behavior that answers a decode error raised in its request iterator."""
    if _checks(behavior):
        return behavior
    if inspect.isasyncgenfunction(behavior):

        async def stream(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            try:
                async for item in behavior(requests, context):
                    yield item
            except ApiError as error:
                await abort_with(context, error, method)

        return stream

    async def unary(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await behavior(requests, context)
        except ApiError as error:
            await abort_with(context, error, method)

    return unary


class _GuardedGeneric(grpc.GenericRpcHandler):
    """A generic handler whose handlers are guarded (each built once per method)."""

    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self._inner = inner
        self._built: dict[str, Handler | None] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Handler | None:
        method = handler_call_details.method
        if method not in self._built:
            found = self._inner.service(handler_call_details)
            self._built[method] = None if found is None else guarded(found, method)
        return self._built[method]


def guard_server(server: grpc.aio.Server) -> None:
    """Guard every handler registered on ``server`` from now on (before it starts)."""
    register: Callable[[str, Mapping[str, Any]], None] = server.add_registered_method_handlers
    register_generic: Callable[[Sequence[grpc.GenericRpcHandler]], None] = server.add_generic_rpc_handlers

    def add_registered(service: str, handlers: Mapping[str, Any]) -> None:
        register(service, {name: guarded(h, f"/{service}/{name}") for name, h in handlers.items()})

    def add_generic(handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        register_generic([_GuardedGeneric(h) for h in handlers])

    target: Any = server  # on this instance only; grpc's own registration runs underneath
    target.add_registered_method_handlers = add_registered
    target.add_generic_rpc_handlers = add_generic
