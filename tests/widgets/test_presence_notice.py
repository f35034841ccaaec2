"""EntityControl's notice: an entity waiting for a type no connected worker hosts says so."""

from __future__ import annotations

from typing import Any

import pytest

from electric_sdk import Client
from electric_sdk.lifecycle import State
from electric_sdk.testing import TestServer
from electric_sdk.widgets import EntityControl

from .support import ThreadedWorker, wait_for, wait_until

pytestmark = pytest.mark.both_stores


def test_the_panel_says_no_worker_hosts_the_type(
    client: Client, worker: ThreadedWorker, opened: list[Any]
) -> None:
    client.spawn("nobody/w1")
    waiting = EntityControl(client, "nobody/w1")
    opened.append(waiting)
    wait_for(waiting, "view", lambda _view: "no connected worker hosts type" in waiting.hosting.html.value)
    assert waiting.view.state is State.SPAWNING
    assert "&#x27;nobody&#x27;" in waiting.hosting.html.value  # the type's name, escaped

    client.spawn("probe/w2")  # the worker's type: leased, and no notice
    hosted = EntityControl(client, "probe/w2")
    opened.append(hosted)
    wait_for(hosted, "view", lambda view: view.state is State.RUNNING)
    assert hosted.hosting.html.value == ""


def test_the_panel_says_so_for_an_idle_entity_once_a_message_waits(
    electric: TestServer, client: Client, opened: list[Any]
) -> None:
    """Idle with nothing to run, it waits for no worker: no notice. A message makes it wait for
    one, with no change of state: the notice comes, as `electric get`'s warning does."""
    with ThreadedWorker(electric.address, idle_timeout="50ms"):
        client.spawn("probe/idle1")
        client.wait_for_state("probe/idle1", [State.IDLE], timeout=10)
    wait_until(lambda: not client.workers())  # its session's end has no event to wait on
    panel = EntityControl(client, "probe/idle1")
    opened.append(panel)
    wait_for(panel, "view", lambda view: view.state is State.IDLE)
    assert panel.hosting.html.value == ""
    client.send("probe/idle1", "wake up")
    wait_for(panel.hosting.html, "value", lambda value: "no connected worker hosts type" in value)
    assert panel.view.state is State.IDLE
