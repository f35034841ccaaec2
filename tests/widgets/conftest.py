"""Widget tests: a real server (the root conftest's ``electric``) and a real Worker on its own
event-loop thread.

The widgets are driven as a person would drive them (``Button.click()``, typing
into a box) and the tests wait for what the watch streams bring back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from electric_sdk import Client
from electric_sdk.testing import TestServer

from .support import ThreadedWorker


@pytest.fixture
def client(electric: TestServer) -> Client:
    """A sync Client here (the root conftest's ``client`` is an AsyncClient)."""
    return electric.client()


@pytest.fixture
def opened() -> Iterator[list[Any]]:
    """Widgets a test opened, closed after it (their streams end before the server stops)."""
    made: list[Any] = []
    yield made
    for widget in made:
        widget.close()


@pytest.fixture
def worker(electric: TestServer) -> Iterator[ThreadedWorker]:
    with ThreadedWorker(electric.address) as worker:
        yield worker
