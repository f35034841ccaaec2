"""Each entity type's code versions, as an operator sees and moves them (``electric versions``).

A version is what a worker announced for a type (its hello or a reload's announce),
kept in the store with its versioning (runtime/profiles.py). What this adds, from the
store alone so any replica answers alike: which workers announce each version now
(the session book), how many runs in flight are bound to it and wait for it
(``Store.bound_runs``), and the choice of version for new wakes
(``Store.version_choices``). Choosing writes the choice; the runtime of this replica
hears it at once (``LocalRuntime.version_chosen``), the others at their next poll.
"""

from __future__ import annotations

import logging
from typing import Protocol

import grpc

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._wire.versions import code_version_to_pb

from ..settings import LEASE_TTL
from ..store.base import Store, TypeProfile, VersionChoice
from . import validation as v
from .errors import ApiError, invalid_argument

__all__ = ["VersionDesk", "VersionListener"]

log = logging.getLogger(__name__)


class VersionListener(Protocol):
    """This replica's runtime, told of a choice made here (the core is below the runtime)."""

    def version_chosen(self, choice: VersionChoice) -> None: ...


class VersionDesk:
    def __init__(self, store: Store, listener: VersionListener | None, lease_ttl_ms: int = LEASE_TTL.value):
        self.store = store
        self.listener = listener
        self.lease_ttl_ms = lease_ttl_ms

    async def list(self, type_: str = "") -> list[api.TypeVersions]:
        profiles = [p for p in await self.store.type_profiles() if not type_ or p.type == type_]
        choices = {c.type: c for c in await self.store.version_choices()}
        live = await self.store.sessions.live(self.lease_ttl_ms)
        by_type: dict[str, list[TypeProfile]] = {}
        for profile in profiles:
            by_type.setdefault(profile.type, []).append(profile)
        answers = []
        for name in sorted(by_type):
            versions = sorted(by_type[name], key=lambda p: -p.seq)
            bound = {version: (n, waiting) for version, n, waiting in await self.store.bound_runs(name)}
            workers: dict[str, list[str]] = {}
            for session in live:
                if name in session.row.types:
                    workers.setdefault(session.row.code_version, []).append(session.row.worker_id)
            choice = choices.get(name, VersionChoice(name, ""))
            connected = [p.code_version for p in versions if p.code_version in workers]
            answer = api.TypeVersions(
                type=name,
                selected=choice.selected,
                current=choice.selected or (connected[0] if connected else versions[0].code_version),
                ramp_version=choice.ramp_version,
                ramp_percent=choice.ramp_percent,
            )
            for profile in versions:
                n, waiting = bound.get(profile.code_version, (0, 0))
                answer.versions.append(
                    code_version_to_pb(
                        profile.code_version,
                        workers.get(profile.code_version, []),
                        n,
                        waiting,
                        profile.versioning or "",
                        profile.upgrade_after_ms,
                        profile.seq,
                    )
                )
            answers.append(answer)
        return answers

    async def choose(self, request: api.SetVersionRequest, who: str) -> api.TypeVersions:
        """Check and keep an operator's choice; refused (nothing written) on a type or version never
        announced, or a ramp without its share."""
        type_ = v.name(request.type, "type")
        announced = {p.code_version for p in await self.store.type_profiles() if p.type == type_}
        if not announced:
            raise ApiError(
                grpc.StatusCode.NOT_FOUND,
                "TYPE_NOT_ANNOUNCED",
                f"no worker ever announced entity type {type_!r}",
                {"type": type_},
            )
        for field, version in (
            ("code_version", request.code_version),
            ("ramp_version", request.ramp_version),
        ):
            if version and version not in announced:
                raise ApiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "VERSION_NOT_ANNOUNCED",
                    f"code version {version!r} of {type_!r} was never announced "
                    f"(announced: {', '.join(sorted(announced))})",
                    {"type": type_, "code_version": version, "field": field},
                )
        if request.ramp_version and not 1 <= request.ramp_percent <= 100:
            raise invalid_argument(
                "INVALID_RAMP", "ramp_percent must be 1-100 with a ramp_version", field="ramp_percent"
            )
        if request.ramp_percent and not request.ramp_version:
            raise invalid_argument(
                "INVALID_RAMP",
                "ramp_percent needs the ramp_version it sends entities to",
                field="ramp_version",
            )
        reason = v.reason(request.reason)
        choice = VersionChoice(type_, request.code_version, request.ramp_version, request.ramp_percent)
        await self.store.store_version_choice(choice)
        if self.listener is not None:
            self.listener.version_chosen(choice)
        log.info(
            "%s chose code version %s for new wakes of %s%s%s",
            who,
            choice.selected or "(the newest announced)",
            type_,
            f", ramping {choice.ramp_percent}% to {choice.ramp_version}" if choice.ramp_version else "",
            f": {reason}" if reason else "",
        )
        (answer,) = await self.list(type_)
        return answer
