"""Entity types' profile defaults, as their workers announce them, and the profile an entity gets.

A worker's hello names, per entity type, the profile defaults of its code
version. They are kept per (type, code version) in the store, so they outlive
the worker and the server; the newest code version's (the one first announced
last) is the type's default, whatever older workers announce afterwards, and
a version announced again replaces its own earlier announcement.

An entity's profile is fixed at its first lease (``resolve``): each value its
spawn request did not set becomes its type's default then, else the server's.
Until then the entity shows those values as pending (ARCHITECTURE §1, amended:
fixed at the first lease, not at spawn, so an entity spawned before any worker
announced its type gets the same profile as one spawned a moment later).
"""

from __future__ import annotations

import contextlib

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import DEFAULT_GRACE_MS, DEFAULT_IDLE_TIMEOUT_MS

from ..core import validation as v
from ..store.base import EntityRecord, StorageFault, Store, TypeProfile

__all__ = ["TypeProfiles", "resolve"]


class TypeProfiles:
    """Every announcement in memory (a few per type and deploy), written through to the store."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._announced: dict[tuple[str, str], TypeProfile] = {}
        self._newest: dict[str, TypeProfile] = {}
        self._seq = 0

    async def load(self) -> None:
        for profile in await self._store.type_profiles():
            self._keep(profile)

    def announce(
        self,
        type_: str,
        code_version: str,
        profile: pb.Profile | None,
        versioning: str = "",
        upgrade_after_ms: int | None = None,
        children: str = "",
    ) -> TypeProfile:
        """A worker's announcement (its profile was checked with the hello): in effect at once, so
        the next lease uses it; ``save`` stores it. ``versioning``: what its runs do when they must
        be delivered again with no worker of the version connected (versions.py)."""
        known = self._announced.get((type_, code_version))
        if known is None:
            self._seq += 1
        grace, idle = v.profile_ms(profile, "hello.types.profile") if profile is not None else (None, None)
        seq = known.seq if known else self._seq
        announced = TypeProfile(type_, code_version, seq, grace, idle, versioning, upgrade_after_ms, children)
        self._keep(announced)
        return announced

    async def save(self, profile: TypeProfile) -> None:
        # A storage fault: the store said why; the announcement holds in memory meanwhile, and
        # comes again with the worker's next hello.
        with contextlib.suppress(StorageFault):
            await self._store.store_type_profile(profile)

    def announced(self, type_: str, code_version: str) -> TypeProfile | None:
        """What ``code_version``'s workers announced for ``type_``, if they ever did."""
        return self._announced.get((type_, code_version))

    def versions(self, type_: str) -> list[TypeProfile]:
        """Every version announced for ``type_``, the newest first."""
        return sorted((p for (t, _), p in self._announced.items() if t == type_), key=lambda p: -p.seq)

    def default(self, type_: str) -> TypeProfile | None:
        """The type's default: the newest code version's announcement, if any."""
        return self._newest.get(type_)

    def _keep(self, profile: TypeProfile) -> None:
        self._announced[(profile.type, profile.code_version)] = profile
        self._seq = max(self._seq, profile.seq)
        newest = self._newest.get(profile.type)
        if newest is None or profile.seq >= newest.seq:
            self._newest[profile.type] = profile


def resolve(record: EntityRecord, default: TypeProfile | None) -> EntityRecord:
    """``record`` with its pending profile values fixed: its type's default, else the server's."""
    if not (record.grace_pending or record.idle_timeout_pending):
        return record
    grace, idle = record.grace_ms, record.idle_timeout_ms
    announced = default or TypeProfile("", "", 0, None, None)
    if record.grace_pending:
        grace = announced.grace_ms if announced.grace_ms is not None else DEFAULT_GRACE_MS
    if record.idle_timeout_pending:
        idle = announced.idle_timeout_ms if announced.idle_timeout_ms is not None else DEFAULT_IDLE_TIMEOUT_MS
    return record.replace(
        grace_ms=grace, idle_timeout_ms=idle, grace_pending=False, idle_timeout_pending=False
    )
