"""Which code version a lease goes to: runs bound to their code, and the version new wakes get.

A run's ``started`` record names the code version it started on, and binds it
(``message_cursor.bound_version``). An attempt delivered again (a crash, a lost
lease, a drain, a replica's death) goes only to a worker announcing that version
while one is connected. When none is, the type's versioning, as the bound
version's workers announced it (``TypeProfile.versioning``), decides:

- ``pinned``: the run waits (visibly: ``get``, ``ls``, ``workers`` and the dashboard
  say "waiting for code VERSION"), for ``upgrade_after`` if the type set one, else
  for good;
- ``auto_upgrade``: it is replayed at once on the version new wakes get (a step
  its new code renamed fails it with NonDeterministicRun, as recorded);
- neither (the default): pinned for the server's ``--upgrade-after`` (10 min),
  then upgraded. The bound counts from ``EntityRecord.waiting_since_ms``, written
  when the lease ended, so it outlives a restart; each poll offers waiting runs
  again (lease_sweep.py), so it fires within a poll of its end on any replica.

New wakes (no run bound) go to the version selected for the type: the one an
operator chose (``electric versions select``: a rollback is choosing the old one),
else the newest announced among the connected workers; a ramp sends a share of
the type's entities to another version, by a hash of the entity's id, so one
entity never flips back and forth while the share stands. A version an operator
chose is kept to: while no worker of it is connected its new wakes wait, as
Temporal's tasks wait for the current version's workers.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Sequence

from electric_sdk.lifecycle import STATE_RULES

from ..core import message_cursor
from ..store.base import EntityRecord, Ref, StorageFault, Store, TypeProfile, VersionChoice
from .local_leases import WorkerSession
from .profiles import TypeProfiles

__all__ = ["AUTO_UPGRADE", "PINNED", "VERSIONINGS", "Versions", "ramp_bucket", "upgrade_after"]

log = logging.getLogger(__name__)

PINNED = "pinned"
AUTO_UPGRADE = "auto_upgrade"
VERSIONINGS = ("", PINNED, AUTO_UPGRADE)  # "": the server's default


def upgrade_after(profile: TypeProfile | None, default_ms: int) -> int | None:
    """How long a run bound to ``profile``'s version waits for one of its workers; None: for good."""
    if profile is None or not profile.versioning:
        return default_ms
    if profile.versioning == AUTO_UPGRADE:
        return 0
    return profile.upgrade_after_ms


def ramp_bucket(ref: Ref) -> int:
    """The entity's place in a ramp, 0-99: a ramp of P % takes the entities below P. A hash of its
    ref, the same on every replica and after every restart: the entity is sticky."""
    digest = hashlib.blake2b(f"{ref[0]}/{ref[1]}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 100


class Versions:
    """The operators' version choices (kept in the store; refreshed by every lease sweep, so a
    choice made on one replica holds on the others within a poll) and the choice of hosts."""

    def __init__(self, store: Store, profiles: TypeProfiles, default_upgrade_after_ms: int) -> None:
        self._store = store
        self._profiles = profiles
        self.default_upgrade_after_ms = default_upgrade_after_ms
        self.choices: dict[str, VersionChoice] = {}

    async def refresh(self) -> None:
        with contextlib.suppress(StorageFault):  # the store said why; the choices read last hold meanwhile
            self.choices = {c.type: c for c in await self._store.version_choices()}

    def keep(self, choice: VersionChoice) -> None:
        """A choice this replica just stored: in effect here at once."""
        self.choices[choice.type] = choice

    def wanted(self, ref: Ref, hosts: Sequence[WorkerSession]) -> str | None:
        """The version a new wake of ``ref`` goes to; None: the newest among ``hosts``."""
        choice = self.choices.get(ref[0])
        if choice is None:
            return None
        if choice.ramp_version and ramp_bucket(ref) < choice.ramp_percent:
            return choice.ramp_version
        return choice.selected or None

    def newest(self, type_: str, hosts: Sequence[WorkerSession]) -> str:
        """The newest version announced for ``type_`` among ``hosts`` (the first announced last)."""

        def seq(session: WorkerSession) -> tuple[int, int]:
            profile = self._profiles.announced(type_, session.code_version)
            return (profile.seq if profile is not None else 0, session.announced)

        return max(hosts, key=seq).code_version

    def hosts_for(
        self, record: EntityRecord, hosts: Sequence[WorkerSession], now_ms: int
    ) -> list[WorkerSession]:
        """Of ``hosts`` (connected, hosting the type, with room), the ones ``record``'s lease may go to."""
        # A run bound to its version resumes on it; in `stopping` no run resumes, and the cleanup
        # runs on the version new wakes get.
        bound = message_cursor.bound_version(record) if not STATE_RULES[record.state].shutting_down else ""
        if bound:
            same = [h for h in hosts if h.code_version == bound]
            if same:
                return same
            wait = upgrade_after(self._profiles.announced(record.type, bound), self.default_upgrade_after_ms)
            since = record.waiting_since_ms if record.waiting_since_ms is not None else now_ms
            if wait is None or now_ms < since + wait:
                return []  # it waits for its version
        wanted = self.wanted(record.ref, hosts) or self.newest(record.type, hosts)
        return [h for h in hosts if h.code_version == wanted]
