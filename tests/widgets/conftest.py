"""Widget tests: a real server (``electric``: the root conftest's, with long leases) and a real
Worker on its own event-loop thread.

The widgets are driven as a person would drive them (``Button.click()``, typing
into a box) and the tests wait for what the watch streams bring back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Leases

from electric_sdk import Client
from electric_sdk.testing import TestServer

from .support import ThreadedWorker


@pytest.fixture
def leases() -> Leases:
    """10 s leases instead of 0.6 s. The worker's thread shares this process with the widgets'
    threads: in a loaded run (two test processes beside a CPU burner) its heartbeats came late, a
    0.6 s lease lapsed, and a running entity went idle (`runtime_lost`) mid-test. Nothing here
    needs a lease to expire quickly."""
    return Leases(ttl_ms=10_000, heartbeat_ms=1_000)


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
