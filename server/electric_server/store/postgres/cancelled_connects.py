"""asyncpg's report of a cancelled connect, answered in one place.

asyncpg (0.32, with ``sslmode=prefer``, its default) first asks PostgreSQL whether it speaks TLS,
through a protocol whose ``on_data`` future only the connect itself awaits. A connect cancelled
after its socket is made but before that await (its own ``timeout``, a stopping server ending a
reconnect, the pool's floor kept while the database is gone) closes the socket; the protocol's
``connection_lost`` then sets ``ConnectionError('unexpected connection_lost() call')`` on a future
nobody will read. asyncio reports it when the future is collected, "Future exception was never
retrieved", an ERROR with a traceback, for a connect whose end the caller already handled (its
cancellation, or the timeout it answered). The store puts this filter on its loop: that one report
becomes a DEBUG line, and every other goes on to the handler that was there before.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

__all__ = ["quiet_cancelled_connects"]

log = logging.getLogger(__name__)

_NEVER_RETRIEVED = "Future exception was never retrieved"
_LOST_UNEXPECTEDLY = "unexpected connection_lost() call"
_MARK = "_electric_quiet_cancelled_connects"


def cancelled_connect_report(context: dict[str, Any]) -> bool:
    """Whether ``context`` (a loop exception handler's) is the report of a cancelled connect."""
    exc = context.get("exception")
    return (
        context.get("message") == _NEVER_RETRIEVED
        and type(exc) is ConnectionError
        and str(exc) == _LOST_UNEXPECTEDLY
    )


def quiet_cancelled_connects(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Put the filter on ``loop`` (the running one by default), once per loop."""
    loop = loop or asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    if getattr(previous, _MARK, False):
        return

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if cancelled_connect_report(context):
            log.debug("a cancelled database connect's TLS probe ended unread (asyncpg); nothing was lost")
            return
        if previous is None:
            loop.default_exception_handler(context)
        else:
            previous(loop, context)

    setattr(handler, _MARK, True)
    loop.set_exception_handler(handler)
