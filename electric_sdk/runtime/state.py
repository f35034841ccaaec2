"""``ctx.state``: an entity's durable state as entity code sees it, and one lease's copy of it.

``LeaseState`` is the state a host rebuilt at its lease (``state_read``): the
live collections every context of the entity changes (runs and signal
handlers share them: a handler's change is seen by the run's next line), the
committed copy (what the stream holds), and when to write a snapshot.

``StateView`` / ``Collection`` are what ``ctx.state`` and ``ctx.state[name]``
return: each change is checked (JSON, the collection's kind, the type the
user gave), applied to the live state at once, and kept on the context until
it is written: with the run's next recorded step, at the run's end, or at the
end of a signal handler (``durable_state`` says how they are written).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any, Generic, Protocol, TypeVar

from ..durable_state import Collections, Op, SnapshotPolicy, StateError, apply, json_copy
from ..state_read import Loaded

__all__ = ["Collection", "LeaseState", "StateView"]

T = TypeVar("T")


class LeaseState:
    __slots__ = ("_bytes_since", "_ops_since", "committed", "inflight", "live", "policy", "snapshot", "upto")

    def __init__(self, loaded: Loaded, policy: SnapshotPolicy) -> None:
        self.live: Collections = loaded.state
        self.committed: Collections = copy.deepcopy(loaded.state)
        # The newest state-bearing event the committed copy includes, and the latest snapshot.
        self.upto = loaded.upto
        self.snapshot = loaded.snapshot
        self.policy = policy
        # State writes on their way: a snapshot is taken only when none is, so that it holds
        # exactly the events up to ``upto``.
        self.inflight = 0
        self._ops_since = 0
        self._bytes_since = 0

    def committed_write(self, ops: list[Op], offset: int, nbytes: int) -> None:
        for op in ops:
            apply(self.committed, op)
        self.upto = max(self.upto, offset)
        self._ops_since += len(ops)
        self._bytes_since += nbytes

    def snapshot_due(self) -> bool:
        return self.inflight == 0 and self.policy.due(self._ops_since, self._bytes_since)

    def snapshot_data(self) -> dict[str, Any]:
        return {"upto": self.upto, "state": self.committed}

    def snapshot_written(self, offset: int) -> None:
        self.snapshot = offset
        self.snapshot_skipped()

    def snapshot_skipped(self) -> None:
        """Count afresh (a snapshot too large to write is not tried again at every change)."""
        self._ops_since = self._bytes_since = 0


class _Changes(Protocol):
    """Where a view's changes go (the Context implements it)."""

    def _state(self) -> LeaseState: ...
    def _change(self, op: Op) -> None: ...


class StateView:
    """``ctx.state``: the entity's named collections. ``ctx.state["history"]`` is a collection
    (a list once appended to, a keyed map once set); ``ctx.state.list(name, type)`` and
    ``ctx.state.map(name, type)`` also check the kind and every value's type."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx: _Changes) -> None:
        self._ctx = ctx

    def __getitem__(self, name: str) -> Collection[Any]:
        return Collection(self._ctx, _name(name), None, object)

    def list(self, name: str, type: type[T] | None = None) -> Collection[T]:
        return Collection(self._ctx, _name(name), list, type or object)

    def map(self, name: str, type: type[T] | None = None) -> Collection[T]:
        return Collection(self._ctx, _name(name), dict, type or object)

    def __contains__(self, name: object) -> bool:
        return name in self._ctx._state().live

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._ctx._state().live))

    def to_json(self) -> Collections:
        """A copy of the whole state, as plain JSON values."""
        return copy.deepcopy(self._ctx._state().live)


def _name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise StateError("a state collection's name must be a non-empty string")
    return name


class Collection(Generic[T]):
    """One named collection: list operations (``append``, ``extend``, ``[i]``) or keyed map
    operations (``[key] = value``, ``del [key]``, ``get``, ``items``), as its first change chose."""

    __slots__ = ("_ctx", "_kind", "_name", "_type")

    def __init__(self, ctx: _Changes, name: str, kind: type | None, item_type: type) -> None:
        self._ctx, self._name, self._kind, self._type = ctx, name, kind, item_type
        current = self._current()
        if kind is not None and current is not None and not isinstance(current, kind):
            raise StateError(f"state[{name!r}] is {'a list' if isinstance(current, list) else 'a keyed map'}")

    def _current(self) -> Any:
        return self._ctx._state().live.get(self._name)

    def _value(self, value: Any) -> Any:
        if not isinstance(value, self._type):
            raise StateError(f"state[{self._name!r}] holds {self._type.__name__} values, not {value!r}")
        return json_copy(value, f"state[{self._name!r}] value")

    def _read(self) -> Any:
        current = self._current()
        return current if current is not None else (self._kind or list)()

    # -- changes ----------------------------------------------------------------------------

    def _kind_is(self, kind: type) -> None:
        if self._kind is not None and self._kind is not kind:
            raise StateError(f"state[{self._name!r}] is a {'list' if self._kind is list else 'keyed map'}")

    def append(self, value: T) -> None:
        self._kind_is(list)
        self._ctx._change(["append", self._name, self._value(value)])

    def extend(self, values: list[T]) -> None:
        for value in values:
            self.append(value)

    def __setitem__(self, key: str, value: T) -> None:
        if not isinstance(key, str):
            raise StateError(f"state[{self._name!r}] keys are strings, not {key!r}")
        self._kind_is(dict)
        self._ctx._change(["set", self._name, key, self._value(value)])

    def __delitem__(self, key: str) -> None:
        if key not in self._read():
            raise KeyError(key)
        self._ctx._change(["del", self._name, key])

    def clear(self) -> None:
        self._ctx._change(["clear", self._name])

    # -- reads (copies: a change goes through the methods above, or it would not be recorded) -

    def __getitem__(self, key: Any) -> T:
        return copy.deepcopy(self._read()[key])  # type: ignore[no-any-return]

    def get(self, key: str, default: T | None = None) -> T | None:
        current = self._read()
        return copy.deepcopy(current.get(key, default)) if isinstance(current, dict) else default

    def __len__(self) -> int:
        return len(self._read())

    def __iter__(self) -> Iterator[Any]:
        return iter(copy.deepcopy(self._read()))

    def __contains__(self, item: object) -> bool:
        return item in self._read()

    def keys(self) -> list[str]:
        return list(self._read())

    def items(self) -> list[tuple[str, T]]:
        return list(copy.deepcopy(self._read()).items())

    def values(self) -> list[T]:
        current = copy.deepcopy(self._read())
        return list(current.values()) if isinstance(current, dict) else list(current)

    def to_json(self) -> Any:
        return copy.deepcopy(self._read())

    def __eq__(self, other: object) -> bool:
        return bool(self._read() == (other.to_json() if isinstance(other, Collection) else other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"state[{self._name!r}]={self._read()!r}"
