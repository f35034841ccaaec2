"""PostgreSQL for the benches: a fresh database per bench, created and dropped around it.

The server is ``ELECTRIC_BENCH_POSTGRES_DSN`` (else ``ELECTRIC_TEST_POSTGRES_DSN``, else the
local one: user postgres on 127.0.0.1:5432). A bench that finds none says so and exits 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import urllib.parse
from collections.abc import Iterator

DSN = (
    os.environ.get("ELECTRIC_BENCH_POSTGRES_DSN")
    or os.environ.get("ELECTRIC_TEST_POSTGRES_DSN")
    or "postgresql://postgres@127.0.0.1:5432/postgres"
)


def with_database(dsn: str, name: str) -> str:
    parts = urllib.parse.urlsplit(dsn)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))


async def _admin(sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(with_database(DSN, "postgres"), timeout=10)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def recreate(name: str) -> str:
    """Database ``name`` dropped (if left over) and created empty again; its URL. For benches that
    rebuild it between rounds, where ``fresh_database`` (one per run, dropped after) does not fit."""
    await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await _admin(f'CREATE DATABASE "{name}"')
    return with_database(DSN, name)


@contextlib.contextmanager
def fresh_database(name: str) -> Iterator[str]:
    """A new, empty database ``name`` (dropped first if left over), its URL; dropped after."""
    name = f"{name}_{os.getpid()}"
    try:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    except OSError as exc:
        print(f"no PostgreSQL at {DSN} ({exc}); set ELECTRIC_BENCH_POSTGRES_DSN", file=sys.stderr)
        sys.exit(2)
    try:
        yield with_database(DSN, name)
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def settings() -> dict[str, str]:
    """What bounds the database's commits on this machine, for the results' info."""
    import asyncpg

    conn = await asyncpg.connect(DSN, timeout=10)
    try:
        names = (
            "server_version",
            "max_connections",
            "synchronous_commit",
            "fsync",
            "wal_sync_method",
            "commit_delay",
        )
        return {n: str(await conn.fetchval(f"SHOW {n}")) for n in names}
    finally:
        await conn.close()


def need_dbos(bench: str) -> None:
    """Exit 2, saying how to install it, unless DBOS Transact (the ``bench`` extra) is here."""
    try:
        import dbos  # noqa: F401
    except ImportError:
        print(f"{bench} needs DBOS Transact: .venv/bin/pip install -e '.[bench]'", file=sys.stderr)
        sys.exit(2)
