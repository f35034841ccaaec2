"""What ``AsyncClient``'s parts (its mixins) call on the client they are part of."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from ..arguments import RefLike
from ..models import Event
from ._options import ClientOptions

__all__ = ["Caller"]


class Caller(Protocol):
    """``AsyncClient`` as its parts see it: every call's one path, and the resumable watch."""

    options: ClientOptions

    async def _call(self, rpc: str, request: Any, wait_s: float = 0.0) -> Any: ...

    def watch(self, ref: RefLike, from_offset: int = 0) -> AsyncIterator[Event]: ...
