"""What an unreachable PostgreSQL means for the server: at start, one clear sentence; while
running, the server is told the database is gone and when it is back.

At start (``refusal``): a refused, unknown or silent address, a login the
database refuses, a missing database, or something that is not PostgreSQL
at all each become one sentence saying what to check. The password is never
in it: the URL is shown ``redacted``, and PostgreSQL's messages never repeat
a password.

While running (``Reachability``): every call that loses its connection fails
with ``DatabaseUnavailable`` on its own (retryable). The first such failure
also starts a probe, which opens a connection at once: one backend that was
ended (``pg_terminate_backend``) while the database is up changes nothing
else. When the probe fails too, the database is gone: the fault listeners
(the server's health and ``/readyz``) are told, the log says why, and the
probe tries again every ``PROBE_INTERVAL_S`` until the database answers, then
tells the listeners it is back. Nothing needs a restart.

A database that answers but is read-only refuses every write (``REFUSED``):
the first refusal tells the listeners ``WritesRefused`` (the server's writes
are not ready, its reads are), and the next write that commits (the
replica's heartbeat, at every poll, at the latest) tells them all is well.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable

import asyncpg

from ...log_throttle import LogThrottle
from ..base import DatabaseUnavailable, FaultListener, StorageFault, WritesRefused

# What a lost, refused or unanswering connection raises: the call fails with DatabaseUnavailable.
LOST: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    # A backend ended while its connection was idle sends a FATAL that asyncpg, expecting
    # nothing, takes for a protocol error: until it reads the close, a turn of the loop later,
    # every operation on that connection raises this ("another operation (2) is in progress").
    asyncpg.InternalClientError,
    asyncpg.exceptions.OperatorInterventionError,  # the backend was terminated, or the server shuts down
    asyncpg.exceptions.TooManyConnectionsError,
)

# What PostgreSQL answers when it is there but will not do the work: it has no room (a full
# disk, no memory), takes no writes, the role lost a right, or its own files failed. The call
# fails DatabaseUnavailable (retryable, once an operator has acted), not as a bug of the
# server's, and the log says why.
REFUSED: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DiskFullError,
    asyncpg.exceptions.OutOfMemoryError,
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    asyncpg.exceptions.InsufficientPrivilegeError,
    asyncpg.exceptions.PostgresSystemError,  # e.g. an I/O error on the database's disk
    asyncpg.exceptions.InternalServerError,  # e.g. data corrupted
)
# The log says so at most once per reason this often (every write would otherwise).
REFUSED_LOG_INTERVAL_S = 10.0

__all__ = [
    "PROBE_INTERVAL_S",
    "REFUSED",
    "Reachability",
    "RefusedLog",
    "lost_reason",
    "refusal",
    "refused_reason",
    "setup_refusal",
    "unreachable_reason",
]

log = logging.getLogger(__name__)

# How often a database that went away is tried again (a probe is one connection, one SELECT 1).
PROBE_INTERVAL_S = 0.5


def lost_reason(exc: BaseException, timeout_s: float) -> str:
    """Why a call on the database failed, for its caller and the log: a timeout is a database that
    did not answer in time (asyncpg's TimeoutError says nothing), anything else a lost connection."""
    if isinstance(exc, TimeoutError):
        return f"the database did not answer within {timeout_s:g} s"
    return f"the database connection failed ({type(exc).__name__}: {exc})"


def refused_reason(exc: BaseException) -> str:
    """Why the database refused a call's work (``REFUSED``), and what to look at."""
    if isinstance(exc, asyncpg.exceptions.ReadOnlySQLTransactionError):
        return (
            f"the database takes no writes ({exc}): is it read-only (default_transaction_read_only, "
            "which hosted services set on a full disk), or a standby after a failover?"
        )
    if isinstance(exc, asyncpg.exceptions.DiskFullError):
        return f"the database's disk is full ({exc}): free space on it, writes resume by themselves"
    if isinstance(exc, asyncpg.exceptions.InsufficientPrivilegeError):
        return f"{exc}: the server's database user lost a right it needs on electric's tables"
    return f"the database failed ({type(exc).__name__}: {exc})"


class RefusedLog:
    """One error line per reason per ``interval_s`` for ``REFUSED`` faults; the next line counts
    the calls left out."""

    def __init__(self, where: str, interval_s: float = REFUSED_LOG_INTERVAL_S) -> None:
        self.where = where
        self.interval_s = interval_s
        self._throttle = LogThrottle(interval_s)

    def note(self, what: str, exc: BaseException) -> str:
        """Log ``exc`` (unless its kind was logged lately) and return its reason."""
        why = refused_reason(exc)
        left_out = self._throttle.admit(type(exc).__name__)
        if left_out is None:
            return why
        more = f"; {left_out} more call(s) since the last such line" if left_out else ""
        log.error(
            "the database %s refused %s: %s; calls are answered UNAVAILABLE%s (logged at most every %g s)",
            self.where,
            what,
            why,
            more,
            self.interval_s,
        )
        return why


def unreachable_reason(exc: BaseException, where: str, timeout_s: float) -> str:
    """Why a connection to the running server's database failed: one PostgreSQL refused (the
    database dropped, the login revoked) is told as at start (``refusal``), anything else is a
    lost connection (``lost_reason``)."""
    if isinstance(exc, asyncpg.PostgresError) and not isinstance(exc, LOST):
        return refusal(exc, where, timeout_s)
    return lost_reason(exc, timeout_s)


def refusal(exc: BaseException, where: str, connect_timeout_s: float) -> str:
    """Why the database ``where`` (a redacted URL) cannot be opened, and what to check."""
    if isinstance(exc, socket.gaierror):
        return f"its host name is not known ({exc.strerror}): check the host in the URL"
    if isinstance(exc, ConnectionRefusedError):
        return "nothing accepts connections at its host and port: is PostgreSQL running there, on that port?"
    if isinstance(exc, TimeoutError):
        return f"no answer within {connect_timeout_s:g} s: is the host reachable, is a firewall in the way?"
    if isinstance(exc, asyncpg.exceptions.InvalidPasswordError):
        return f"the login was refused ({exc}): check the user and the password"
    if isinstance(exc, asyncpg.exceptions.InvalidAuthorizationSpecificationError):
        return f"the login was refused ({exc}): check the user"
    if isinstance(exc, asyncpg.exceptions.TooManyConnectionsError):
        return (
            f"{exc}: PostgreSQL's max_connections is reached; each replica opens --database-pool "
            "connections (4 by default) and two more (its commit feed and doorbell): lower "
            "--database-pool, stop other clients, or raise max_connections"
        )
    if isinstance(exc, asyncpg.exceptions.InvalidCatalogNameError):
        return f"{exc}: create it (e.g. createdb), or name another database in the URL"
    if isinstance(exc, asyncpg.PostgresError):
        return str(exc) or type(exc).__name__
    # No PostgreSQL error message: the other end did not speak PostgreSQL's protocol.
    reason = str(exc) or type(exc).__name__
    return f"{reason}: is that a PostgreSQL server?"


def setup_refusal(exc: BaseException) -> str:
    """Why the schema could not be applied at start, and what to do."""
    if isinstance(exc, asyncpg.exceptions.InsufficientPrivilegeError):
        # PostgreSQL 15 and later let only a database's owner create in its schema public.
        return (
            f"{exc}: the server creates and writes its own tables, so its user must own the "
            "database (e.g. createdb --owner USER, or ALTER DATABASE NAME OWNER TO USER while it is "
            "new) or be granted CREATE on its schema public and every right on the tables there"
        )
    if isinstance(exc, asyncpg.exceptions.DuplicateTableError | asyncpg.exceptions.DuplicateObjectError):
        # No electric schema version is recorded, yet a table of its name is there.
        return (
            f"{exc}: the database holds another application's tables; give electric a database of "
            "its own (e.g. createdb electric)"
        )
    return str(exc) or type(exc).__name__


class Reachability:
    """Whether the database answers, as the server must know it (see the module docstring)."""

    def __init__(self, where: str, probe: Callable[[], Awaitable[object]], timeout_s: float) -> None:
        self.where = where
        self.timeout_s = timeout_s  # the probe's bound
        self._probe = probe
        self._listeners: list[FaultListener] = []
        self._gone: DatabaseUnavailable | None = None
        self._refusing: WritesRefused | None = None  # writes refused (read-only) since the last commit
        self._told: StorageFault | None = None  # what the listeners heard last
        self._task: asyncio.Task[None] | None = None

    @property
    def gone(self) -> DatabaseUnavailable | None:
        """The fault while the database is unreachable, else None."""
        return self._gone

    def subscribe(self, callback: FaultListener) -> Callable[[], None]:
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback)

    def refuses_writes(self, why: str) -> None:
        """A write was refused for good reason of the database's (it is read-only): the server's
        writes are not ready until one commits again (``took_writes``)."""
        if self._refusing is None:
            self._refusing = WritesRefused(f"the database {self.where} takes no writes: {why}")
            self._tell()

    def took_writes(self) -> None:
        """A write committed: the database takes writes."""
        if self._refusing is not None:
            self._refusing = None
            log.warning("the database %s takes writes again: writes are ready", self.where)
            self._tell()

    def lost(self) -> None:
        """A call lost its connection: find out whether the database is still there."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._follow(), name="electric-postgres-probe"
            )

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _follow(self) -> None:
        while True:
            try:
                await self._probe()
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                if self._gone is None:
                    why = unreachable_reason(exc, self.where, self.timeout_s)
                    self._gone = DatabaseUnavailable(f"the database {self.where} cannot be reached: {why}")
                    log.error(
                        "the database %s cannot be reached (%s): calls are answered UNAVAILABLE "
                        "and the server is not ready until it answers again (tried every %g s)",
                        self.where,
                        why,
                        PROBE_INTERVAL_S,
                    )
                    self._tell()
                await asyncio.sleep(PROBE_INTERVAL_S)
                continue
            if self._gone is not None:
                self._gone = None
                log.warning("the database %s answers again: serving", self.where)
                self._tell()
            return

    def _tell(self) -> None:
        """The listeners hear the worst of now: gone, else writes refused, else None (all is well)."""
        fault = self._gone or self._refusing
        if fault is not self._told:
            self._told = fault
            self._notify(fault)

    def _notify(self, fault: StorageFault | None) -> None:
        for callback in tuple(self._listeners):
            try:
                callback(fault)
            except Exception:
                log.exception("a listener to the database's reachability failed")
