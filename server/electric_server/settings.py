"""Every setting of the server, in one table: ``SETTINGS``.

Each ``Setting`` is a field of ``ServerConfig`` (app.py) with its kind, its default, its range, the
flag of ``electric server`` that sets it (and whether ``electric dev`` takes it too), its
environment variable where it has one, and its help. From this table, and from nowhere else:

- ``ServerConfig``'s defaults, and the check of its ranges (``check``, run by ``ElectricServer``);
- the options of ``electric server`` and ``electric dev`` (electric_sdk/cli/server_options.py):
  flag, metavar, help ending with the default and the range; ``parse_given`` reads what was typed;
- the options table of docs/server.md (scripts/gendocs.py, drift-tested);
- the defaults of the modules below (reaper, runtime, watches, caps, stores), which import them.

Defaults and bounds are written as on the command line (``"10s"``, ``"8"``): the help, the docs
and a refusal show them as written, and the kind parses them into the field's value. A range
whose setting one store alone takes (``store``) is checked by that store, with the bound from
here: the other backend ignores the setting, so refusing it there would refuse a server that
starts today.

Pure: the standard library and ``electric_sdk.durations`` only, so the CLI reads this module for
``--help`` without the server's extras (the package's top level loads it alone).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

from electric_sdk.durations import parse_ms

from .config_error import ConfigError

__all__ = ["SETTINGS", "Kind", "Setting", "check", "parse_given", "setting"]

T = TypeVar("T")
MIB = 1024 * 1024


@dataclass(frozen=True)
class Kind(Generic[T]):
    """What a setting's value is: how its text parses, how the CLI takes it, how a value reads."""

    name: str  # the docs' word for it
    parse: Callable[[str], T]  # command-line text → the field's value; ValueError says why not
    metavar: str | None = None
    unit: str = ""  # of the field's value: what a number given to ``ServerConfig`` counts
    action: str | None = None  # argparse's, for a flag without a value or a repeated one
    show: Callable[[T], str] = str  # a value, in a refusal ("not 0ms")
    gloss: Callable[[T], str] | None = None  # a default's meaning beside it ("32 MiB")


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"invalid number {text!r}: use a whole number") from None


def _ms_or_duration(text: str) -> int:
    """A bare number is milliseconds here (the flag says MS), else a duration such as ``15s``."""
    return int(text) if text.strip().isdigit() else parse_ms(text)


def _on_off(text: str) -> bool:
    """A flag's default (the CLI's flag takes no text: given, it is on)."""
    if text not in ("on", "off"):
        raise ValueError(f"invalid flag {text!r}: use on or off")
    return text == "on"


def _mib(n: int) -> str:
    return f"{n / MIB:g} MiB"


DURATION = Kind[int]("duration", parse_ms, "DURATION", "ms", show=lambda ms: f"{ms}ms")
SECONDS = Kind[float](
    "duration", lambda text: parse_ms(text) / 1000, "DURATION", "s", show=lambda s: f"{s:g}s"
)
MILLISECONDS = Kind[int]("milliseconds", _ms_or_duration, "MS", "ms")
COUNT = Kind[int]("count", _whole, "N")
BYTES = Kind[int]("bytes", _whole, "BYTES", "bytes", gloss=_mib)
ADDRESS = Kind[str]("address", str, "HOST:PORT")
ADDRESS_OR_OFF = Kind[str | None](
    "address", lambda text: None if text.strip().lower() == "off" else text, "HOST:PORT"
)
DIRECTORY = Kind[Path]("path", Path, "DIR")
FILE = Kind[Path | None]("path", Path, "FILE")
URL = Kind[str | None]("URL", str, "URL")
CHOICE = Kind[str]("choice", str)
FLAG = Kind[bool]("flag", _on_off, action="store_true")
# One origin a flag: the flag is repeated (argparse's "append"), and "" (the default) is none.
ORIGINS = Kind[tuple[str, ...]]("list", lambda text: (text,) if text else (), "ORIGIN", action="append")


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One setting: ``name`` is its ``ServerConfig`` field; ``flag`` None: ``ServerConfig`` only."""

    name: str
    kind: Kind[T]
    default: str | None  # as typed on the command line; None: no value (the field is Optional)
    help: str
    flag: str | None = None
    low: str | None = None  # the range, as typed on the command line; None: unbounded
    high: str | None = None
    choices: tuple[str, ...] = ()
    dev: bool = False  # `electric dev` takes it too
    env: str = ""  # the environment variable the CLI reads when the flag is not given ("": none)
    store: str | None = None  # the one backend that takes it; that store checks the range
    see: str = ""  # where the docs say more (Markdown, for docs/server.md only)

    @property
    def value(self) -> T:
        """The default, as the field holds it."""
        if self.default is None:
            return cast(T, None)  # an Optional field's "no value" (a test holds every such field)
        return self.kind.parse(self.default)

    def lowest(self) -> T:
        """The lower bound's value, for a component that checks it itself."""
        if self.low is None:
            raise ValueError(f"{self.name} has no lower bound")
        return self.kind.parse(self.low)

    def highest(self) -> T:
        """The upper bound's value, for a component that checks it itself."""
        if self.high is None:
            raise ValueError(f"{self.name} has no upper bound")
        return self.kind.parse(self.high)

    @property
    def called(self) -> str:
        """What a message names it by: its flag, else its field."""
        return self.flag or self.name

    def default_words(self, code: Callable[[str], str] = str) -> str:
        """The default as help and docs say it; ``code`` marks what a user would type."""
        if self.default is None:
            return f"{code('$' + self.env)}, else none" if self.env else "none"
        if not self.default:
            return "none"
        if self.kind.action == "store_true":
            return self.default  # "off": nothing to type
        gloss = f", {self.kind.gloss(self.value)}" if self.kind.gloss else ""
        return code(self.default) + gloss

    def range_words(self) -> str:
        """The range as help, docs and refusals say it; "" when any value goes."""
        if self.choices:
            return " or ".join(self.choices)
        if self.low is not None and self.high is not None:
            return f"{self.low} to {self.high}"
        if self.low is not None:
            return f"at least {self.low}"
        return f"at most {self.high}" if self.high is not None else ""

    def refusal(self, value: Any) -> str | None:
        """Why ``value`` is out of range, naming the setting and its range; None if it is not."""
        if self.choices:
            out = value not in self.choices
        else:
            out = (self.low is not None and value < self.lowest()) or (
                self.high is not None and value > self.highest()
            )
        if not out:
            return None
        return f"{self.called} must be {self.range_words()}, not {self.kind.show(value)}"


# fmt: off
LISTEN = Setting("listen", ADDRESS, "127.0.0.1:7700", flag="--listen", dev=True,
    help="HOST:PORT to listen on (gRPC); port 0 picks a free port (printed)")
HTTP = Setting("http", ADDRESS_OR_OFF, "off", flag="--http", dev=True,
    help="also serve the HTTP/JSON API here (docs/http.md), e.g. 127.0.0.1:7780; port 0 picks a free port "
    "(printed); off: no HTTP")
SSE_HEARTBEAT = Setting("sse_heartbeat_ms", MILLISECONDS, "15000", flag="--sse-heartbeat", low="1", dev=True,
    see="[http.md](http.md#live-streams)",
    help="an HTTP SSE response with nothing to send sends a comment this often, in ms (or a duration such "
    "as 15s), so proxies keep it open and clients see it alive")
HTTP_LONG_POLL = Setting("http_long_poll_ms", DURATION, "20s", see="[http.md](http.md#live-streams)",
    help="how long an HTTP long-poll waits at the stream's tail for something new")
CORS_ORIGINS = Setting("cors_origins", ORIGINS, "", flag="--cors-origin", dev=True,
    see="[http.md](http.md#cors)",
    help="let pages of this origin call the HTTP API, e.g. https://app.example (repeat it); none: CORS off")
MCP = Setting("mcp", FLAG, "off", flag="--mcp", dev=True, see="[mcp.md](mcp.md)",
    help="also serve the control plane as MCP tools on the HTTP door's /mcp (streamable HTTP; needs --http "
    "and electric-sdk[mcp])")
DATA_DIR = Setting("data_dir", DIRECTORY, ".electric", flag="--data", dev=True,
    see="[The data directory](#the-data-directory)",
    help="the data directory: holds electric.db and LOCK, for one server at a time; not used with "
    "--database, nor when $ELECTRIC_DATABASE_URL is set and --data is not given")
DATABASE_URL = Setting("database_url", URL, None, flag="--database", dev=True, env="ELECTRIC_DATABASE_URL",
    see='"PostgreSQL"',
    help="a postgresql:// URL: keep the store in that PostgreSQL database instead of the data directory's "
    "SQLite file (needs electric-sdk[postgres]); $ELECTRIC_DATABASE_URL counts only without --data")
DATABASE_POOL = Setting("database_pool", COUNT, "4", flag="--database-pool", low="1", dev=True,
    store="PostgreSQL", see='"PostgreSQL"',
    help="connections to the --database (mind PostgreSQL's max_connections)")
DATABASE_TIMEOUT = Setting("database_timeout_ms", DURATION, "5s", flag="--database-timeout", low="10ms",
    high="10m", dev=True, see='"PostgreSQL"',
    help="the longest the server waits on the --database for one thing (a connection, a free pooled "
    "connection, a statement) before the call is answered UNAVAILABLE; under the clients' 10 s "
    "deadline")
SYNCHRONOUS = Setting("synchronous", CHOICE, "FULL", flag="--synchronous", choices=("FULL", "NORMAL"),
    store="SQLite",
    help="SQLite durability: FULL syncs the WAL before acknowledging, and survives power loss; NORMAL may "
    "lose the last commits on power loss")
COMMIT_DELAY = Setting("commit_delay_ms", DURATION, "0", flag="--commit-delay", low="0", high="100ms",
    store="SQLite", see='"Group commit" below',
    help="under concurrent load, how long a commit waits for more writes to share its fsync, e.g. 1ms "
    "(like PostgreSQL's commit_delay); 0: never")
ACCEPT_DATA_LOSS = Setting("accept_data_loss", FLAG, "off", flag="--accept-data-loss", dev=True,
    see='"Damage"',
    help="start on a damaged data directory anyway, dropping what the damage cut off (logged)")
DISK_FULL_RETRY = Setting("disk_full_retry_ms", DURATION, "1s", low="1ms", store="SQLite", see='"Disk full"',
    help="while the disk is full, how often the store tries writing again")
TOKENS_FILE = Setting("tokens_file", FILE, None, flag="--tokens",
    help="TOML file of bearer tokens (see the README); without it, no auth and loopback only")
ALLOW_READABLE_TOKENS = Setting("allow_readable_tokens", FLAG, "off", flag="--allow-readable-tokens",
    help="use a --tokens file that its group or others may read or write, with a warning, instead of "
    "refusing it")
TLS_CERT = Setting("tls_cert", FILE, None, flag="--tls-cert",
    help="PEM certificate chain; with --tls-key, TLS on gRPC and on the HTTP door (HTTPS)")
TLS_KEY = Setting("tls_key", FILE, None, flag="--tls-key",
    help="PEM private key, for --tls-cert")
INSECURE = Setting("insecure", FLAG, "off", flag="--insecure",
    help="allow a non-loopback --listen or --http without --tokens (not recommended)")
DRAIN_GRACE = Setting("drain_grace_s", SECONDS, "10s", flag="--drain-grace",
    help="how long in-flight calls may finish on shutdown")
ACCEPTORS = Setting("acceptors_per_method", COUNT, "8", flag="--acceptors", low="0", high="64",
    see='"Accepting calls under load" below',
    help="calls each method accepts ahead beyond grpc's one, so a busy server keeps taking calls; 0: "
    "grpc's own acceptor only")
LEASE_TTL = Setting("lease_ttl_ms", DURATION, "10s", flag="--lease-ttl", low="1ms",
    help="how long a worker's session, and its leases, outlive its last heartbeat (and a replica's "
    "sessions its last poll)")
HEARTBEAT_INTERVAL = Setting("heartbeat_interval_ms", DURATION, "3s",
    help="how often workers are asked to send a heartbeat (more often under a short lease TTL: at least "
    "three per TTL)")
HELLO_TIMEOUT = Setting("hello_timeout_ms", DURATION, "10s", flag="--hello-timeout", low="1ms",
    help="how long a worker's stream may stay open without its hello")
SETTLE = Setting("settle_ms", DURATION, "1s", flag="--settle", low="1ms", high="60s", see='"Closing"',
    help="after an entity's end, how long its runtime may still append its closing records (a signal's "
    "outcome, the end of the run in progress, exec receipts) before the lease ends and the stream "
    "closes, and how long past its grace deadline an exec entity's stopped waits for its process's "
    "exit")
POLL = Setting("poll_ms", DURATION, "500ms", flag="--poll", low="1ms", high="500ms",
    help="how often the store is polled for deadlines any replica may fire: grace expiries, leases whose "
    "holder is gone, settled streams, entities a worker of this replica may take")
UPGRADE_AFTER = Setting("upgrade_after_ms", DURATION, "10m", flag="--upgrade-after", low="0", see='"Deploys"',
    help="how long a run bound to a code version no connected worker runs waits for one before it is "
    "replayed on the version selected for new wakes, for types that choose neither pinned nor "
    "auto_upgrade (0: at once)")
IDEMPOTENCY_RETENTION = Setting("idempotency_retention_ms", DURATION, "24h", see='"Idempotency"',
    help="how long idempotency keys are kept, at least")
MAX_STREAMS = Setting("max_streams", COUNT, "5000", flag="--max-streams", low="1", see='"Limits and caps"',
    help="open streams (watches and worker streams) per principal")
MAX_SESSIONS = Setting("max_sessions", COUNT, "100", flag="--max-sessions", low="1", see='"Limits and caps"',
    help="worker sessions per principal")
WATCH_BANDWIDTH = Setting("watch_bandwidth", BYTES, "33554432", flag="--watch-bandwidth", low="1",
    see='"Many watchers"',
    help="bytes per second all event watches share once there are many: each watcher then sends what "
    "arrived meanwhile in one message")
WATCH_QUEUE_LIMIT = Setting("watch_queue_limit", COUNT, "10000",
    help="changes a watcher may fall behind before it is ended with WATCH_LAGGING")
WATCH_FEED_EVENTS = Setting("watch_feed_events", COUNT, "100000", see='"Many watchers"',
    help="events an entity's feed keeps for its watchers that are behind")
# fmt: on

# In the order `electric server --help` and docs/server.md list them.
SETTINGS: tuple[Setting[Any], ...] = (
    LISTEN, HTTP, SSE_HEARTBEAT, HTTP_LONG_POLL, CORS_ORIGINS, MCP,
    DATA_DIR, DATABASE_URL, DATABASE_POOL, DATABASE_TIMEOUT, SYNCHRONOUS, COMMIT_DELAY,
    ACCEPT_DATA_LOSS, DISK_FULL_RETRY,
    TOKENS_FILE, ALLOW_READABLE_TOKENS, TLS_CERT, TLS_KEY, INSECURE,
    DRAIN_GRACE, ACCEPTORS, LEASE_TTL, HEARTBEAT_INTERVAL, HELLO_TIMEOUT, SETTLE, POLL, UPGRADE_AFTER,
    IDEMPOTENCY_RETENTION, MAX_STREAMS, MAX_SESSIONS, WATCH_BANDWIDTH, WATCH_QUEUE_LIMIT,
    WATCH_FEED_EVENTS,
)  # fmt: skip
_BY_NAME = {s.name: s for s in SETTINGS}


def setting(name: str) -> Setting[Any]:
    """The setting of the ``ServerConfig`` field ``name``."""
    return _BY_NAME[name]


def check(config: object) -> None:
    """Refuse a configuration with a value out of its setting's range: ``ConfigError`` naming the
    flag and the range. A setting one store takes is left to that store (see the docstring)."""
    for s in SETTINGS:
        if s.store is None and (why := s.refusal(getattr(config, s.name))) is not None:
            raise ConfigError(why)


def parse_given(given: Mapping[str, str | bool | Sequence[str] | None]) -> dict[str, Any]:
    """The ``ServerConfig`` fields of what a command line gave, by field: text is parsed by its
    setting's kind (``ConfigError`` naming the flag if it does not parse), a flag's True and a
    repeated flag's values are taken as they are; None (not given) is left out, for the default."""
    fields: dict[str, Any] = {}
    for name, raw in given.items():
        s = _BY_NAME[name]
        if raw is None:
            continue
        if isinstance(raw, bool):
            fields[name] = raw
        elif isinstance(raw, str):
            try:
                fields[name] = s.kind.parse(raw)
            except ValueError as exc:
                raise ConfigError(f"{s.called}: {exc}") from None
        else:
            fields[name] = tuple(raw)
    return fields
