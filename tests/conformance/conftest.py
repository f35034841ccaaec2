"""Conformance tests: a fresh real server (TestServer, on its own thread) per test, and a real Worker
on the test's loop. Tests synchronize on events and gates, never on sleeps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from electric_sdk import AsyncClient
from electric_sdk.testing import TestServer


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def electric(tmp_path: Any) -> Iterator[TestServer]:
    with TestServer(tmp_path / "electric", lease_ttl_ms=600, heartbeat_interval_ms=100) as server:
        yield server


@pytest.fixture
async def client(electric: TestServer) -> AsyncIterator[AsyncClient]:
    async with electric.async_client() as c:
        yield c
