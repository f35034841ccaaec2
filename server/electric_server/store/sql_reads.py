"""The reads every SQL store answers the same way from its rows; each store names the statements.

A store derives from ``SQLReads``, sets the two statements and implements
``fetch`` (every row a statement returns, with the store's own placeholders,
faults and durability rule).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from .base import Ref, Store, TypeProfile, VersionChoice

__all__ = ["SQLReads"]


class SQLReads(Store):
    # (type, id, stopping_deadline) of every entity with a deadline.
    select_stopping_deadlines: str
    # (type, code_version, seq, grace_ms, idle_timeout_ms) of every announcement.
    select_type_profiles: str
    # (type, selected, ramp_version, ramp_percent) of every version choice.
    select_version_choices: str
    # (run_version, in flight, unleased) of a type's runs in flight; its one parameter, the type.
    select_bound_runs: str

    @abc.abstractmethod
    async def fetch(self, sql: str, args: Sequence[object] = ()) -> list[Any]:
        """Every row a read returns, in this store's SQL and placeholders (also for tests and
        operators' tools: a statement's plan, a setting)."""

    async def stopping_deadlines(self) -> list[tuple[Ref, int]]:
        return [((str(t), str(i)), int(d)) for t, i, d in await self.fetch(self.select_stopping_deadlines)]

    async def type_profiles(self) -> list[TypeProfile]:
        return [TypeProfile._make(row) for row in await self.fetch(self.select_type_profiles)]

    async def version_choices(self) -> list[VersionChoice]:
        return [VersionChoice._make(row) for row in await self.fetch(self.select_version_choices)]

    async def bound_runs(self, type_: str) -> list[tuple[str, int, int]]:
        rows = await self.fetch(self.select_bound_runs, (type_,))
        return [(str(v), int(n), int(w or 0)) for v, n, w in rows]
