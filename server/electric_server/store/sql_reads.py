"""The reads every SQL store answers the same way from its rows; each store names the statements.

A store derives from ``SQLReads``, sets the two statements and implements
``fetch`` (every row a statement returns, with the store's own placeholders,
faults and durability rule).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from electric_sdk.lifecycle import STATE_RULES, TERMINAL_STATES, Signal, State, decide

from .base import CascadeFind, EntityRecord, Ref, Store, TypeProfile, VersionChoice
from .rows import entity_from_row

__all__ = ["SQLReads", "cascades_due_sql"]


def _sigterm_moves(state: State) -> bool:
    return decide(state, Signal.SIGTERM, None).transitions


def cascades_due_sql(limit_placeholder: str, collate: str = "") -> str:
    """The children a parent's end has not reached yet (``Store.cascades_due``), in either SQL:
    only the placeholder differs, and PostgreSQL's collation of the parent's name (its key's
    columns may be "C", its parent column the database's: one must be said). Read through the index by parent (children only); a parent's
    signal reaches a child once, so the rows found are few whatever the table's size."""
    terminal = ", ".join(f"'{s.value}'" for s in State if s in TERMINAL_STATES)
    ending = ", ".join(f"'{s.value}'" for s in State if s in TERMINAL_STATES or STATE_RULES[s].shutting_down)
    # The states a SIGTERM moves (a `spawning` child ignores it: it is found again once started).
    movable = ", ".join(f"'{s.value}'" for s in State if s not in TERMINAL_STATES and _sigterm_moves(s))
    return (
        f"SELECT c.type, c.id, p.type, p.id, p.state, p.stopping_deadline "
        f"FROM entities c JOIN entities p ON c.parent = (p.type || '/' || p.id){collate} "
        f"WHERE c.parent <> '' AND c.state NOT IN ({terminal}) AND p.state IN ({ending}) "
        f"AND (p.state = '{State.KILLED.value}' OR c.state IN ({movable})) "
        # The parent's type's policy, as its newest code version announced it.
        f"AND NOT EXISTS (SELECT 1 FROM type_profiles tp WHERE tp.type = p.type{collate} "
        "AND tp.children = 'detach' "
        f"AND tp.seq = (SELECT max(t2.seq) FROM type_profiles t2 WHERE t2.type = p.type{collate})) "
        f"ORDER BY c.type, c.id LIMIT {limit_placeholder}"
    )


class SQLReads(Store):
    # (type, id, stopping_deadline) of every entity with a deadline.
    select_stopping_deadlines: str
    # (type, code_version, seq, grace_ms, idle_timeout_ms) of every announcement.
    select_type_profiles: str
    # (type, selected, ramp_version, ramp_percent) of every version choice.
    select_version_choices: str
    # (run_version, in flight, unleased) of a type's runs in flight; its one parameter, the type.
    select_bound_runs: str
    # The children a parent's signal has not reached; its one parameter, the limit.
    select_cascades_due: str
    # Ended children whose parent is not told yet; its one parameter, the limit.
    select_children_ended: str
    # Entities whose aborted runs' children are still to be told; its one parameter, the limit.
    select_interrupts_due: str
    # Entities waiting to be woken by another's run's end; its one parameter, the limit.
    select_awaiting: str

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

    async def cascades_due(self, limit: int) -> list[CascadeFind]:
        rows = await self.fetch(self.select_cascades_due, (limit,))
        return [
            CascadeFind((str(ct), str(ci)), (str(pt), str(pi)), State(ps), None if d is None else int(d))
            for ct, ci, pt, pi, ps, d in rows
        ]

    async def children_ended(self, limit: int) -> list[EntityRecord]:
        return [entity_from_row(r) for r in await self.fetch(self.select_children_ended, (limit,))]

    async def interrupts_due(self, limit: int) -> list[EntityRecord]:
        return [entity_from_row(r) for r in await self.fetch(self.select_interrupts_due, (limit,))]

    async def awaiting(self, limit: int) -> list[EntityRecord]:
        return [entity_from_row(r) for r in await self.fetch(self.select_awaiting, (limit,))]

    async def bound_runs(self, type_: str) -> list[tuple[str, int, int]]:
        rows = await self.fetch(self.select_bound_runs, (type_,))
        return [(str(v), int(n), int(w or 0)) for v, n, w in rows]
