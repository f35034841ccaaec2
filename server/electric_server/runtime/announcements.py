"""What a worker says it hosts (its hello, and an announce after its code changed), checked.

Both name the entity types and their profiles, and the code version the worker runs; a check
here refuses bad names and profiles before a lease can trip over them, and types the session's
principal may not host.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from electric_sdk import busy
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.versions import VERSIONING_FROM_PB

from ..core import validation as v
from ..core.auth import Principal
from ..core.errors import ApiError, invalid_argument

__all__ = ["busy_policy", "check_hosting", "versioning"]


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
        versioning(hosted_type_, where)
        busy_policy(hosted_type_, where)
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


def versioning(hosted: rt.HostedType, where: str) -> tuple[str, int | None]:
    """A hosted type's versioning and its pinned runs' bound in ms (runtime/versions.py)."""
    if hosted.versioning not in VERSIONING_FROM_PB:
        raise invalid_argument(
            "INVALID_VERSIONING",
            f"{where}.types.versioning {hosted.versioning} is unknown",
            field=f"{where}.types.versioning",
        )
    field = f"{where}.types.upgrade_after"
    if not hosted.HasField("upgrade_after"):
        return VERSIONING_FROM_PB[hosted.versioning], None
    if hosted.versioning != pb.VERSIONING_PINNED:
        raise invalid_argument(
            "INVALID_VERSIONING", f"{field} is only for VERSIONING_PINNED (a bound on the wait)", field=field
        )
    d = hosted.upgrade_after
    return VERSIONING_FROM_PB[hosted.versioning], v.duration_ms(d.seconds, d.nanos, True, 0, field)


def busy_policy(hosted: rt.HostedType, where: str) -> tuple[str, str]:
    """A hosted type's double-texting policy and its messages' extra choices, as an entity's
    record keeps them (``EntityRecord.on_busy``; electric_sdk/busy.py)."""
    try:
        policy = busy.parse(hosted.on_busy)
        choices = busy.parse_choices(hosted.on_busy_choices)
    except ValueError as exc:
        raise invalid_argument("INVALID_BUSY_POLICY", str(exc), field=f"{where}.types.on_busy") from None
    return (policy.value if policy else ""), busy.choices_text(choices)
