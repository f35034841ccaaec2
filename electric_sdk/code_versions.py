"""Entity types' code versions as the SDK returns them (``Client.versions``), and what runs wait for.

A worker announces the code version it runs for each type it hosts. A run's
``started`` record binds it to its version: delivered again, it goes only to a
worker of that version while one is connected, and otherwise follows its
type's versioning (docs/runtime.md, "Deploys"). New wakes go to the version
selected for the type (``TypeVersions.current``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ._proto.electric.v1 import entity_service_pb2 as api
from ._wire.versions import VERSIONING_FROM_PB, type_versions_json

__all__ = ["CodeVersionInfo", "TypeVersions", "versioning_text"]


@dataclass(frozen=True, slots=True)
class CodeVersionInfo:
    """One code version of an entity type."""

    code_version: str
    workers: tuple[str, ...]  # the workers announcing it now
    runs_in_flight: int  # runs bound to it (started on it, not ended)
    runs_waiting: int  # of those, the ones no lease holds: they wait for a worker of it
    # "pinned", "auto_upgrade", or "" (the server's default: pinned for its --upgrade-after)
    versioning: str
    upgrade_after: timedelta | None  # a pinned run's bound on its wait; None: for good
    announced_seq: int  # the order versions were first announced in

    @classmethod
    def from_pb(cls, m: api.CodeVersion) -> CodeVersionInfo:
        return cls(
            code_version=m.code_version,
            workers=tuple(m.workers),
            runs_in_flight=m.runs_in_flight,
            runs_waiting=m.runs_waiting,
            versioning=VERSIONING_FROM_PB.get(m.versioning, ""),
            upgrade_after=m.upgrade_after.ToTimedelta() if m.HasField("upgrade_after") else None,
            announced_seq=m.announced_seq,
        )


@dataclass(frozen=True, slots=True)
class TypeVersions:
    """An entity type's code versions (newest first) and which one new wakes get."""

    type: str
    versions: tuple[CodeVersionInfo, ...]
    selected: str | None  # the version an operator chose; None: the newest announced
    current: str  # what new wakes get now (entities outside a ramp)
    ramp_version: str | None  # a ramp sends ``ramp_percent`` % of the entities (sticky) here
    ramp_percent: int
    raw: api.TypeVersions = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, m: api.TypeVersions) -> TypeVersions:
        return cls(
            type=m.type,
            versions=tuple(CodeVersionInfo.from_pb(v) for v in m.versions),
            selected=m.selected or None,
            current=m.current,
            ramp_version=m.ramp_version or None,
            ramp_percent=m.ramp_percent,
            raw=m,
        )

    def to_json(self) -> dict[str, Any]:
        return type_versions_json(self.raw)

    @property
    def waiting(self) -> dict[str, int]:
        """The versions runs wait for (no worker of them connected), with how many wait."""
        return {v.code_version: v.runs_waiting for v in self.versions if v.runs_waiting and not v.workers}


def versioning_text(version: CodeVersionInfo) -> str:
    """``pinned``, ``pinned for 10m``, ``auto_upgrade``, or ``default`` (the server's)."""
    if not version.versioning:
        return "default"
    if version.versioning == "pinned" and version.upgrade_after is not None:
        seconds = version.upgrade_after.total_seconds()
        return f"pinned for {int(seconds * 1000)}ms" if seconds < 1 else f"pinned for {seconds:g}s"
    return version.versioning
