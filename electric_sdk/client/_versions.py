"""The code versions' calls of ``AsyncClient`` (docs/runtime.md, "Deploys"), in a part of their own."""

from __future__ import annotations

import builtins
from typing import cast

from .._proto.electric.v1 import entity_service_pb2 as api
from ..code_versions import TypeVersions
from ._caller import Caller

__all__ = ["VersionCalls"]


class VersionCalls:
    """``AsyncClient``'s calls about entity types' code versions."""

    async def versions(self, type: str | None = None) -> builtins.list[TypeVersions]:
        """Per entity type (or only ``type``), each code version announced: its workers, its runs
        in flight and waiting, and which version new wakes get (docs/runtime.md, "Deploys")."""
        response: api.ListVersionsResponse = await cast(Caller, self)._call(
            "ListVersions", api.ListVersionsRequest(type=type or "")
        )
        return [TypeVersions.from_pb(t) for t in response.types]

    async def set_version(
        self,
        type: str,
        version: str | None = None,
        *,
        ramp_version: str | None = None,
        ramp_percent: int = 0,
        reason: str = "",
    ) -> TypeVersions:
        """Choose the code version new wakes of ``type`` get (None: the newest announced again; an
        older one is a rollback: runs in flight stay bound to theirs), and optionally ramp
        ``ramp_percent`` % of its entities, sticky per entity, to ``ramp_version``. Needs ``admin``."""
        request = api.SetVersionRequest(
            type=type,
            code_version=version or "",
            ramp_version=ramp_version or "",
            ramp_percent=ramp_percent,
            reason=reason,
        )
        response: api.SetVersionResponse = await cast(Caller, self)._call("SetVersion", request)
        return TypeVersions.from_pb(response.versions)
