"""Assemble and run the control plane: store, services, reaper, drain.

``ElectricServer`` is what ``electric server`` and ``electric_sdk.testing``
run. ``serve`` adds process signal handling: the first SIGTERM or SIGINT
drains (health NOT_SERVING, watches ended so clients reconnect elsewhere,
in-flight calls finish within the drain grace, the store is flushed) and the
process exits 0; a second signal exits at once.

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
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import runtime_service_pb2_grpc as rt_grpc
from electric_sdk._signals import drain_on_signals
from electric_sdk.durations import format_ms
from electric_sdk.listen import is_loopback, listen_host

from .auth import AuthInterceptor, TokenTable
from .caps import DEFAULT_MAX_SESSIONS, DEFAULT_MAX_STREAMS, Caps
from .clock import SYSTEM_CLOCK, Clock
from .config_error import ConfigError
from .datadir import DataDirLock, database_path
from .errors import ApiError, storage_error
from .handlers import guard_server
from .health_reflection import Health, add_health_and_reflection, tool_hint
from .http_door import HttpDoor, check_cors_origins
from .http_streams import DEFAULT_HEARTBEAT_MS, DEFAULT_LONG_POLL_MS, EntityStreams
from .internals import forced_fallbacks
from .internals.acceptors import Acceptors, quiet_abandoned_writes
from .lease_sweep import DEFAULT_POLL_MS
from .metrics import ServerMetrics
from .reaper import Reaper
from .runtime_service import DEFAULT_SETTLE_MS, Runtime, RuntimeService
from .service import EntityService
from .store.base import DatabaseUnavailable, DiskFull, StorageFault, Store, WritesRefused
from .store.database_url import DEFAULT_DATABASE_POOL, DEFAULT_DATABASE_TIMEOUT_MS, is_database_url, redacted
from .store.sqlite import SQLiteStore
from .verify import Report, verify
from .watch import BANDWIDTH, FEED_EVENTS, Watches

log = logging.getLogger("electric.server")

SERVICE_NAME = api.DESCRIPTOR.services_by_name["EntityService"].full_name
RUNTIME_SERVICE_NAME = rt.DESCRIPTOR.services_by_name["RuntimeService"].full_name
# The readiness of writes, for grpc.health.v1: NOT_SERVING while the disk is full or the database
# is read-only (reads go on).
WRITES_HEALTH_NAME = "electric.v1.writes"
DEFAULT_LISTEN = "127.0.0.1:7700"
DAY_MS = 24 * 3600 * 1000
MAX_ACCEPTORS = 64
MAX_SETTLE_MS = 60_000
# --database-timeout's range: under 10 ms even a healthy database's commits would time out.
MIN_DATABASE_TIMEOUT_MS = 10
MAX_DATABASE_TIMEOUT_MS = 600_000


@dataclass
class ServerConfig:
    listen: str = DEFAULT_LISTEN
    data_dir: Path = Path(".electric")
    tokens_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # Allow a non-loopback address without tokens.
    insecure: bool = False
    # How long in-flight calls may run once draining starts.
    drain_grace_s: float = 10.0
    synchronous: str = "FULL"
    # Under concurrent load, a commit waits this long for more writes to share it (0: never).
    commit_delay_ms: float = 0.0
    # Calls accepted ahead per method, beyond grpc.aio's one (internals/acceptors.py); 0: grpc's own only.
    acceptors_per_method: int = 8
    idempotency_retention_ms: int = DAY_MS
    # Changes a watcher may fall behind before it is ended with WATCH_LAGGING.
    watch_queue_limit: int = 10_000
    # Bytes per second all event watches share once there are many (watch.py, BANDWIDTH).
    watch_bandwidth: int = BANDWIDTH
    # Events an entity's feed keeps for its watchers that are behind (watch.py, FEED_EVENTS).
    watch_feed_events: int = FEED_EVENTS
    # A worker that sends no heartbeat for this long loses its leases.
    lease_ttl_ms: int = 10_000
    # How often workers are asked to send a heartbeat.
    heartbeat_interval_ms: int = 3_000
    # Start on a damaged store, dropping what the damage cut off (docs/server.md, "Damage").
    accept_data_loss: bool = False
    # While the disk is full, how often the store tries writing again.
    disk_full_retry_ms: int = 1_000
    # A runtime stream that sends no hello this long after it opened is ended (HELLO_TIMEOUT).
    hello_timeout_ms: int = 10_000
    # The bounded settle after an end: how long the runtime may still append its closing records
    # (lifecycle.CLOSING_RECORDS) before its lease ends and the stream closes.
    settle_ms: int = DEFAULT_SETTLE_MS
    # How often the store is polled for deadlines any replica may fire (lease_sweep.py, reaper.py).
    poll_ms: int = DEFAULT_POLL_MS
    # Per principal (caps.py): open streams (watches and runtime streams), and worker sessions.
    max_streams: int = DEFAULT_MAX_STREAMS
    max_sessions: int = DEFAULT_MAX_SESSIONS
    # Use a tokens file its group or others may read (logged as a warning) instead of refusing it.
    allow_readable_tokens: bool = False
    # A postgresql:// URL: the store is that PostgreSQL database (store/postgres/), not the
    # data directory's SQLite file; and its pool of connections.
    database_url: str | None = None
    database_pool: int = DEFAULT_DATABASE_POOL
    # The longest the server waits on the database for one thing (store/postgres/).
    database_timeout_ms: int = DEFAULT_DATABASE_TIMEOUT_MS
    # HOST:PORT of the HTTP/JSON door (http_door.py); None: no HTTP.
    http: str | None = None
    # An SSE response with nothing to send sends a comment this often (http_streams.py), so
    # proxies keep it open and clients see it alive; and how long a long-poll waits at the tail.
    sse_heartbeat_ms: int = DEFAULT_HEARTBEAT_MS
    http_long_poll_ms: int = DEFAULT_LONG_POLL_MS
    # The origins whose pages may call the HTTP door (CORS); none: CORS off.
    cors_origins: tuple[str, ...] = ()
    # What time it is for grace deadlines, writes and worker sessions (clock.py): a test's manual
    # clock makes a 30 s grace pass at once. SQLite only: on PostgreSQL the database's clock judges.
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
        host = _host(config.listen)
        if bool(config.tls_cert) != bool(config.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together")
        if not 0 <= config.acceptors_per_method <= MAX_ACCEPTORS:
            raise ConfigError(f"--acceptors must be 0-{MAX_ACCEPTORS}, not {config.acceptors_per_method}")
        if not 1 <= config.poll_ms <= DEFAULT_POLL_MS:
            raise ConfigError(f"--poll must be 1ms to {DEFAULT_POLL_MS}ms, not {config.poll_ms}ms")
        if config.database_url and config.clock is not SYSTEM_CLOCK:
            raise ConfigError(
                "a manual clock is for the SQLite store: on PostgreSQL the database's clock judges "
                "every write and lease"
            )
        if not MIN_DATABASE_TIMEOUT_MS <= config.database_timeout_ms <= MAX_DATABASE_TIMEOUT_MS:
            raise ConfigError(
                f"--database-timeout must be {MIN_DATABASE_TIMEOUT_MS}ms to "
                f"{format_ms(MAX_DATABASE_TIMEOUT_MS)}, not {config.database_timeout_ms}ms"
            )
        if config.lease_ttl_ms < 1:
            raise ConfigError(f"--lease-ttl must be positive, not {config.lease_ttl_ms}ms")
        if not 1 <= config.settle_ms <= MAX_SETTLE_MS:
            raise ConfigError(f"--settle must be 1ms to {MAX_SETTLE_MS // 1000}s, not {config.settle_ms}ms")
        for flag, value in (
            ("--hello-timeout", config.hello_timeout_ms),
            ("--max-streams", config.max_streams),
            ("--max-sessions", config.max_sessions),
            ("--watch-bandwidth", config.watch_bandwidth),
        ):
            if value < 1:
                raise ConfigError(f"{flag} must be at least 1, not {value}")
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
        self._server: grpc.aio.Server | None = None
        self.http: HttpDoor | None = None
        self._draining = False
        self.acceptors: Acceptors | None = None
        self._watches: Watches | None = None
        self._reaper: Reaper | None = None
        self.metrics: ServerMetrics | None = None
        self._stopped = asyncio.Event()
        self._datadir_lock: DataDirLock | None = None
        # A failure of the store for good: the server must stop (see drain_on_failure).
        self.failure: StorageFault | None = None
        self._writes_fault: StorageFault | None = None  # while set, writes are refused (readiness)
        self._on_failure: list[asyncio.Event] = []
        self._health_update: asyncio.Future[None] | None = None
        self._unsubscribe_faults: Callable[[], None] = lambda: None

    @property
    def address(self) -> str:
        host = _host(self.config.listen)
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    async def start(self) -> None:
        """Lock the data directory (datadir.py), then open the store and listen; unlock on failure.

        On PostgreSQL there is no data directory: the lock keeps a SQLite file to one writer,
        and replicas share their database by design, so any number may run from one directory
        (the lock of its default ``.electric`` used to stop a second replica started there)."""
        if self.config.database_url:
            await self._open_and_listen()
            return
        lock = DataDirLock.acquire(self.config.data_dir, "electric server")
        try:
            await self._open_and_listen()
        except BaseException:
            lock.release()
            raise
        lock.listening_on(self.address)
        self._datadir_lock = lock

    async def _open_and_listen(self) -> None:
        await self.store.open()  # raises DamagedStore, or another StorageFault, to refuse to start
        self._unsubscribe_faults = self.store.subscribe_faults(self._on_store_fault)
        self._watches = Watches(
            self.store,
            self.config.watch_queue_limit,
            self.config.watch_bandwidth,
            self.config.watch_feed_events,
        )
        self._reaper = Reaper(
            self.store,
            self.config.idempotency_retention_ms,
            self.config.settle_ms,
            self.config.poll_ms,
            self.config.clock,
        )
        await self._reaper.start()
        self.runtime = Runtime(
            self.store,
            self.config.lease_ttl_ms,
            # A short --lease-ttl asks for heartbeats often enough to keep it.
            min(self.config.heartbeat_interval_ms, max(1, self.config.lease_ttl_ms // 3)),
            self.config.settle_ms,
            self.config.poll_ms,
            self.config.clock,
        )
        await self.runtime.start()
        interceptors = [AuthInterceptor(self.tokens)] if self.tokens else []
        server = grpc.aio.server(
            interceptors=interceptors,  # no maximum_concurrent_rpcs: Acceptors bypass grpc's limiter
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", 4 * 1024 * 1024),
                # Clients ping every 30 s to keep quiet watches alive; accept that
                # rather than cutting them with "too many pings".
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.max_ping_strikes", 0),
            ],
        )
        acceptors = Acceptors(server, interceptors, self.config.acceptors_per_method)
        quiet_abandoned_writes()  # a client that walks away is no error of the server's
        guard_server(server)  # after Acceptors: they record the guarded handlers
        entities = EntityService(self.store, self._watches, self.runtime, self.caps)
        self.metrics = metrics = ServerMetrics(self.store)
        metrics.follow(self._watches, self.runtime, self._reaper)
        entities.signal_rejected = metrics.signal_rejected
        api_grpc.add_EntityServiceServicer_to_server(entities, server)
        rt_grpc.add_RuntimeServiceServicer_to_server(
            RuntimeService(self.runtime, self.caps, self.config.hello_timeout_ms), server
        )
        add_health_and_reflection(server, self.health, (SERVICE_NAME,))
        try:
            if self._tls is not None:
                creds = grpc.ssl_server_credentials([self._tls])
                self.port = server.add_secure_port(self.config.listen, creds)
            else:
                self.port = server.add_insecure_port(self.config.listen)
        except RuntimeError:  # grpc raises instead of returning 0 when the bind fails
            self.port = 0
        refused = None
        if not self.port:
            why = "invalid TLS certificate or key, " if self._tls else ""
            refused = ConfigError(
                f"cannot listen on {self.config.listen} ({why}address in use or not local?)"
            )
        elif self.config.http:
            tls = (
                (self.config.tls_cert, self.config.tls_key)
                if self.config.tls_cert and self.config.tls_key
                else None
            )
            http = HttpDoor(
                entities,
                self.tokens,
                self.readiness,
                self.config.http,
                grace_s=self.config.drain_grace_s,
                tls=tls,
                metrics=metrics.render,
                cors_origins=self.config.cors_origins,
                handlers=EntityStreams(
                    entities,
                    self._draining_now,
                    heartbeat_s=self.config.sse_heartbeat_ms / 1000,
                    long_poll_s=self.config.http_long_poll_ms / 1000,
                ).handlers(self.tokens),
            )
            try:
                await http.start()
                self.http = http
            except ConfigError as exc:
                refused = exc
        if refused is not None:
            metrics.close()
            self._watches.close()
            await self.runtime.stop()
            await self._reaper.stop()
            await self.store.close()
            raise refused
        await server.start()
        acceptors.start()
        self._server = server
        self.acceptors = acceptors
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("electric server listening on %s (%s)", self.address, self.config.where)
        if self.forced_fallbacks:
            log.warning(
                "fallbacks forced for: %s (slower; meant for tests)", ", ".join(sorted(self.forced_fallbacks))
            )

    async def stop(self, grace: float | None = None) -> None:
        """Drain and stop; safe to call more than once."""
        if self._server is None:
            return
        server, self._server = self._server, None
        self._draining = True
        self._unsubscribe_faults()
        if self._health_update is not None:
            await self._health_update
        await self.health.enter_graceful_shutdown()  # every service NOT_SERVING
        assert self._watches is not None
        assert self._reaper is not None
        self._watches.drain()
        self.runtime.drain()  # workers' sessions end now, like watches: they reconnect elsewhere
        # The HTTP door drains beside gRPC, within the same grace.
        http_stopped = asyncio.ensure_future(self.http.stop()) if self.http is not None else None
        await server.stop(self.config.drain_grace_s if grace is None else grace)
        if http_stopped is not None:
            await http_stopped
        if self.acceptors is not None:
            await self.acceptors.wait_closed()
        await self.runtime.stop()
        await self._reaper.stop()
        self._watches.close()
        if self.metrics is not None:
            self.metrics.close()
        try:
            await self.store.close()
        finally:
            if self._datadir_lock is not None:
                self._datadir_lock.release()
        self._stopped.set()
        log.info("electric server stopped")

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

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
        self._health_update = asyncio.ensure_future(self._follow_store(fault, self._health_update))

    async def _follow_store(self, fault: StorageFault | None, previous: asyncio.Future[None] | None) -> None:
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
    env = "" if a == DEFAULT_LISTEN else f"ELECTRIC_ADDRESS={a} "
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


async def serve(config: ServerConfig, *, ready: asyncio.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT; returns the exit code. Raises the store's failure, if it
    failed for good (after draining), or its damage (refusing to start)."""
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
        await server.stop()
    if server.failure is not None:
        raise server.failure
    return 0
