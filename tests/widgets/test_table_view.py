"""The table's pure part: which rows a query shows, in which order and page, and when the stream
it holds covers a query (so a filter applies without a new stream)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from electric_sdk import Entity
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.enums import state_to_pb
from electric_sdk._wire.times import timestamp_from_datetime
from electric_sdk.lifecycle import State
from electric_sdk.widgets._table_view import (
    LIVE_STATES,
    TableQuery,
    WatchFilter,
    ago,
    page_of,
    row_html,
    select,
    tree_labels,
    tree_order,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def entity(ref: str, state: State, age_s: int = 0, *, waiting: bool = False, parent: str = "") -> Entity:
    type_, id_ = ref.split("/")
    created = timestamp_from_datetime(NOW - timedelta(seconds=age_s))
    m = pb.Entity(
        ref=pb.EntityRef(type=type_, id=id_),
        state=state_to_pb(state),
        created_at=created,
        updated_at=created,
        head_offset=age_s,
        message_waiting=waiting,
    )
    if parent:
        m.parent.CopyFrom(pb.EntityRef(type=parent.split("/", maxsplit=1)[0], id=parent.split("/")[1]))
    return Entity.from_pb(m)


FLEET = [
    entity("research/r1", State.RUNNING, 30),
    entity("research/r2", State.STOPPED, 20),
    entity("writer/w1", State.IDLE, 10),
    entity("writer/w2", State.KILLED, 5),
    entity("writer/w10", State.PAUSED, 1),
]


def refs(entities: list[Entity]) -> list[str]:
    return [str(e.ref) for e in entities]


def test_final_entities_are_hidden_until_asked_for() -> None:
    assert refs(select(FLEET, TableQuery())) == ["writer/w10", "writer/w1", "research/r1"]
    shown = refs(select(FLEET, TableQuery(show_final=True)))
    assert shown == ["writer/w10", "writer/w2", "writer/w1", "research/r2", "research/r1"]
    # A final state chosen in the state filter shows its entities, ticked or not.
    assert refs(select(FLEET, TableQuery(state=State.KILLED))) == ["writer/w2"]


def test_type_state_and_search_narrow_the_rows() -> None:
    assert refs(select(FLEET, TableQuery(type="writer"))) == ["writer/w10", "writer/w1"]
    assert refs(select(FLEET, TableQuery(state=State.IDLE))) == ["writer/w1"]
    assert refs(select(FLEET, TableQuery(search="W1", show_final=True))) == ["writer/w10", "writer/w1"]
    assert refs(select(FLEET, TableQuery(search="research/r"))) == ["research/r1"]


def test_sorts() -> None:
    assert refs(select(FLEET, TableQuery(sort="name", show_final=True)))[:3] == [
        "research/r1",
        "research/r2",
        "writer/w1",
    ]


def test_pages_are_clamped_to_the_rows_there_are() -> None:
    rows = select(FLEET, TableQuery(show_final=True))
    page = page_of(rows, 1, 2)
    assert (refs(list(page.rows)), page.number, page.pages) == (["writer/w1", "research/r2"], 1, 3)
    assert page_of(rows, 7, 2).number == 2  # past the end: the last page
    assert page_of([], 3, 25) == page_of([], 0, 25)
    assert page_of([], 0, 25).pages == 1


def test_a_stream_covers_the_narrower_queries() -> None:
    live_everything = TableQuery().watch_filter()
    assert live_everything == WatchFilter(None, LIVE_STATES)
    assert live_everything.covers(TableQuery(type="writer").watch_filter())
    assert live_everything.covers(TableQuery(state=State.PAUSED).watch_filter())
    # Stopped and killed entities were never asked for: a new stream must bring them.
    assert not live_everything.covers(TableQuery(show_final=True).watch_filter())
    assert not live_everything.covers(TableQuery(state=State.STOPPED).watch_filter())
    one_type = TableQuery(type="writer", show_final=True).watch_filter()
    assert not one_type.covers(TableQuery().watch_filter())
    assert not one_type.covers(TableQuery(type="research").watch_filter())
    assert TableQuery(show_final=True).watch_filter().covers(one_type)


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (59, "59s"), (60, "1m"), (3599, "59m"), (7200, "2h"), (86_400 * 3, "3d")]
)
def test_ago(seconds: int, text: str) -> None:
    assert ago(NOW - timedelta(seconds=seconds), NOW) == text


def test_a_row_says_whether_a_worker_hosts_its_type() -> None:
    waiting = entity("nobody/n1", State.SPAWNING, 90)
    cells = row_html(waiting, frozenset({"research"}), NOW)
    assert "data-state='spawning'" in cells
    assert ">90<" in cells  # events
    assert "1m ago" in cells
    assert "color:#dc3545'>no<" in cells  # waits for a type no connected worker hosts
    assert ">yes<" in row_html(FLEET[0], frozenset({"research"}), NOW)
    assert ">-<" in row_html(FLEET[2], frozenset({"research"}), NOW)  # idle, nothing to run
    assert ">no<" in row_html(entity("writer/w3", State.IDLE, waiting=True), frozenset(), NOW)
    assert ">?<" in row_html(waiting, None, NOW)  # the workers are not known yet


def test_the_tree_order_nests_children_and_lets_orphans_lead() -> None:
    def child(ref: str, parent: str) -> Entity:
        return entity(ref, State.RUNNING, parent=parent)

    fleet = [
        child("team/b", "boss/root"),
        child("team/a1", "team/a"),
        entity("boss/root", State.RUNNING),
        child("team/a", "boss/root"),
        child("team/z", "boss/gone"),  # its parent is not shown: a tree of its own
    ]
    ordered = tree_order(sorted(fleet, key=lambda e: (e.ref.type, e.ref.id)))
    assert refs(ordered) == ["boss/root", "team/a", "team/a1", "team/b", "team/z"]
    labels = tree_labels(ordered)
    assert [labels[e.ref] for e in ordered] == ["root", "\u2514 a", "\u2003\u2514 a1", "\u2514 b", "z"]
    assert refs(select(fleet, TableQuery(sort="tree"))) == refs(ordered)
    assert "data-col='parent'" in row_html(ordered[1], frozenset(), NOW)
    assert ">boss/root<" in row_html(ordered[1], frozenset(), NOW)
