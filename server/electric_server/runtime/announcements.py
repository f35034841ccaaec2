"""What a worker says it hosts (its hello, and an announce after its code changed), checked.

Both name the entity types and their profiles, and the code version the worker runs; a check
here refuses bad names and profiles before a lease can trip over them, and types the session's
principal may not host.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt

from ..core import validation as v
from ..core.auth import Principal
from ..core.errors import ApiError, invalid_argument

__all__ = ["check_hosting"]


def check_hosting(
    hosted: Sequence[rt.HostedType], code_version: str, principal: Principal, where: str
) -> None:
    """Refuse a hello's or an announce's (``where``) types and version, unless they are sound and
    the principal may host every type."""
    v.code_version(code_version, f"{where}.code_version")
    types = [t.type for t in hosted]
    v.hosted_types(types, f"{where}.types")
    for hosted_type in types:
        v.name(hosted_type, f"{where}.types.type")
    for hosted_type_ in hosted:
        if hosted_type_.HasField("profile"):  # checked here, so a lease never trips over it later
            v.profile_ms(hosted_type_.profile, f"{where}.types.profile")
    if not types:
        raise invalid_argument(
            "NO_TYPES", f"{where} must name at least one entity type", field=f"{where}.types"
        )
    if principal.types is not None and not set(types) <= principal.types:
        raise ApiError(
            grpc.StatusCode.PERMISSION_DENIED,
            "TYPE_NOT_ALLOWED",
            f"principal {principal.name!r} may not host {sorted(set(types) - principal.types)}",
        )
