"""A connected worker session on the wire (``ListWorkers``) and in JSON: the one conversion."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._proto.electric.v1 import entity_service_pb2 as api
from .times import timestamp_from_ms, timestamp_to_datetime, to_iso

__all__ = ["worker_json", "worker_to_pb"]


def worker_to_pb(
    worker_id: str,
    replica: str,
    types: Sequence[str],
    code_version: str,
    capacity: int,
    leases_held: int,
    heartbeat_ms: int,
) -> api.Worker:
    return api.Worker(
        worker_id=worker_id,
        replica=replica,
        types=sorted(types),
        code_version=code_version,
        capacity=capacity,
        leases_held=leases_held,
        last_heartbeat=timestamp_from_ms(heartbeat_ms),
    )


def worker_json(m: api.Worker) -> dict[str, Any]:
    return {
        "worker_id": m.worker_id,
        "replica": m.replica,
        "types": list(m.types),
        "code_version": m.code_version,
        "capacity": m.capacity,
        "leases_held": m.leases_held,
        "last_heartbeat": to_iso(timestamp_to_datetime(m.last_heartbeat)),
    }
