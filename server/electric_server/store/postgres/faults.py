"""What PostgreSQL's errors are: the PostgreSQL store's fault predicates, and the sentences that say why.

What asyncpg raises sorts into two kinds, each failing the call with
``DatabaseUnavailable`` (retryable): ``LOST`` (a connection lost, refused or
unanswering; postgres/reachability.py then finds out whether the database is
gone) and ``REFUSED`` (the database is there but will not do the work: a full
disk, read-only, a right revoked; logged at most once per reason per
``REFUSED_LOG_INTERVAL_S``). The pool's connections map them
(postgres/connections.py); the fault policy (store/faults.py) acts on what
they become. A deadlock or a serialization failure is neither: the batch
runs again (``retryable``).

At start (``refusal``): a refused, unknown or silent address, a login the
database refuses, a missing database, or something that is not PostgreSQL
at all each become one sentence saying what to check. The password is never
in it: the URL is shown ``redacted``, and PostgreSQL's messages never repeat
a password.
"""

from __future__ import annotations

import logging
import socket

import asyncpg

from ...log_throttle import LogThrottle

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
    "LOST",
    "REFUSED",
    "RefusedLog",
    "lost_reason",
    "refusal",
    "refused_reason",
    "retryable",
    "setup_refusal",
    "unreachable_reason",
]

log = logging.getLogger(__name__)


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


def retryable(exc: BaseException) -> str | None:
    """What ``exc`` is when the batch may simply run again (a deadlock), else None."""
    if isinstance(exc, asyncpg.exceptions.DeadlockDetectedError | asyncpg.exceptions.SerializationError):
        return f"PostgreSQL's {type(exc).__name__}"
    return None
