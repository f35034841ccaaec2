"""EntityControl's notice: an entity waiting for a type no connected worker hosts says so."""

from __future__ import annotations

from typing import Any

import pytest

from electric_sdk import Client
from electric_sdk.lifecycle import State
from electric_sdk.widgets import EntityControl

from .support import ThreadedWorker, wait_for

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
