"""EntityTable against a real server and worker: live rows, per-row buttons, signals to a selection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from electric_sdk import Client, Entity
from electric_sdk.lifecycle import Signal, State, possible_signals
from electric_sdk.testing import TestServer
from electric_sdk.widgets import EntityTable

from .support import ThreadedWorker, enabled, wait_for, wait_until


def table_for(opened: list[Any], client: Client, **kw: Any) -> EntityTable:
    table = EntityTable(client, **kw)
    opened.append(table)
    return table


def states(expected: dict[str, State]) -> Callable[[tuple[Entity, ...]], bool]:
    def match(entities: tuple[Entity, ...]) -> bool:
        return {str(e.ref): e.state for e in entities} == expected

    return match


def test_rows_follow_the_entities_and_a_selection_is_signalled_at_once(
    client: Client, worker: ThreadedWorker, opened: list[Any]
) -> None:
    for name in ("p1", "p2", "p3"):
        client.spawn(f"probe/{name}")
    client.spawn("unhosted/u1")  # another type: not in this table
    table = table_for(opened, client, type="probe")
    running = dict.fromkeys(("probe/p1", "probe/p2", "probe/p3"), State.RUNNING)
    wait_for(table, "entities", states(running))
    assert "3 entities" in table.summary.value
    rows = [table._rows[ref] for ref in table._order]
    assert [str(row.ref) for row in rows] == ["probe/p1", "probe/p2", "probe/p3"]
    for row in rows:
        assert enabled(row.buttons) == possible_signals(State.RUNNING) & row.buttons.keys()
        assert "data-state='running'" in row.badge.value

    assert table.send_selected.disabled
    rows[0].select.value = rows[1].select.value = True
    assert table.selected == [rows[0].ref, rows[1].ref]
    assert table.send_selected.description == "Signal 2 selected"
    table.signal_choice.value = Signal.SIGSTOP
    table.reason.value = "deploy"
    table.send_selected.click()
    paused = {**running, "probe/p1": State.PAUSED, "probe/p2": State.PAUSED}
    wait_for(table, "entities", states(paused))
    assert [client.get(r).state for r in running] == [State.PAUSED, State.PAUSED, State.RUNNING]
    wait_for(table.message, "value", lambda text: "SIGSTOP: 2 signalled" in text)
    assert enabled(rows[0].buttons) == possible_signals(State.PAUSED) & rows[0].buttons.keys()

    # A row's own button: resume just that one.
    rows[0].buttons[Signal.SIGCONT].click()
    wait_for(table, "entities", states({**paused, "probe/p1": State.RUNNING}))

    # Kill the selection: asked first, then sent to every selected row.
    table.select_all.value = True
    assert len(table.selected) == 3
    table.signal_choice.value = Signal.SIGKILL
    table.send_selected.click()
    assert table.confirm_kill.asking
    assert "Kill 3 entities" in table.confirm_kill.question.value
    assert client.get("probe/p3").state is State.RUNNING  # nothing sent yet
    table.confirm_kill.confirm.click()
    wait_for(table, "entities", states(dict.fromkeys(running, State.KILLED)))
    for row in rows:
        assert enabled(row.buttons) == set()


def test_a_row_kill_asks_first(client: Client, worker: ThreadedWorker, opened: list[Any]) -> None:
    client.spawn("probe/p1")
    table = table_for(opened, client)
    wait_for(table, "entities", states({"probe/p1": State.RUNNING}))
    row = table._rows[table._order[0]]
    row.buttons[Signal.SIGKILL].click()
    assert table.confirm_kill.asking
    table.confirm_kill.cancel.click()
    assert client.get("probe/p1").state is State.RUNNING
    row.buttons[Signal.SIGKILL].click()
    table.confirm_kill.confirm.click()
    wait_for(table, "entities", states({"probe/p1": State.KILLED}))


def test_a_state_filter_keeps_only_matching_entities(
    client: Client, worker: ThreadedWorker, opened: list[Any]
) -> None:
    client.spawn("probe/p1")
    client.spawn("probe/p2")
    client.wait_for_state("probe/p1", State.RUNNING, timeout=10)
    table = table_for(opened, client, state="paused")
    wait_for(table.summary, "value", lambda text: "0 entities" in text)
    client.pause("probe/p1")
    wait_for(table, "entities", states({"probe/p1": State.PAUSED}))
    client.resume("probe/p1")  # it leaves the filter, and the table
    wait_for(table, "entities", states({}))
    assert table.rows.children == ()


def test_a_selection_sigusr_needs_valid_json(
    client: Client, worker: ThreadedWorker, opened: list[Any]
) -> None:
    client.spawn("probe/p1")
    table = table_for(opened, client)
    wait_for(table, "entities", states({"probe/p1": State.RUNNING}))
    table.select_all.value = True
    table.signal_choice.value = Signal.SIGUSR
    assert table.payload.layout.display == ""  # the payload box shows for SIGUSR only
    table.payload.value = "{not json"
    table.send_selected.click()
    assert "not valid JSON" in table.message.value
    table.payload.value = '{"focus": "costs"}'
    table.send_selected.click()
    wait_for(table.message, "value", lambda text: "SIGUSR: 1 signalled" in text)
    signals = [e for e in client.events("probe/p1").events if e.type == "signal" and e.operation == "insert"]
    assert [e.value.get("payload") for e in signals] == [{"focus": "costs"}]


def test_shows_at_most_limit_rows(client: Client, opened: list[Any]) -> None:
    for i in range(5):
        client.spawn(f"unhosted/u{i}")
    table = table_for(opened, client, limit=3)
    wait_for(table, "entities", lambda entities: len(entities) == 5)
    assert len(table.rows.children) == 3
    assert "5 entities, showing the first 3" in table.summary.value


def test_close_stops_the_watch_stream(electric: TestServer, client: Client) -> None:
    client.spawn("unhosted/u1")
    table = EntityTable(client)
    wait_for(table, "entities", lambda entities: len(entities) == 1)
    watches = electric._server._watches
    assert watches.active == 1  # the snapshot came through the stream itself
    table.close()
    assert table._feed is not None
    assert table._feed.stopped.is_set()
    wait_until(lambda: watches.active == 0)
