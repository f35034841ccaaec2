"""Assemble and run the control plane: its components in one lifetime, and the drain.

``ElectricServer`` is what ``electric server`` and ``electric_sdk.testing``
run. Its components (the store, the watches, the reaper, the runtime, the
doors; each an async context manager that owns its tasks, lifetime.py) are
entered by ``start`` in one exit stack: one that refuses to start unwinds
exactly what started before it, in reverse. ``stop`` drains, then is the same
unwind: the one shutdown order. ``serve`` adds process signal handling: the
first SIGTERM or SIGINT drains (health NOT_SERVING, watches ended so clients
reconnect elsewhere, in-flight calls finish within the drain grace, the store
is flushed) and the process exits 0; a second signal exits at once.

Health follows the store: while the disk is full, or a PostgreSQL database
takes no writes (read-only), the readiness of writes (``WRITES_HEALTH_NAME``)
is NOT_SERVING and everything else SERVING; while a PostgreSQL database
cannot be reached, every service is NOT_SERVING (and SERVING again once it
answers); if the
store fails for good, every service turns NOT_SERVING and ``serve`` drains
and raises the failure (the CLI exits 74, or 65 for damage).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2
from starlette.types import ASGIApp

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import runtime_service_pb2_grpc as rt_grpc
from electric_sdk._signals import drain_on_signals
from electric_sdk.listen import is_loopback, listen_host

from . import settings
from .a2a import check_a2a
from .clock import SYSTEM_CLOCK, Clock
from .config_error import ConfigError
from .core.auth import TokenTable
from .core.caps import Caps
from .core.cascade import Cascade
from .core.errors import ApiError, storage_error
from .core.reaper import Reaper
from .core.service import EntityService
from .core.validation import reserved_types
from .core.watch import Watches
from .fastpaths import forced_fallbacks
from .fastpaths.acceptors import Acceptors
from .grpc.door import GrpcDoor
from .grpc.health_reflection import Health, add_health_and_reflection, tool_hint
from .http.door import HttpDoor, check_cors_origins
from .http.streams import EntityStreams
from .lifetime import TaskGroup, TasksCrashed
from .log_replica import new_replica_id, replica_ended, tag_logs
from .metrics import ServerMetrics
from .runtime.connect import RuntimeService
from .runtime.hosting import Runtime
from .store.base import DatabaseUnavailable, DiskFull, StorageFault, Store, WritesRefused
from .store.database_url import is_database_url, redacted
from .store.sqlite import SQLiteStore
from .tools.datadir import DataDirLock, database_path
from .tools.verify import Report, verify

log = logging.getLogger("electric.server")

SERVICE_NAME = api.DESCRIPTOR.services_by_name["EntityService"].full_name
RUNTIME_SERVICE_NAME = rt.DESCRIPTOR.services_by_name["RuntimeService"].full_name
# The readiness of writes, for grpc.health.v1: NOT_SERVING while the disk is full or the database
# is read-only (reads go on).
WRITES_HEALTH_NAME = "electric.v1.writes"


@dataclass
class ServerConfig:
    """What a server runs with: one field per setting of settings.py, which holds each one's
    default, range (checked by ``settings.check`` when the server is built), flag and help."""

    listen: str = settings.LISTEN.value
    data_dir: Path = settings.DATA_DIR.value
    tokens_file: Path | None = settings.TOKENS_FILE.value
    tls_cert: Path | None = settings.TLS_CERT.value
    tls_key: Path | None = settings.TLS_KEY.value
    insecure: bool = settings.INSECURE.value
    drain_grace_s: float = settings.DRAIN_GRACE.value
    synchronous: str = settings.SYNCHRONOUS.value
    commit_delay_ms: float = settings.COMMIT_DELAY.value
    acceptors_per_method: int = settings.ACCEPTORS.value
    idempotency_retention_ms: int = settings.IDEMPOTENCY_RETENTION.value
    watch_queue_limit: int = settings.WATCH_QUEUE_LIMIT.value
    watch_bandwidth: int = settings.WATCH_BANDWIDTH.value
    watch_feed_events: int = settings.WATCH_FEED_EVENTS.value
    lease_ttl_ms: int = settings.LEASE_TTL.value
    heartbeat_interval_ms: int = settings.HEARTBEAT_INTERVAL.value
    accept_data_loss: bool = settings.ACCEPT_DATA_LOSS.value
    disk_full_retry_ms: int = settings.DISK_FULL_RETRY.value
    hello_timeout_ms: int = settings.HELLO_TIMEOUT.value
    settle_ms: int = settings.SETTLE.value
    upgrade_after_ms: int = settings.UPGRADE_AFTER.value
    poll_ms: int = settings.POLL.value
    max_streams: int = settings.MAX_STREAMS.value
    max_sessions: int = settings.MAX_SESSIONS.value
    allow_readable_tokens: bool = settings.ALLOW_READABLE_TOKENS.value
    database_url: str | None = settings.DATABASE_URL.value
    database_pool: int = settings.DATABASE_POOL.value
    database_timeout_ms: int = settings.DATABASE_TIMEOUT.value
    http: str | None = settings.HTTP.value
    sse_heartbeat_ms: int = settings.SSE_HEARTBEAT.value
    http_long_poll_ms: int = settings.HTTP_LONG_POLL.value
    cors_origins: tuple[str, ...] = settings.CORS_ORIGINS.value
    mcp: bool = settings.MCP.value
    a2a: bool = settings.A2A.value
    # Not a setting but a test hook: what time it is for grace deadlines, writes and worker
    # sessions (clock.py); a test's manual clock makes a 30 s grace pass at once. SQLite only: on
    # PostgreSQL the database's clock judges.
    clock: Clock = SYSTEM_CLOCK

    @property
    def database(self) -> Path:
        return database_path(self.data_dir)

    @property
    def where(self) -> str:
        """Where the store is, for a banner (a database URL without its password)."""
        if self.database_url:
            return f"database: {redacted(self.database_url)}"
        return f"data: {self.data_dir}"


def _store(config: ServerConfig, *, feed: bool = True) -> Store:
    """The store the configuration names: PostgreSQL for a database URL, else the data directory's
    SQLite. ``feed``: commits of other replicas reach it (a server's; not `electric verify`'s)."""
    if config.database_url is None:
        return SQLiteStore(
            config.database,
            synchronous=config.synchronous,
            commit_delay_ms=config.commit_delay_ms,
            accept_data_loss=config.accept_data_loss,
            disk_full_retry_ms=config.disk_full_retry_ms,
            clock=config.clock,
        )
    if not is_database_url(config.database_url):
        raise ConfigError(f"--database must be a postgresql:// URL, not {redacted(config.database_url)!r}")
    try:
        from .store.postgres import PostgresStore
    except ImportError as exc:
        raise ConfigError(
            "a PostgreSQL database needs the asyncpg driver: pip install 'electric-sdk[postgres]'"
        ) from exc
    return PostgresStore(
        config.database_url,
        pool_size=config.database_pool,
        feed=feed,
        timeout_s=config.database_timeout_ms / 1000,
    )


def _host(listen: str, flag: str = "--listen") -> str:
    try:
        return listen_host(listen, flag)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


class ElectricServer:
    def __init__(self, config: ServerConfig, store: Store | None = None) -> None:
        self.config = config
        # This process in the session book, named by `electric workers`, on every log line it writes.
        self.replica = new_replica_id()
        host = _host(config.listen)
        if bool(config.tls_cert) != bool(config.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together")
        settings.check(config)  # every range (settings.py)
        if config.database_url and config.clock is not SYSTEM_CLOCK:
            raise ConfigError(
                "a manual clock is for the SQLite store: on PostgreSQL the database's clock judges "
                "every write and lease"
            )
        try:
            self.forced_fallbacks = forced_fallbacks()
        except ValueError as exc:  # a typo must not quietly run without the fallback it meant
            raise ConfigError(str(exc)) from exc
        self._tls: tuple[bytes, bytes] | None = None
        if config.tls_cert and config.tls_key:
            try:
                self._tls = (config.tls_key.read_bytes(), config.tls_cert.read_bytes())
            except OSError as exc:
                raise ConfigError(f"cannot read the TLS certificate or key: {exc}") from exc
        check_cors_origins(config.cors_origins, config.http)
        if config.mcp and not config.http:
            raise ConfigError("--mcp needs --http: the MCP face is served on the HTTP door's /mcp")
        check_a2a(config.a2a, config.http)
        self.tokens = (
            TokenTable.load(config.tokens_file, config.allow_readable_tokens) if config.tokens_file else None
        )
        for flag, address in (("", host), ("--http ", _host(config.http, "--http") if config.http else None)):
            if (
                address is not None
                and self.tokens is None
                and not is_loopback(address)
                and not config.insecure
            ):
                raise ConfigError(
                    f"refusing to listen on non-loopback address {flag}{address!r} without --tokens; "
                    "pass --insecure to allow unauthenticated access from the network"
                )
        try:
            self.store = store or _store(config)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        self.health = Health()
        # Open streams and worker sessions per principal (caps.py), shared by both services.
        self.caps = Caps(config.max_streams, config.max_sessions)
        self.port = 0
        # The components, entered by start() in one exit stack: left in reverse by stop().
        self._lifetime: AsyncExitStack | None = None
        self._grpc: GrpcDoor | None = None
        self.http: HttpDoor | None = None
        self._draining = False
        self.acceptors: Acceptors | None = None
        # The live watches (core/watch.py), once started: what tests and operators count open watches by.
        self.watches: Watches | None = None
        self._reaper: Reaper | None = None
        self.cascade: Cascade | None = None
        self.metrics: ServerMetrics | None = None
        self._datadir_lock: DataDirLock | None = None
        # A failure of the store for good: the server must stop (see drain_on_failure).
        self.failure: StorageFault | None = None
        self._writes_fault: StorageFault | None = None  # while set, writes are refused (readiness)
        self._on_failure: list[asyncio.Event] = []
        # The health's updates as the store's faults come and go, applied in that order.
        self._health_updates = TaskGroup("the server's health")
        self._health_update: asyncio.Task[None] | None = None
        self._unsubscribe_faults: Callable[[], None] = lambda: None

    @property
    def address(self) -> str:
        host = _host(self.config.listen)
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    async def start(self) -> None:
        """Enter every component in one exit stack, in this order: the data directory's lock
        (datadir.py), the store, its faults followed by health, the watches, the reaper, the
        runtime, the metrics, the gRPC door (bound), the HTTP door (serving), then gRPC serves.
        A component that refuses to start unwinds exactly what started before it, in reverse, and
        its error is raised; ``stop`` is the same unwind, after the drain."""
        tag_logs(self.replica)  # from here, every line this start logs (and its tasks) names it
        async with AsyncExitStack() as stack:
            # Left last (by a failed start's unwind, or by stop's): the server is no longer live.
            stack.callback(replica_ended, self.replica)
            await self._enter_store(stack)
            entities = await self._enter_core(stack)
            await self._enter_doors(stack, entities)
            self._lifetime = stack.pop_all()
        if self._datadir_lock is not None:
            self._datadir_lock.listening_on(self.address)
        # The replica id is what `electric workers` names as each worker session's REPLICA.
        log.info(
            "electric server listening on %s (%s; replica %s)",
            self.address,
            self.config.where,
            self.replica,
        )
        if self.forced_fallbacks:
            log.warning(
                "fallbacks forced for: %s (slower; meant for tests)", ", ".join(sorted(self.forced_fallbacks))
            )

    async def _enter_store(self, stack: AsyncExitStack) -> None:
        """The store, behind the data directory's lock, and its faults followed by health.

        On PostgreSQL there is no data directory: the lock keeps a SQLite file to one writer,
        and replicas share their database by design, so any number may run from one directory
        (the lock of its default ``.electric`` used to stop a second replica started there)."""
        if not self.config.database_url:
            lock = DataDirLock.acquire(self.config.data_dir, "electric server")
            stack.callback(lock.release)
            self._datadir_lock = lock
        await stack.enter_async_context(self.store)  # DamagedStore, or another StorageFault, refuses
        if reserved := await reserved_types(self.store):  # made before "." was reserved (docs/a2a.md)
            log.warning("entity types starting with '.' are reserved, no new one is made: %s", reserved)
        self._health_updates = await stack.enter_async_context(TaskGroup("the server's health"))
        self._unsubscribe_faults = self.store.subscribe_faults(self._on_store_fault)
        stack.callback(self._stop_following_store)

    async def _enter_core(self, stack: AsyncExitStack) -> EntityService:
        """The watches, the reaper, the runtime and the metrics; the entity service they make."""
        config = self.config
        self.watches = watches = await stack.enter_async_context(
            Watches(self.store, config.watch_queue_limit, config.watch_bandwidth, config.watch_feed_events)
        )
        self._reaper = reaper = await stack.enter_async_context(
            Reaper(
                self.store, config.idempotency_retention_ms, config.settle_ms, config.poll_ms, config.clock
            )
        )
        # A parent's SIGTERM and SIGKILL reach its children (core/cascade.py).
        self.cascade = await stack.enter_async_context(Cascade(self.store, config.poll_ms))
        self.runtime = await stack.enter_async_context(
            Runtime(
                self.store,
                config.lease_ttl_ms,
                # A short --lease-ttl asks for heartbeats often enough to keep it.
                min(config.heartbeat_interval_ms, max(1, config.lease_ttl_ms // 3)),
                config.settle_ms,
                config.poll_ms,
                config.clock,
                config.upgrade_after_ms,
                self.replica,
            )
        )
        entities = EntityService(self.store, watches, self.runtime, self.caps)
        self.metrics = metrics = ServerMetrics(self.store)
        stack.callback(metrics.close)
        metrics.follow(watches, self.runtime, reaper)
        entities.signal_rejected = metrics.signal_rejected
        return entities

    async def _enter_doors(self, stack: AsyncExitStack, entities: EntityService) -> None:
        """The gRPC door's port, then the HTTP door; then gRPC serves, and health says SERVING."""
        config = self.config
        door = GrpcDoor(
            config.listen, tls=self._tls, tokens=self.tokens, acceptors_per_method=config.acceptors_per_method
        )
        self._grpc = await stack.enter_async_context(door)
        self.port, self.acceptors = door.port, door.acceptors
        # The optional faces' gRPC services (A2A's): each adds its own, and names it for reflection.
        grpc_services: list[Callable[[grpc.aio.Server], str]] = []
        if config.http:
            streams = await stack.enter_async_context(
                EntityStreams(
                    entities,
                    self._draining_now,
                    heartbeat_s=config.sse_heartbeat_ms / 1000,
                    long_poll_s=config.http_long_poll_ms / 1000,
                )
            )
            faces: list[Callable[[ASGIApp], ASGIApp]] = []  # in front of the door's routes, inside its CORS
            if config.a2a:
                from .a2a.face import A2AFace  # the [a2a] extra: imported only with --a2a

                def a2a(routes: ASGIApp) -> ASGIApp:
                    face = A2AFace(routes, entities, self.tokens, _host(config.listen), door.port)
                    grpc_services.append(face.serve_grpc)
                    return face

                faces.append(a2a)
            http = HttpDoor(
                entities,
                self.tokens,
                self.readiness,
                config.http,
                grace_s=config.drain_grace_s,
                tls=(config.tls_cert, config.tls_key) if config.tls_cert and config.tls_key else None,
                metrics=self.metrics.render if self.metrics is not None else None,
                cors_origins=config.cors_origins,
                streams=streams,
                mcp=config.mcp,
                faces=faces,
            )
            self.http = await stack.enter_async_context(http)
        runtime = RuntimeService(self.runtime, self.caps, config.hello_timeout_ms)

        def services(server: grpc.aio.Server) -> None:
            api_grpc.add_EntityServiceServicer_to_server(entities, server)
            rt_grpc.add_RuntimeServiceServicer_to_server(runtime, server)
            faces = [add(server) for add in grpc_services]
            add_health_and_reflection(server, self.health, (SERVICE_NAME, *faces))

        await door.serve(services)
        # Writes refused from the start (a full disk at the store's opening): reads serve, writes do not.
        refused = health_pb2.HealthCheckResponse.NOT_SERVING if self._writes_fault is not None else None
        await self._set_health(health_pb2.HealthCheckResponse.SERVING, refused)

    async def stop(self, grace: float | None = None) -> None:
        """Drain, then leave every component in reverse (``start``); safe to call more than once."""
        if self._lifetime is None:
            return
        tag_logs(self.replica)  # stop may run as a task of its own (electric_sdk.testing's portal)
        lifetime, self._lifetime = self._lifetime, None
        await self._drain(self.config.drain_grace_s if grace is None else grace)
        try:
            await lifetime.aclose()
        except TasksCrashed as last:
            # Each component left raises its own; the exit stack chains them (__context__).
            crashes: list[Exception] = []
            found: BaseException | None = last
            while found is not None:
                if isinstance(found, TasksCrashed):
                    crashes[:0] = found.exceptions
                found = found.__context__
            raise TasksCrashed(
                f"the server stopped, but {len(crashes)} of its tasks had crashed while it ran "
                "(a bug: each was logged with its traceback when it crashed)",
                crashes,
            ) from None
        log.info("electric server stopped")

    async def _drain(self, grace_s: float) -> None:
        """Every service NOT_SERVING, watches and worker sessions ended (their clients and workers
        reconnect elsewhere), and both doors closed to new calls: those in flight finish within
        ``grace_s``."""
        self._draining = True
        self._stop_following_store()
        await self._health_updates.wait()  # the store's last change lands first, then the drain's
        await self.health.enter_graceful_shutdown()
        assert self.watches is not None
        assert self._grpc is not None
        self.watches.drain()
        self.runtime.drain()  # workers' sessions end now, like watches: they reconnect elsewhere
        if self.http is not None:
            self.http.drain()  # uvicorn drains in its task beside gRPC, within the same grace
        await self._grpc.stop(grace_s)

    def _stop_following_store(self) -> None:
        unsubscribe, self._unsubscribe_faults = self._unsubscribe_faults, lambda: None
        unsubscribe()

    def readiness(self) -> ApiError | None:
        """Why the server should not be sent writes now (``/readyz``); None when it may."""
        if self._draining:
            return ApiError(grpc.StatusCode.UNAVAILABLE, "SERVER_DRAINING", "the server is shutting down")
        return storage_error(self._writes_fault) if self._writes_fault is not None else None

    def _draining_now(self) -> bool:
        return self._draining

    def tool_hint(self) -> list[str]:
        """The banner's lines for buf curl and grpcurl, for this server's address."""
        return tool_hint(self.address, self.config.tls_cert)

    def drain_on_failure(self, drain: asyncio.Event) -> None:
        """Set ``drain`` if the store fails for good; the caller then stops the server and
        raises ``failure``."""
        if self.failure is not None:
            drain.set()
        self._on_failure.append(drain)

    async def _set_health(
        self,
        status: health_pb2.HealthCheckResponse.ServingStatus.ValueType,
        writes: health_pb2.HealthCheckResponse.ServingStatus.ValueType | None = None,
    ) -> None:
        """Every service's health, and the writes' readiness (``writes``, else ``status`` too)."""
        for name in ("", SERVICE_NAME, RUNTIME_SERVICE_NAME):
            await self.health.set(name, status)
        await self.health.set(WRITES_HEALTH_NAME, status if writes is None else writes)

    def _on_store_fault(self, fault: StorageFault | None) -> None:
        """Writes stopped (a full disk: readiness only; a failure for good: every service,
        and the server must stop) or resumed."""
        self._writes_fault = fault
        if fault is not None and not isinstance(fault, (DiskFull, DatabaseUnavailable)):
            self.failure = fault
            for drain in self._on_failure:
                drain.set()
        previous = self._health_update
        self._health_update = self._health_updates.start_soon(self._follow_store(fault, previous))

    async def _follow_store(self, fault: StorageFault | None, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await previous  # in the order the store changed
        serving = health_pb2.HealthCheckResponse.SERVING
        if fault is None:
            await self._set_health(serving)
        elif isinstance(fault, (DiskFull, WritesRefused)):  # reads go on: only writes are not ready
            await self._set_health(serving, health_pb2.HealthCheckResponse.NOT_SERVING)
        elif isinstance(fault, DatabaseUnavailable):  # reads fail too, until the database is back
            await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        else:
            await self.health.enter_graceful_shutdown()  # every service NOT_SERVING: the server stops


def _usage_hint(server: ElectricServer) -> str:
    a = server.address
    auth = "bearer tokens required" if server.tokens else "no auth (loopback)"
    env = "" if a == settings.LISTEN.value else f"ELECTRIC_ADDRESS={a} "
    return "\n".join(
        [
            (
                f"  data:    {redacted(server.config.database_url)} (PostgreSQL, "
                f"{server.config.database_pool} connections)"
                if server.config.database_url
                else f"  data:    {server.config.database} (SQLite, WAL, synchronous={server.config.synchronous})"
            ),
            f"  auth:    {auth}; TLS {'on' if server.config.tls_cert else 'off'}",
            "  try, in another terminal (.venv/bin/electric when run from a checkout):",
            f"    {env}electric spawn my_agent/agent_1 --grace 5s",
            f"    {env}electric signal my_agent/agent_1 SIGUSR --payload '{{\"hello\": 1}}'",
            f"    {env}electric events my_agent/agent_1 --follow",
            f"    {env}electric kill my_agent/agent_1",
            f"    {env}electric watch",
            *server.tool_hint(),
            *(
                [
                    f"  http:    curl {server.http.address}/entities   (docs/http.md)",
                    f"  metrics: curl {server.http.address}/metrics   (docs/operations.md)",
                ]
                if server.http
                else []
            ),
            "  stop:    Ctrl-C drains and exits 0; a second Ctrl-C exits at once",
        ]
    )


# Python's default collector runs a young-generation pass every 700 net
# allocations, and a server allocates several tracked objects per call
# (futures, tasks, records): 7% of the event loop's time at 64 concurrent
# SignalEntity callers, 11% of the store's at 256 appenders. A pass every
# 5,000 takes about a millisecond and still bounds cyclic garbage to a few
# thousand objects; freezing what start-up allocated (modules, descriptors,
# the entity cache loaded at open) keeps the rarer full passes from walking it
# each time. Only the `electric server` process is tuned: an embedded server
# (tests, notebooks) leaves its host process's settings alone.
GC_YOUNG_THRESHOLD = 5_000


def tune_gc() -> None:
    """The collector settings of the `electric server` process (see above)."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


async def verify_data_dir(data_dir: Path) -> Report:
    """`electric verify`: open a data directory's store read-only, replay and compare it.

    Raises FileNotFoundError when the directory holds no database.
    """
    store = SQLiteStore(database_path(data_dir), readonly=True)
    await store.open()
    try:
        return await verify(store)
    finally:
        await store.close()


async def verify_database(url: str) -> Report:
    """`electric verify --database`: replay and compare a PostgreSQL database's streams.

    Raises ValueError for a URL that is not a database's (or without the driver), and
    DatabaseUnavailable where the database cannot be reached."""
    store = _store(ServerConfig(database_url=url, database_pool=1), feed=False)
    await store.open()
    try:
        return await verify(store)
    finally:
        await store.close()


# The exit code of a server that drained and stopped, though some of its tasks had crashed while it
# ran (BSD's sysexits.h EX_SOFTWARE: an internal software error; electric_sdk/cli/exit_codes.py).
EXIT_CRASHED = 70


async def serve(config: ServerConfig, *, ready: asyncio.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT; returns the exit code: 0, or ``EXIT_CRASHED`` when tasks had
    crashed. Raises the store's failure, if it failed for good (after draining), or its damage
    (refusing to start)."""
    server = ElectricServer(config)
    await server.start()
    tune_gc()
    with drain_on_signals(
        lambda name: log.info("received %s: draining (send it again to exit at once)", name)
    ) as drain:
        server.drain_on_failure(drain)
        print(f"electric server listening on {server.address}", flush=True)
        if server.http is not None:
            print(f"electric http listening on {server.http.address}", flush=True)
        print(_usage_hint(server), flush=True)
        if ready is not None:
            ready.set()
        await drain.wait()
        try:
            await server.stop()
        except TasksCrashed as crashed:
            if server.failure is not None:
                raise server.failure from crashed
            log.critical("%s: exiting %d", crashed.message, EXIT_CRASHED)
            return EXIT_CRASHED
    if server.failure is not None:
        raise server.failure
    return 0
