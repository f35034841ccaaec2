"""Dashboard: the table, and beside it the panel of the entity whose id was pressed."""

from __future__ import annotations

from typing import Any

from electric_sdk import Client
from electric_sdk.lifecycle import Signal, State
from electric_sdk.testing import TestServer
from electric_sdk.widgets import Dashboard, EntityControl

from .support import ThreadedWorker, wait_for, wait_until


def panel(dashboard: Dashboard) -> EntityControl:
    assert dashboard.control is not None
    assert list(dashboard.panel.children) == [dashboard.control]
    return dashboard.control


def test_it_opens_on_the_table_and_a_pressed_id_opens_its_panel(
    electric: TestServer, client: Client, worker: ThreadedWorker, opened: list[Any]
) -> None:
    client.spawn("probe/p1")
    client.spawn("probe/p2")
    dashboard = Dashboard(client)
    opened.append(dashboard)
    assert dashboard.control is None
    assert "Press an entity's id" in dashboard.panel.children[0].value
    assert electric.address in dashboard.header.value
    table = dashboard.table
    wait_for(table, "entities", lambda entities: {e.state for e in entities} == {State.RUNNING})

    next(s for s in table.slots if str(s.ref) == "probe/p1").name.click()
    first = panel(dashboard)
    wait_for(first, "view", lambda view: view.state is State.RUNNING)
    first.buttons[Signal.SIGSTOP].click()
    wait_for(table, "entities", lambda entities: State.PAUSED in {e.state for e in entities})

    # Another id: its panel replaces the first, whose streams end.
    watches = electric.server.watches
    next(s for s in table.slots if str(s.ref) == "probe/p2").name.click()
    second = panel(dashboard)
    assert str(second.ref) == "probe/p2"
    assert first.closed
    wait_for(second, "view", lambda view: view.state is State.RUNNING)
    wait_until(lambda: watches.active == 3)  # the table's, and the second panel's two


def test_an_entity_given_opens_at_once_and_an_unknown_one_leaves_the_table_alone(
    client: Client, opened: list[Any]
) -> None:
    client.spawn("nobody/n1")
    dashboard = Dashboard(client, entity="nobody/gone")
    opened.append(dashboard)
    control = panel(dashboard)
    text = wait_for(control.status, "value", lambda text: "ENTITY_NOT_FOUND" in text)
    assert "/nobody/gone is not on the server" in text
    assert "pick an entity in the table" in text
    wait_for(dashboard.table, "entities", lambda entities: [str(e.ref) for e in entities] == ["nobody/n1"])
    assert dashboard.table.alert.value == ""
    assert str(dashboard.table.opened) == "nobody/gone"


def test_a_final_entity_says_it_is_final(client: Client, opened: list[Any]) -> None:
    client.spawn("nobody/k1")
    client.kill("nobody/k1")
    dashboard = Dashboard(client, entity="nobody/k1")
    opened.append(dashboard)
    control = panel(dashboard)
    wait_for(control, "view", lambda view: view.state is State.KILLED)
    assert "<b>final</b>: /nobody/k1 is killed" in control.final.value
    assert all(button.disabled for button in control.buttons.values())
