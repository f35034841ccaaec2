"""A cancelled database connect is no ERROR report (store/postgres/cancelled_connects.py).

CI once failed a test whose server stopped while its pool was reconnecting to a dropped
database: asyncpg left "unexpected connection_lost() call" on a future nobody reads, and asyncio
reported it as an error with a traceback. These tests make that happen for real (connects to the
test's PostgreSQL, cancelled at random moments) and show the report exists without the filter
and goes nowhere but a DEBUG line with it, while every other report still reaches the handler
that was there.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
from typing import Any

import asyncpg
import pytest
from electric_server.store.postgres.cancelled_connects import quiet_cancelled_connects

pytestmark = pytest.mark.anyio

TRIES = 3_000  # on this machine about one connect in five leaks; many fewer would already do


async def _cancelled_connects_until(url: str, done: Any) -> int:
    """Cancel connects at random moments of their first milliseconds until ``done()``; returns
    how many were tried."""
    rng = random.Random(46)
    for tried in range(1, TRIES + 1):
        connecting = asyncio.ensure_future(asyncpg.connect(url))
        await asyncio.sleep(rng.random() * 0.004)
        connecting.cancel()
        try:
            conn = await connecting
        except asyncio.CancelledError:
            pass
        else:
            await conn.close()
        gc.collect()  # the report comes when the unread future is collected
        if done():
            return tried
    return TRIES


@pytest.fixture
async def reported() -> Any:
    """The loop's reports, as a handler that was there before the store's filter sees them."""
    loop = asyncio.get_running_loop()
    before = loop.get_exception_handler()
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    yield seen
    loop.set_exception_handler(before)


def _leaks(reported: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in reported if "connection_lost" in repr(c.get("exception"))]


async def test_a_cancelled_connect_leaves_a_report_without_the_filter(
    postgres_url: str, reported: Any
) -> None:
    """What the filter is for happens: without it, the report reaches the loop's handler."""
    await _cancelled_connects_until(postgres_url, lambda: bool(_leaks(reported)))
    assert _leaks(reported), f"no cancelled connect of {TRIES} left its report"
    leak = _leaks(reported)[0]
    assert leak["message"] == "Future exception was never retrieved"


async def test_the_store_filter_turns_it_into_a_debug_line_and_passes_the_rest_on(
    postgres_url: str, reported: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="electric_server.store.postgres.cancelled_connects")
    quiet_cancelled_connects()
    quiet_cancelled_connects()  # once per loop: a second store on it adds nothing

    def quieted() -> bool:
        return any("cancelled database connect" in r.getMessage() for r in caplog.records)

    tried = await _cancelled_connects_until(postgres_url, quieted)
    assert quieted(), f"no cancelled connect of {tried} left its report"
    assert not _leaks(reported), "the report went past the filter"
    lines = [r for r in caplog.records if "cancelled database connect" in r.getMessage()]
    assert all(r.levelno == logging.DEBUG and not r.exc_info for r in lines)

    other = {"message": "something else", "exception": ConnectionError("unexpected connection_lost() call")}
    asyncio.get_running_loop().call_exception_handler(other)
    assert reported == [other], "a report that is not a collected connect's goes on as it was"
