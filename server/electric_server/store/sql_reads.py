"""The reads every SQL store answers the same way from its rows; each store names the statements.

A store mixes ``SQLReads`` in, sets the two statements and implements
``_rows`` (every row a statement returns, with the store's own placeholders,
faults and durability rule).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from .base import Ref, TypeProfile

__all__ = ["SQLReads"]


class SQLReads(abc.ABC):
    # (type, id, stopping_deadline) of every entity with a deadline.
    select_stopping_deadlines: str
    # (type, code_version, seq, grace_ms, idle_timeout_ms) of every announcement.
    select_type_profiles: str

    @abc.abstractmethod
    async def _rows(self, sql: str, args: Sequence[object] = ()) -> list[Any]: ...

    async def stopping_deadlines(self) -> list[tuple[Ref, int]]:
        return [((str(t), str(i)), int(d)) for t, i, d in await self._rows(self.select_stopping_deadlines)]

    async def type_profiles(self) -> list[TypeProfile]:
        return [TypeProfile._make(row) for row in await self._rows(self.select_type_profiles)]
