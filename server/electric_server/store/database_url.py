"""Database URLs (``postgresql://``): what a server says about one, without its password.

Nothing here needs the PostgreSQL driver, so the server can refuse a URL, or
say that the driver is missing, without it.
"""

from __future__ import annotations

import re
import urllib.parse

from ..settings import DATABASE_POOL, DATABASE_TIMEOUT

__all__ = ["DEFAULT_DATABASE_POOL", "DEFAULT_DATABASE_TIMEOUT_MS", "is_database_url", "redacted"]

# Connections per server to PostgreSQL (`--database-pool`).
DEFAULT_DATABASE_POOL = DATABASE_POOL.value
# The longest a server waits on its database for one thing (`--database-timeout`): a connection,
# a pooled connection, a statement. Under the clients' default deadline (10 s), so a database
# that stops answering is answered UNAVAILABLE with the reason, not DEADLINE_EXCEEDED.
DEFAULT_DATABASE_TIMEOUT_MS = DATABASE_TIMEOUT.value


def is_database_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def redacted(url: str) -> str:
    """``url`` without its password (in the authority or as a ``password=`` parameter)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<a database URL that cannot be parsed>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}{':***' if colon else ''}@{host}"
    query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
