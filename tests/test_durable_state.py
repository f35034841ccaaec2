"""The durable state's rebuild rules (electric_sdk/durable_state.py): a snapshot plus the tail
after it gives the state a full replay gives, over random histories (hypothesis)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from electric_sdk import durable_state as ds
from electric_sdk.runtime.state import LeaseState, StateView
from electric_sdk.state_read import Loaded

NAMES = ("history", "prefs", "notes")
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), st.text(max_size=5))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)
list_ops = st.tuples(st.just("append"), st.just("history"), json_values).map(list)
map_ops = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(("prefs", "notes")), st.text(max_size=3), json_values),
    st.tuples(st.just("del"), st.sampled_from(("prefs", "notes")), st.text(max_size=3)),
).map(list)
clear_ops = st.tuples(st.just("clear"), st.sampled_from(NAMES)).map(list)
ops = st.lists(st.one_of(list_ops, map_ops, clear_ops), max_size=4)
# An event of a stream: a state-bearing event with its ops, or one that carries none.
events = st.one_of(
    ops.map(lambda o: (ds.STATE_EVENT, {"ops": o, "run": "", "snap": -1})),
    ops.map(lambda o: (ds.STEP_EVENT, {"name": "s", "ops": o, "snap": -1})),
    st.just(("message", {"text": "hi"})),
    st.just(("custom.note", {"ops": [["append", "history", "not a state event"]]})),
)


@settings(max_examples=300, deadline=None)
@given(history=st.lists(events, max_size=40), cut=st.integers(min_value=-1, max_value=40))
def test_snapshot_plus_tail_equals_full_replay(history: list[tuple[str, Any]], cut: int) -> None:
    full = ds.fold(history)
    tail = [(offset, t, d) for offset, (t, d) in enumerate(history)]
    upto = min(cut, len(history) - 1)
    # The snapshot as the stream keeps it: the state after every event at offsets <= upto, as JSON.
    snapshot = {"upto": upto, "state": ds.json_copy(ds.fold(history[: upto + 1]))}
    assert ds.rebuild(snapshot, tail) == full
    assert ds.rebuild(None, tail) == full


def test_ops_apply_in_order_and_only_from_state_events() -> None:
    state = ds.fold(
        [
            (ds.STATE_EVENT, {"ops": [["append", "history", 1], ["set", "prefs", "tone", "short"]]}),
            ("user.event", {"ops": [["append", "history", "ignored"]]}),
            (ds.STEP_EVENT, {"ops": [["append", "history", 2], ["del", "prefs", "tone"]]}),
        ]
    )
    assert state == {"history": [1, 2], "prefs": {}}


@pytest.mark.parametrize(
    ("op", "why"),
    [
        (["set", "history", "k", 1], "is a list"),
        (["append", "prefs", 1], "is a keyed map"),
        (["pop", "history"], "not a state op"),
    ],
)
def test_a_change_that_does_not_fit_changes_nothing(op: list[Any], why: str) -> None:
    state: ds.Collections = {"history": [0], "prefs": {"a": 1}}
    with pytest.raises(ds.StateError, match=why):
        ds.apply(state, op)
    assert state == {"history": [0], "prefs": {"a": 1}}


def test_values_must_be_json() -> None:
    assert ds.json_copy((1, 2)) == [1, 2]
    with pytest.raises(ds.StateError, match="must be JSON"):
        ds.json_copy({1, 2})
    deep: Any = 0
    for _ in range(ds.MAX_VALUE_DEPTH + 1):
        deep = [deep]
    with pytest.raises(ds.StateError, match="deep"):
        ds.json_copy(deep)


class _Ctx:
    """What ``StateView`` changes through (the runtime's Context): the live state and its ops."""

    def __init__(self) -> None:
        self.lease = LeaseState(Loaded({}, -1, -1, 0, 0), ds.SnapshotPolicy())
        self.ops: list[ds.Op] = []

    def _state(self) -> LeaseState:
        return self.lease

    def _change(self, op: ds.Op) -> None:
        ds.apply(self.lease.live, op)
        self.ops.append(op)


calls = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.sampled_from(NAMES), json_values),
        st.tuples(st.just("set"), st.sampled_from(NAMES), st.text(max_size=2), json_values),
        st.tuples(st.just("del"), st.sampled_from(NAMES), st.text(max_size=2)),
        st.tuples(st.just("clear"), st.sampled_from(NAMES)),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(calls=calls)
def test_what_entity_code_sees_is_what_a_rebuild_gives(calls: list[tuple[Any, ...]]) -> None:
    ctx = _Ctx()
    view = StateView(ctx)
    for kind, name, *rest in calls:
        collection = view[name]
        try:
            if kind == "append":
                collection.append(rest[0])
            elif kind == "set":
                collection[rest[0]] = rest[1]
            elif kind == "del":
                del collection[rest[0]]
            else:
                collection.clear()
        except (ds.StateError, KeyError):
            pass  # refused (a list set by key, a missing key): nothing changed, nothing recorded
    rebuilt = ds.fold([(ds.STATE_EVENT, {"ops": ds.json_copy(ctx.ops)})])
    assert rebuilt == view.to_json()
