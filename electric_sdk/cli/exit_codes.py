"""Exit codes of the `electric` command: this table is the contract (docs/cli.md repeats it).

====  ==========================================================================================
code  meaning
====  ==========================================================================================
0     success (`verify`: nothing differs; `server`: drained and stopped)
1     any other error: an unexpected server error (``INTERNAL``), a bug; `verify` found a
      mismatch
2     usage error or invalid argument: a bad flag, name, signal, state, duration or JSON, found
      locally (nothing was sent) or by the server (``INVALID_ARGUMENT``: ``INVALID_NAME``,
      ``UNKNOWN_SIGNAL``, ``PAYLOAD_NOT_ALLOWED``, ...); bad `server`/`verify` configuration
3     not found (``ENTITY_NOT_FOUND``)
4     invalid signal or failed precondition: ``INVALID_SIGNAL`` (the entity is stopped or
      killed), ``ENTITY_TERMINAL`` (a message to a stopped or killed entity)
5     unavailable or deadline exceeded: the server is unreachable or draining, or did not
      answer within ``--timeout`` (retries included); a watch could not reconnect in time
6     unauthenticated (missing or unknown token) or permission denied (missing scope, entity
      type not allowed for the token)
7     already exists (``ENTITY_EXISTS``: an id is never reused, not even after stopped/killed)
130   interrupted by Ctrl-C (SIGINT); a second Ctrl-C ends the process at once
141   stdout was closed early (a broken pipe, e.g. ``| head``), as if killed by SIGPIPE
====  ==========================================================================================

`electric server` also exits with 128 + N when a second signal N forces an immediate exit
(130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

from .. import errors

OK = 0
ERROR = 1
USAGE = 2
NOT_FOUND = 3
PRECONDITION = 4
UNAVAILABLE = 5
AUTH = 6
EXISTS = 7
INTERRUPTED = 130
BROKEN_PIPE = 141

# Most specific first: the first class an error is an instance of decides.
_BY_ERROR: tuple[tuple[type[errors.ElectricError] | tuple[type[errors.ElectricError], ...], int], ...] = (
    (errors.InvalidArgument, USAGE),
    (errors.EntityNotFound, NOT_FOUND),
    (errors.FailedPrecondition, PRECONDITION),
    ((errors.Unavailable, errors.DeadlineExceeded, errors.WatchLagging), UNAVAILABLE),
    ((errors.Unauthenticated, errors.PermissionDenied), AUTH),
    (errors.EntityExists, EXISTS),
)


def for_error(error: errors.ElectricError) -> int:
    """The exit code for an SDK error (ERROR for anything not in the table)."""
    for kinds, code in _BY_ERROR:
        if isinstance(error, kinds):
            return code
    return ERROR
