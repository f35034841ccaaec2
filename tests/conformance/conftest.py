"""Conformance tests: a fresh real server (TestServer, on its own thread) per test, and a real Worker
on the test's loop. Tests synchronize on events and gates, never on sleeps.
"""

from __future__ import annotations

import pytest
from conftest import Leases


@pytest.fixture
def leases() -> Leases:
    """5 s leases instead of 0.6 s. No cell here is about a lease lapsing, and in a loaded run (two
    test processes beside a CPU burner) a worker's heartbeats came late enough for a 0.6 s lease to
    lapse mid-cell (`runtime_lost`), so the cell's run never ended as the table says."""
    return Leases(ttl_ms=5_000, heartbeat_ms=100)
