"""The standard services that gRPC tools and load balancers call: health and reflection.

- ``Health`` is grpcio-health-checking's servicer plus ``List`` (added to
  ``grpc.health.v1`` in 2025): the pinned 1.85 servicer leaves it to the
  generated stub. ``List`` answers the status of every service that was set,
  as ``Check`` would one by one.
- Reflection is served as ``grpc.reflection.v1`` (what grpcurl and buf curl
  ask first) and ``grpc.reflection.v1alpha`` (what older tools ask) by one
  implementation, grpcio-reflection's. It ships only v1alpha, and v1 is the
  same messages under a new package name (same fields, numbers and types;
  tests/test_health_reflection.py pins it), so its servicer answers v1 calls
  byte for byte. v1's own descriptors are vendored (``proto/grpc/reflection``)
  and generated, so reflection describes itself under both names.
- ``google.rpc.ErrorInfo``, the detail every error carries, resolves through
  reflection by its name, so a client that decodes details with reflection's
  descriptors (grpcurl) shows its reason, domain and metadata.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from electric_sdk._proto.grpc.reflection.v1 import reflection_pb2 as reflection_v1

HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
REFLECTION_V1ALPHA = reflection.SERVICE_NAME
REFLECTION_V1 = reflection_v1.DESCRIPTOR.services_by_name["ServerReflection"].full_name
# Imported here, not only where errors are built, so that its file is in the pool reflection
# serves whatever else the process imported.
ERROR_DETAILS_FILE = error_details_pb2.DESCRIPTOR.name


class Health(health.aio.HealthServicer):  # type: ignore[misc]  # grpc_health has no type hints
    """The aio health servicer, and ``List``. It keeps its own copy of what was set, through the
    servicer's public API only: the statuses of the base class are its private business."""

    def __init__(self) -> None:
        super().__init__()
        self._statuses: dict[str, int] = {"": health_pb2.HealthCheckResponse.SERVING}
        self._final = False  # after enter_graceful_shutdown: NOT_SERVING for good

    async def set(self, service: str, status: int) -> None:
        if not self._final:
            self._statuses[service] = status
        await super().set(service, status)

    async def enter_graceful_shutdown(self) -> None:
        if not self._final:
            self._final = True
            self._statuses = dict.fromkeys(self._statuses, health_pb2.HealthCheckResponse.NOT_SERVING)
        await super().enter_graceful_shutdown()

    async def List(
        self, request: health_pb2.HealthListRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthListResponse:
        # A handful of names, all set by the server itself: never too many to list.
        return health_pb2.HealthListResponse(
            statuses={
                name: health_pb2.HealthCheckResponse(status=status) for name, status in self._statuses.items()
            }
        )


def add_health_and_reflection(server: grpc.aio.Server, health: Health, services: Iterable[str]) -> None:
    """Serve ``health`` and reflection (under both names) on ``server``; reflection lists
    ``services``, health and itself."""
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    listed = (*services, HEALTH_SERVICE, REFLECTION_V1, REFLECTION_V1ALPHA)
    servicer = reflection.aio.ReflectionServicer(listed)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    # v1 calls decode as v1alpha messages and answer with them: the bytes are the same.
    handlers = {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
        )
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(REFLECTION_V1, handlers),))
    server.add_registered_method_handlers(REFLECTION_V1, handlers)


def tool_hint(address: str, tls_cert: Path | None) -> list[str]:
    """The banner's lines that list the server's methods with buf curl and grpcurl, as typed."""
    if tls_cert is None:
        buf = f"buf curl --protocol grpc --http2-prior-knowledge --list-methods http://{address}"
        grpcurl = f"grpcurl -plaintext {address} list"
    else:
        buf = f"buf curl --protocol grpc --cacert {tls_cert} --list-methods https://{address}"
        grpcurl = f"grpcurl -cacert {tls_cert} {address} list"
    return [
        f"  grpc:    {buf}",
        f"           {grpcurl}   (reflection v1 and v1alpha; health: grpc.health.v1.Health/List)",
    ]
