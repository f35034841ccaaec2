"""PostgreSQL databases for tests: one per test, cloned from a template the store migrated.

The server is ``ELECTRIC_TEST_POSTGRES_DSN`` (default: the local one, user
postgres, database test). With ``CI=true`` a test that needs it fails when
none answers; elsewhere it is skipped, saying why. Each session migrates one
template database with the store itself, then every test gets
``CREATE DATABASE ... TEMPLATE`` of it (a copy of a few pages) and drops it
after. Nothing here stops the shared server: fault tests end connections with
``pg_terminate_backend``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import pytest

DSN = os.environ.get("ELECTRIC_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")

T = TypeVar("T")


def run(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to its end on a loop of its own thread (the test's loop may be running)."""
    result: list[T] = []
    error: list[BaseException] = []

    def main() -> None:
        try:
            result.append(asyncio.run(make()))  # type: ignore[arg-type]
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=main, name="postgres-test-admin")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def with_database(dsn: str, name: str) -> str:
    parts = urllib.parse.urlsplit(dsn)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


async def admin_connection() -> Any:
    """A connection to the DSN's database, created first (from the maintenance database) if absent."""
    try:
        return await asyncpg.connect(DSN, timeout=5)
    except asyncpg.exceptions.InvalidCatalogNameError:
        conn = await asyncpg.connect(with_database(DSN, "postgres"), timeout=5)
        try:
            name = urllib.parse.urlsplit(DSN).path.lstrip("/")
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        return await asyncpg.connect(DSN, timeout=5)


class Databases:
    """The session's template and the databases cloned from it."""

    def __init__(self) -> None:
        self.prefix = f"electric_t{os.getpid()}"
        self.template = f"{self.prefix}_template"
        self._numbers = itertools.count()

    def open(self) -> None:
        async def setup() -> None:
            from electric_server.store.postgres import PostgresStore

            conn = await admin_connection()
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
                await conn.execute(f'CREATE DATABASE "{self.template}"')
            finally:
                await conn.close()
            store = PostgresStore(with_database(DSN, self.template), pool_size=1)
            await store.open()  # migrates it
            await store.close()

        run(setup)

    def clone(self) -> str:
        name = f"{self.prefix}_{next(self._numbers)}"

        async def create() -> None:
            conn = await admin_connection()
            try:
                await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
            finally:
                await conn.close()

        run(create)
        return with_database(DSN, name)

    def fresh(self, options: str) -> str:
        """A new empty database, made from template0 with ``options`` (e.g. another collation):
        the store migrates it itself when it opens. Dropped by ``drop``."""
        name = f"{self.prefix}_{next(self._numbers)}"
        run(lambda: _execute(f'CREATE DATABASE "{name}" TEMPLATE template0 {options}'))
        return with_database(DSN, name)

    def drop(self, url: str) -> None:
        name = urllib.parse.urlsplit(url).path.lstrip("/")
        run(lambda: _execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def close(self) -> None:
        run(lambda: _execute(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)'))


async def admin_execute(sql: str) -> None:
    """One statement on the DSN's database, e.g. a tablespace's CREATE or DROP."""
    await _execute(sql)


async def _execute(sql: str) -> None:
    conn = await admin_connection()
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def unavailable(reason: str) -> None:
    """No PostgreSQL for the tests: a failure in CI, where one must run; else a skip."""
    message = f"no PostgreSQL at {DSN} ({reason}); set ELECTRIC_TEST_POSTGRES_DSN"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)
