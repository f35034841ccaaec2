"""Code versions on the wire: a type's versioning (``HostedType``) and its versions
(``ListVersions``), in protobuf and in JSON: the one conversion each way."""

from __future__ import annotations

from typing import Any

from .._proto.electric.v1 import entity_service_pb2 as api
from .._proto.electric.v1 import types_pb2 as pb

__all__ = [
    "VERSIONING_FROM_PB",
    "VERSIONING_TO_PB",
    "code_version_to_pb",
    "type_versions_from_json",
    "type_versions_json",
]

# "" is the server's default (pinned for `electric server --upgrade-after`).
VERSIONING_FROM_PB: dict[int, str] = {
    pb.VERSIONING_UNSPECIFIED: "",
    pb.VERSIONING_PINNED: "pinned",
    pb.VERSIONING_AUTO_UPGRADE: "auto_upgrade",
}
VERSIONING_TO_PB: dict[str, pb.Versioning.ValueType] = {v: k for k, v in VERSIONING_FROM_PB.items()}  # type: ignore[misc]


def code_version_to_pb(
    code_version: str,
    workers: list[str],
    runs_in_flight: int,
    runs_waiting: int,
    versioning: str,
    upgrade_after_ms: int | None,
    announced_seq: int,
) -> api.CodeVersion:
    """One code version of a type, as ``ListVersions`` answers it."""
    m = api.CodeVersion(
        code_version=code_version,
        workers=sorted(workers),
        runs_in_flight=runs_in_flight,
        runs_waiting=runs_waiting,
        versioning=VERSIONING_TO_PB[versioning],
        announced_seq=announced_seq,
    )
    if upgrade_after_ms is not None:
        m.upgrade_after.FromMilliseconds(upgrade_after_ms)
    return m


def _version_json(v: api.CodeVersion) -> dict[str, Any]:
    return {
        "code_version": v.code_version,
        "workers": list(v.workers),
        "runs_in_flight": v.runs_in_flight,
        "runs_waiting": v.runs_waiting,
        "versioning": VERSIONING_FROM_PB.get(v.versioning, ""),
        "upgrade_after_ms": v.upgrade_after.ToMilliseconds() if v.HasField("upgrade_after") else None,
        "announced_seq": v.announced_seq,
    }


def type_versions_json(m: api.TypeVersions) -> dict[str, Any]:
    return {
        "type": m.type,
        "versions": [_version_json(v) for v in m.versions],
        "selected": m.selected,
        "current": m.current,
        "ramp_version": m.ramp_version,
        "ramp_percent": m.ramp_percent,
    }


def type_versions_from_json(data: dict[str, Any]) -> api.TypeVersions:
    m = api.TypeVersions(
        type=data["type"],
        selected=data.get("selected", ""),
        current=data.get("current", ""),
        ramp_version=data.get("ramp_version", ""),
        ramp_percent=int(data.get("ramp_percent", 0)),
    )
    for v in data.get("versions", []):
        item = m.versions.add(
            code_version=v["code_version"],
            workers=v.get("workers", []),
            runs_in_flight=int(v.get("runs_in_flight", 0)),
            runs_waiting=int(v.get("runs_waiting", 0)),
            versioning=VERSIONING_TO_PB.get(v.get("versioning", ""), pb.VERSIONING_UNSPECIFIED),
            announced_seq=int(v.get("announced_seq", 0)),
        )
        if v.get("upgrade_after_ms") is not None:
            item.upgrade_after.FromMilliseconds(int(v["upgrade_after_ms"]))
    return m
