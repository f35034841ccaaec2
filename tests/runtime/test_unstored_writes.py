"""A worker's write the server could not store is sent again, with its request id, until stored.

A real server on a real PostgreSQL (TestServer, its own thread) and a real Worker on the test's
loop. The fault is PostgreSQL's own: the test holds the entity's row lock so the worker's write
waits in the database, then ends the backend that waits (``pg_terminate_backend``): the server
answers ``DATABASE_UNAVAILABLE``, the outcome of a cut-off statement being unknown to it. The
shared PostgreSQL server is never stopped.
"""

from __future__ import annotations

import logging

import anyio
import asyncpg
import grpc
import pytest
from electric_server.core.errors import storage_error
from electric_server.store.base import DatabaseUnavailable, DiskFull, StorageFailed, StoreBusy
from helpers import lock_waiter

from electric_sdk import AsyncClient
from electric_sdk.durable_state import STEP_EVENT
from electric_sdk.errors import RETRYABLE_WRITE_REASONS
from electric_sdk.runtime import App, Context, Message
from electric_sdk.testing import TestServer

from .rt_support import COMPLETED, on_log, run_status, running_worker, until

pytestmark = pytest.mark.anyio

TIMEOUT_S = 20.0


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_step_record_cut_off_in_the_database_is_sent_again_and_stored_once(
    electric: TestServer, client: AsyncClient, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = App(code_version="test")
    inside = anyio.Event()
    go_on = anyio.Event()

    async def tool() -> str:
        inside.set()
        await go_on.wait()
        return "done"

    @app.entity("tooled", idle_timeout="60s")
    async def tooled(ctx: Context, message: Message) -> None:
        ctx.output.write(await ctx.step("tool", tool))

    ref = "tooled/t1"
    told = anyio.Event()  # the worker logs that it sends a write again
    admin = await asyncpg.connect(postgres_url)
    try:
        async with running_worker(app, electric.address):
            await client.spawn(ref)
            key = (await client.send(ref, "go")).key
            with anyio.fail_after(TIMEOUT_S):
                await inside.wait()
            caplog.set_level(logging.INFO, logger="electric.runtime")
            with on_log("could not store a write", told.set):
                async with admin.transaction():
                    await admin.execute("SELECT FROM entities WHERE type = 'tooled' AND id = 't1' FOR UPDATE")
                    go_on.set()  # the step's record goes out, and waits for the lock in the database
                    pid = await lock_waiter(admin)
                    assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
                    with anyio.fail_after(TIMEOUT_S):  # answered: the worker waits, then sends it again
                        await told.wait()
            # The lock is gone with the transaction: the write sent again is stored.
            done = await until(client, ref, run_status(COMPLETED, key))
            assert done.raw.run.output == "done"
    finally:
        await admin.close()
    unstored = [r.getMessage() for r in caplog.records if "could not store a write" in r.getMessage()]
    assert "DATABASE_UNAVAILABLE" in unstored[0]
    assert any("a write was stored after" in r.getMessage() for r in caplog.records)
    page = await client.events(ref, 0, 1000)
    steps = [e for e in page.events if e.type == STEP_EVENT and e.value["data"].get("name") == "tool"]
    assert [e.value["data"].get("outcome") for e in steps] == ["ok"], steps  # stored once


def test_every_storage_fault_the_server_answers_unavailable_is_one_a_worker_retries() -> None:
    """The server's storage faults (errors.storage_error) and the SDK's retryable reasons agree."""
    faults = [DatabaseUnavailable("x"), DiskFull("x"), StoreBusy("x"), StorageFailed("x")]
    reasons = {
        storage_error(f).reason for f in faults if storage_error(f).code is grpc.StatusCode.UNAVAILABLE
    }
    assert reasons == RETRYABLE_WRITE_REASONS
