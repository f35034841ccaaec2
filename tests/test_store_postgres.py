"""The PostgreSQL store's own guarantees, on a real PostgreSQL (a database per test).

Two stores on one database stand for two processes: each has its own pool and
nothing in memory in common, so only the database's row locks order them.
Faults never stop the shared server: connections are ended with
``pg_terminate_backend``; waits are on what PostgreSQL reports
(``pg_stat_activity``), bounded, never on sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import grpc
import postgres_dbs
import pytest
from electric_server.core.errors import ApiError
from electric_server.store.base import (
    DatabaseUnavailable,
    EntityRecord,
    Idempotency,
    Mutation,
    NewEvent,
    Ref,
    Write,
    WriteContext,
    WriteOutcome,
)
from electric_server.store.committer import MAX_ATTEMPTS
from electric_server.store.postgres import PostgresStore
from electric_server.store.postgres.schema import SCHEMA_VERSION
from helpers import error_info, lock_waiter
from test_store import Refused, check_stream, committed, note, refuse, spawn

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb

if TYPE_CHECKING:
    from conftest import ServerProcess, StartServer

pytestmark = pytest.mark.anyio


async def test_racing_spawns_end_as_one_spawn_and_entity_exists(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    """FOR UPDATE locks no missing row: the inserts race, and the losers are decided again on the
    winner's row (ENTITY_EXISTS), never an internal error."""
    ref: Ref = ("agent", "racing")
    outcomes = await asyncio.gather(
        *(stores[i % 2].write(spawn(ref)) for i in range(16)), return_exceptions=True
    )
    assert sum(isinstance(o, WriteOutcome) for o in outcomes) == 1, outcomes
    refused = [o for o in outcomes if not isinstance(o, WriteOutcome)]
    assert all(isinstance(o, ApiError) and o.reason == "ENTITY_EXISTS" for o in refused), refused
    assert len(await check_stream(stores[0], ref)) == 1


async def test_racing_idempotent_spawns_replay_the_one_that_committed(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    ref: Ref = ("agent", "retried")
    idem = Idempotency("spawn-1", b"request")

    def retry(i: int) -> Any:
        write = Write(ref, spawn(ref).decide, idem, lambda commit: f"txid {commit.txid}".encode())
        return stores[i % 2].write(write)

    outcomes = await asyncio.gather(*(retry(i) for i in range(16)))
    assert [o.replayed for o in outcomes].count(False) == 1
    assert len({o.response for o in outcomes}) == 1, "every retry answers what the first did"
    assert len(await check_stream(stores[1], ref)) == 1


async def test_a_retry_committed_while_the_write_waits_for_the_lock_is_replayed(
    stores: tuple[PostgresStore, PostgresStore], admin: Any
) -> None:
    """The keys are read after the lock, by a statement whose snapshot is taken then: a key that a
    racing retry stored while the write waited for the row (here one holding the row's lock
    only, as a write that changes no row does) is replayed, not applied a second time."""
    store = stores[0]
    ref: Ref = ("agent", "waited")
    committed(await store.write(spawn(ref)))
    holder = admin.transaction()
    await holder.start()
    await admin.execute("SELECT 1 FROM entities WHERE type = 'agent' AND id = 'waited' FOR UPDATE")
    retry = Write(ref, note(ref).decide, Idempotency("note-1", b"request"), lambda commit: b"second")
    write = asyncio.ensure_future(store.write(retry))
    await lock_waiter(admin)
    await admin.execute(
        "INSERT INTO idempotency (type, id, key, request_hash, response, created_at) "
        "VALUES ('agent', 'waited', 'note-1', 'request', 'first', 0)"
    )
    await holder.commit()
    with anyio.fail_after(10):
        outcome = await write
    assert outcome.replayed
    assert outcome.response == b"first"
    assert len(await check_stream(store, ref)) == 1, "the note was not appended"


async def test_two_processes_writing_one_entity_keep_offsets_gap_free_and_txids_increasing(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    refs: list[Ref] = [("agent", f"e{i}") for i in range(4)]
    for outcome in await stores[0].write_many([spawn(r) for r in refs]):
        committed(outcome)
    # Batches naming the entities in opposite orders, from both stores at once: the rows are
    # locked in (type, id) order, so they never deadlock, and each is decided on its locked row.
    batches = [
        stores[i % 2].write_many([note(r, str(i)) for r in (refs if i % 3 else refs[::-1])])
        for i in range(24)
    ]
    for outcomes in await asyncio.gather(*batches):
        for outcome in outcomes:
            committed(outcome)
    for ref in refs:
        assert len(await check_stream(stores[0], ref)) == 1 + 24


async def test_a_deadlock_reruns_the_batch(postgres_url: str, admin: Any) -> None:
    """A row locked by another transaction that then waits for the batch's row: PostgreSQL ends
    one side with a deadlock error; when it is the batch, the batch runs again and commits."""
    await admin.execute(f"ALTER DATABASE \"{postgres_url.rsplit('/', 1)[1]}\" SET deadlock_timeout = '20ms'")
    await admin.execute("SET deadlock_timeout = '10s'")  # so the store's backend is the one to give up
    store = PostgresStore(postgres_url)
    await store.open()
    try:
        a, b = ("t", "a"), ("t", "b")
        for outcome in await store.write_many([spawn(a), spawn(b)]):
            committed(outcome)
        holder = admin.transaction()
        await holder.start()
        await admin.execute("SELECT 1 FROM entities WHERE type = 't' AND id = 'b' FOR UPDATE")
        batch = asyncio.ensure_future(store.write_many([note(a), note(b)]))  # holds a, waits for b
        await lock_waiter(admin)
        await admin.execute("SELECT 1 FROM entities WHERE type = 't' AND id = 'a' FOR UPDATE")
        await holder.commit()
        with anyio.fail_after(10):
            outcomes = await batch
        for outcome in outcomes:
            committed(outcome)
        # At least once; twice when the rerun locks `a` before the admin's transaction, woken by
        # the first one's end, has: the two then deadlock again, the same way (seen in CI).
        assert 1 <= store.batches_retried < MAX_ATTEMPTS
        await check_stream(store, a)
        await check_stream(store, b)
    finally:
        await store.close()


async def test_a_connection_ended_mid_write_fails_it_unavailable_and_the_next_write_succeeds(
    stores: tuple[PostgresStore, PostgresStore], admin: Any
) -> None:
    """The database is still there: its fault listeners (the server's health) are told nothing,
    once the probe the lost connection started has found it."""
    store = stores[0]
    told: list[object] = []
    store.subscribe_faults(told.append)
    ref: Ref = ("t", "a")
    committed(await store.write(spawn(ref)))
    holder = admin.transaction()
    await holder.start()
    await admin.execute("SELECT 1 FROM entities WHERE type = 't' AND id = 'a' FOR UPDATE")
    write = asyncio.ensure_future(store.write(note(ref, "lost")))
    assert await admin.fetchval("SELECT pg_terminate_backend($1)", await lock_waiter(admin))
    with anyio.fail_after(10), pytest.raises(DatabaseUnavailable, match="database connection failed"):
        await write
    await holder.rollback()
    probe = store.reachability.probe
    assert probe is not None, "the lost connection started a probe"
    with anyio.fail_after(20):
        await probe
    assert told == []
    committed(await store.write(note(ref, "kept")))
    assert [e.body for e in await store.read_events(ref, 1, 10)] == [b"kept"]
    await check_stream(store, ref)


def _socket_fds(ports: set[int]) -> list[int]:
    """This process's file descriptors of the loopback TCP connections from ``ports``."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) in ports:
            inodes.add(fields[9])
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # (one closed meanwhile)
            if os.readlink(f"/proc/self/fd/{fd}").removeprefix("socket:[").rstrip("]") in inodes:
                fds.append(int(fd))
    assert len(fds) == len(ports), (fds, ports)
    return fds


def _hold_until_closed(ports: set[int], timeout_s: float = 10.0) -> None:
    """Block (holding the caller's loop: its turns would read the sockets) until the peer's
    close has arrived on every connection from ``ports`` (POLLRDHUP; nothing is read): all the
    ended backend sent, its FATAL first, waits in each socket."""
    poller = select.poll()
    waiting = set(_socket_fds(ports))
    for fd in waiting:
        poller.register(fd, select.POLLRDHUP)
    deadline = time.monotonic() + timeout_s
    while waiting:
        left_ms = (deadline - time.monotonic()) * 1000
        assert left_ms > 0, "the ended backends' connections did not close"
        for fd, _ in poller.poll(left_ms):
            poller.unregister(fd)
            waiting.discard(fd)


async def test_a_pooled_connection_ended_while_idle_fails_its_next_call_unavailable(
    stores: tuple[PostgresStore, PostgresStore], admin: Any
) -> None:
    """A backend ended while its connection is idle in the pool (pg_terminate_backend, DROP
    DATABASE ... WITH (FORCE), a failover) sends a FATAL, then closes. asyncpg, idle, takes the
    FATAL for a protocol error, and refuses every operation ("cannot switch to state 11; another
    operation (2) is in progress", InternalClientError) until it reads the close a turn of the
    loop later. A call that takes the connection in that turn fails DatabaseUnavailable, like
    any call that loses its connection: not an error no caller knows (the reaper's purge died of
    it, and a server's stop with it)."""
    store = stores[0]
    pooled = await admin.fetch(
        "SELECT pid, client_port FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = 'electric' AND state = 'idle' AND pid <> pg_backend_pid()"
    )
    assert pooled, "the stores hold idle pooled connections"
    # Ended from another connection while this loop is held: no turn of it reads the FATAL
    # before both the FATAL and the close wait in every socket.
    ended = postgres_dbs.run(lambda: _terminate([int(r["pid"]) for r in pooled]))
    assert ended == len(pooled)
    _hold_until_closed({int(r["client_port"]) for r in pooled})
    await asyncio.sleep(0)  # this turn reads each FATAL (asyncpg's protocol: error-consume) ...
    await asyncio.sleep(0)  # ... and this one runs first, before the turn's reads of the close
    with pytest.raises(DatabaseUnavailable, match="database connection failed") as failed:
        await store.purge_idempotency(60_000)
    assert isinstance(failed.value.__cause__, asyncpg.InternalClientError), failed.value.__cause__
    with anyio.fail_after(20):
        while True:  # the pool opens new connections for the ended ones
            with contextlib.suppress(DatabaseUnavailable):
                assert await store.purge_idempotency(60_000) == 0
                break
    committed(await store.write(spawn(("t", "after"))))


async def _terminate(pids: list[int]) -> int:
    conn = await postgres_dbs.admin_connection()
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM unnest($1::int[]) p WHERE pg_terminate_backend(p)", pids
            )
        )
    finally:
        await conn.close()


class _Relay:
    """One proxied connection's state: whether the cut message's answer is awaited."""

    def __init__(self) -> None:
        self.answer_awaited = False
        self.scope: anyio.CancelScope | None = None


class CommitCutter:
    """A loopback proxy to PostgreSQL that, once armed, passes the next COMMIT (the next message
    holding ``marker``) on and cuts the client's connection when PostgreSQL's answer comes, which
    it drops: a commit whose outcome the store cannot know, made before the store can learn it
    was cut (so before it could end the backend to find out). With ``forward`` False it cuts
    before the message reaches PostgreSQL."""

    def __init__(self, target: tuple[str, int], forward: bool = True) -> None:
        self.target = target
        self.forward = forward
        self.marker = b"COMMIT"
        self.armed = False
        self.cut = asyncio.Event()
        self.connections: list[asyncio.Task[None]] = []

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool, relay: _Relay
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                if not upstream and relay.answer_awaited:
                    self.cut.set()  # PostgreSQL's answer to the cut message, dropped: it has committed
                    break
                cutting = upstream and self.armed and self.marker in data
                if cutting and not self.forward:
                    self.armed = False  # never reaches PostgreSQL: the transaction rolls back
                    self.cut.set()
                    break
                writer.write(data)
                await writer.drain()
                if cutting:
                    self.armed = False  # passed on whole: cut when its answer comes
                    relay.answer_awaited = True
        assert relay.scope is not None
        relay.scope.cancel()

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(*self.target)
        relay = _Relay()
        try:
            async with anyio.create_task_group() as tg:
                relay.scope = tg.cancel_scope
                tg.start_soon(self._pipe, client_reader, server_writer, True, relay)
                tg.start_soon(self._pipe, server_reader, client_writer, False, relay)
        finally:
            client_writer.transport.abort()  # the store sees the connection end, not an answer
            server_writer.close()
            with contextlib.suppress(ConnectionError):
                await server_writer.wait_closed()

    def handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections.append(asyncio.ensure_future(self._relay(client_reader, client_writer)))


@contextlib.asynccontextmanager
async def behind_a_cutter(
    postgres_url: str, reached: bool = True
) -> AsyncIterator[tuple[PostgresStore, CommitCutter]]:
    """An open store whose connections pass through a ``CommitCutter`` (``reached``: a cut COMMIT
    still reaches PostgreSQL, which commits; else it never does)."""
    parts = urllib.parse.urlsplit(postgres_url)
    cutter = CommitCutter((parts.hostname or "127.0.0.1", parts.port or 5432), forward=reached)
    proxy = await asyncio.start_server(cutter.handle, "127.0.0.1", 0)
    port = proxy.sockets[0].getsockname()[1]
    store = PostgresStore(
        urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}"))
    )
    await store.open()
    try:
        yield store, cutter
    finally:
        await store.close()
        proxy.close()
        await asyncio.gather(*cutter.connections)


@pytest.mark.parametrize("reached", [True, False], ids=["commit reached", "commit lost"])
async def test_a_connection_lost_in_commit_is_unavailable_and_the_retry_finds_the_commit(
    postgres_url: str, reached: bool
) -> None:
    """Lost during COMMIT, the outcome is unknown to the store: UNAVAILABLE, never an acknowledgement
    nor a lost write; the retry with the same idempotency key replays what did commit, or applies
    once what did not. (A batch of two: a lone write has no COMMIT, test_pg_one_write.py.)"""
    async with behind_a_cutter(postgres_url, reached) as (store, cutter):
        ref, other = ("t", "cut"), ("t", "other")
        for outcome in await store.write_many([spawn(ref), spawn(other)]):
            committed(outcome)
        write = Write(ref, note(ref, "once").decide, Idempotency("note-1", b"request"), lambda c: b"noted")
        cutter.armed = True
        with anyio.fail_after(10), pytest.raises(DatabaseUnavailable, match="during COMMIT"):
            await store.write_many([write, note(other)])
        assert cutter.cut.is_set()
        retried = await store.write(write)
        assert (retried.replayed, retried.response) == (reached, b"noted")
        assert [e.body for e in await store.read_events(ref, 1, 10)] == [b"once"]


async def test_a_database_migrated_by_a_newer_electric_is_refused(postgres_url: str, admin: Any) -> None:
    await admin.execute("INSERT INTO electric_schema (version) VALUES ($1)", SCHEMA_VERSION + 1)
    store = PostgresStore(postgres_url)
    with pytest.raises(DatabaseUnavailable, match=f"version {SCHEMA_VERSION + 1}, newer than this"):
        await store.open()


async def test_an_unreachable_database_is_refused_without_its_password() -> None:
    with socket_closed() as port:
        store = PostgresStore(f"postgresql://electric:s3cret@127.0.0.1:{port}/electric")
        with pytest.raises(DatabaseUnavailable) as refused:
            await store.open()
    assert "cannot open the database postgresql://electric:***@127.0.0.1" in str(refused.value)
    assert "s3cret" not in str(refused.value)
    assert "s3cret" not in repr(store)


@contextlib.contextmanager
def socket_closed() -> Iterator[int]:
    """A port on loopback that nothing listens on (bound, not listening, for the block)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


async def test_every_field_of_a_record_round_trips(stores: tuple[PostgresStore, PostgresStore]) -> None:
    ref: Ref = ("t", "fields")
    committed(await stores[0].write(spawn(ref)))

    def everything(current: EntityRecord | None, ctx: WriteContext) -> Mutation:
        assert current is not None
        changed = current.replace(
            lease_epoch=3, cancelled_messages=(5, 9), reload_pending=True, stopping_deadline_ms=2**40
        )
        return Mutation([NewEvent("note", "k", pb.OPERATION_UPDATE, b"\x00\xff")], changed)

    after = committed(await stores[0].write(Write(ref, everything))).commit
    assert after is not None
    assert await stores[1].get_entity(ref) == after.after
    assert (await stores[1].read_events(ref, 1, 1)) == list(after.events)


def electric(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "electric_sdk.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_server_on_an_unreachable_database_exits_2_with_one_line(tmp_path: Any) -> None:
    with socket_closed() as port:
        result = electric(
            "server", "--data", str(tmp_path), "--database", f"postgresql://u:pw@127.0.0.1:{port}/x"
        )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("electric server: cannot open the database postgresql://u:***@"), (
        result.stderr
    )
    assert ":pw@" not in result.stderr


def test_backup_of_a_database_points_to_pg_dump(tmp_path: Any) -> None:
    result = electric("backup", "--database", "postgresql://x/y", str(tmp_path / "out.db"))
    assert result.returncode == 2
    assert "pg_dump" in result.stderr
    assert not (tmp_path / "out.db").exists()


def test_verify_a_database(postgres_url: str) -> None:
    result = electric("verify", "--database", postgres_url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "verified 0 entities, 0 events: clean"


async def test_the_offline_tools_take_electric_database_url_unless_given_data(
    tmp_path: Any, postgres_url: str
) -> None:
    """As `server` does, `verify`, `export` and `backup` take $ELECTRIC_DATABASE_URL's database
    when neither --data nor --database is given (backup refuses it, pointing to pg_dump); a
    --data given wins over the environment."""
    store = PostgresStore(postgres_url)
    await store.open()
    try:
        committed(await store.write(spawn(("agent", "env"))))
    finally:
        await store.close()
    env = os.environ | {"ELECTRIC_DATABASE_URL": postgres_url}
    verified = electric("verify", env=env)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.strip() == "verified 1 entity, 1 event: clean"
    exported = electric("export", str(tmp_path / "all.jsonl"), env=env)
    assert exported.returncode == 0, exported.stderr
    assert "1 entity," in exported.stdout, exported.stdout
    given = electric("verify", "--data", str(tmp_path / "nothing"), env=env)
    assert given.returncode == 2, given.stdout
    assert "no electric database" in given.stderr, given.stderr
    backup = electric("backup", str(tmp_path / "out.db"), env=env)
    assert backup.returncode == 2, backup.stderr
    assert "pg_dump" in backup.stderr, backup.stderr
    assert "$ELECTRIC_DATABASE_URL" in backup.stderr, backup.stderr
    assert not (tmp_path / "out.db").exists()


def test_without_asyncpg_the_server_says_what_to_install(tmp_path: Any) -> None:
    """The driver is an extra: without it, one line naming it (run with asyncpg hidden)."""
    hide = (
        "import sys; sys.modules['asyncpg'] = None; "
        "from electric_sdk.cli.main import main; "
        f"sys.exit(main(['server', '--data', {str(tmp_path)!r}, '--database', 'postgresql://x/y']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", hide], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2, result.stderr
    assert "pip install 'electric-sdk[postgres]'" in result.stderr


async def test_a_server_whose_database_connection_is_lost_answers_unavailable(
    postgres_url: str, start_server: StartServer, admin: Any
) -> None:
    """End to end: a SignalEntity whose connection PostgreSQL ends is UNAVAILABLE
    (DATABASE_UNAVAILABLE, retryable) at once, and the retry succeeds."""
    server = await start_server(database_url=postgres_url)
    ref = pb.EntityRef(type="agent", id="a")
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref))
        holder = admin.transaction()
        await holder.start()
        await admin.execute("SELECT 1 FROM entities WHERE type = 'agent' AND id = 'a' FOR UPDATE")
        request = api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGUSR, reason="r", idempotency_key="k")
        call = asyncio.ensure_future(stub.SignalEntity(request))
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", await lock_waiter(admin))
        with anyio.fail_after(10), pytest.raises(grpc.aio.AioRpcError) as refused:
            await call
        await holder.rollback()
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_info(refused.value).reason == "DATABASE_UNAVAILABLE"
        signalled = await stub.SignalEntity(request)
        assert signalled.new_state == pb.STATE_SPAWNING
        events = await stub.ReadEvents(api.ReadEventsRequest(ref=ref, from_offset=0))
        assert [e.type for e in events.events] == ["state", "signal"]


async def test_concurrent_lone_writes_share_batches_each_its_own_write(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    """While every connection runs a batch, lone writes queue for the next: fewer transactions,
    each write still decided on its own (a refusal spares the others) with its own txid."""
    store = stores[0]
    refs: list[Ref] = [("agent", f"e{i}") for i in range(20)]
    for outcome in await store.write_many([spawn(r) for r in refs]):
        committed(outcome)
    batches = store.batches_committed
    writes = [note(refs[i % len(refs)], str(i)) for i in range(200)]
    results = await asyncio.gather(
        *(store.write(w) for w in writes), store.write(Write(refs[0], refuse)), return_exceptions=True
    )
    assert isinstance(results[-1], Refused)
    txids = [committed(o).commit.txid for o in results[:-1]]  # type: ignore[union-attr]
    assert len(set(txids)) == 200
    assert store.batches_committed - batches < 50, "200 concurrent writes share transactions"
    for ref in refs:
        assert len(await check_stream(store, ref)) == 1 + 10


async def test_replicas_purging_keys_at_once_skip_each_others_rows_and_never_wait(
    stores: tuple[PostgresStore, PostgresStore], admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The idempotency purge claims its rows with SKIP LOCKED, in slices, judged by the database's
    clock: a key another transaction holds is left for a later purge instead of waited on, and
    two replicas purging at once forget each key once between them."""
    import electric_server.store.postgres.store as postgres_module

    monkeypatch.setattr(postgres_module, "PURGE_SLICE", 3)
    ref: Ref = ("agent", "keys")
    committed(await stores[0].write(spawn(ref)))
    for i in range(12):
        write = note(ref, str(i))
        committed(
            await stores[i % 2].write(Write(ref, write.decide, Idempotency(f"k{i}", b"h"), lambda _c: b"r"))
        )
    assert await admin.fetchval("SELECT count(*) FROM idempotency") == 12
    assert await stores[0].purge_idempotency(60_000) == 0  # none is a minute old by PostgreSQL's clock
    async with admin.transaction():
        await admin.execute("SELECT FROM idempotency WHERE key = 'k0' FOR UPDATE")
        with anyio.fail_after(10):  # a purge that waited on the lock would wait until the rollback
            purged = await asyncio.gather(*(s.purge_idempotency(-1000) for s in stores))
        assert sum(purged) == 11, purged
    assert await stores[1].purge_idempotency(-1000) == 1  # the lock is gone: k0 too
    assert await admin.fetchval("SELECT count(*) FROM idempotency") == 0


def test_replicas_share_a_directory_and_a_given_data_dir_beats_the_environment(
    tmp_path: Path, postgres_url: str, server_process: Callable[..., ServerProcess]
) -> None:
    """A replica on PostgreSQL keeps nothing in a data directory: two started in one directory
    both serve (the default `.electric`'s lock used to refuse the second), and none is created.
    And `server`, like the offline tools, takes $ELECTRIC_DATABASE_URL only when given no
    --data: `make run`, which names its data directory, stays on SQLite with it set."""
    env = os.environ | {"ELECTRIC_DATABASE_URL": postgres_url}
    first = server_process(data=False, cwd=tmp_path, env=env)
    second = server_process(data=False, cwd=tmp_path, env=env)
    assert first.address != second.address
    assert all("(database: postgresql://" in "".join(s.lines) for s in (first, second))
    assert not (tmp_path / ".electric").exists()
    lite = server_process(tmp_path / "lite", cwd=tmp_path, env=env)
    assert "(data: " in "".join(lite.lines), lite.lines
    assert (tmp_path / "lite" / "electric.db").exists()
