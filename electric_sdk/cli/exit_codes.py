"""Exit codes of every `electric` command: this module is the contract.

``MEANINGS`` is the one table. The module's docstring (below), the help epilog
(``SUMMARY``) and the table in docs/cli.md are all rendered from it; a test
checks that docs/cli.md carries exactly ``markdown_table()``, and
``python -m electric_sdk.cli.exit_codes docs/cli.md`` rewrites it there.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .. import errors

OK = 0
ERROR = 1
USAGE = 2
NOT_FOUND = 3
PRECONDITION = 4
UNAVAILABLE = 5
AUTH = 6
EXISTS = 7
RUN_FAILED = 8
RUN_ABORTED = 9
STAGE_NOT_REACHED = 10
# From BSD's sysexits.h, as PostgreSQL and etcd tooling use them for these faults.
DATA_DAMAGED = 65  # EX_DATAERR
SOFTWARE = 70  # EX_SOFTWARE
STORAGE_FAILED = 74  # EX_IOERR
DISK_FULL = 75  # EX_TEMPFAIL: free space, and the same start works
TIMEOUT = 124
INTERRUPTED = 130
BROKEN_PIPE = 141
TERMINATED = 143

# code: (a few words for `electric --help`, the meaning in docs/cli.md's markdown)
MEANINGS: dict[int, tuple[str, str]] = {
    OK: (
        "ok",
        "success: `run`: the run completed; `verify`: nothing differs; `replay-check`: every "
        "recorded run replays on the new code; `server`, `worker`, `dev`: "
        "drained on the first SIGTERM/SIGINT and stopped; `events --follow`: the stream ended",
    ),
    ERROR: (
        "other error",
        "any other error: an unexpected server error (`INTERNAL`) or a bug (with a traceback); "
        "`verify` found a mismatch",
    ),
    USAGE: (
        "usage or invalid argument",
        "usage error or invalid argument: a bad flag, name, signal, state, duration, token or JSON, "
        "text that is not UTF-8, a closed stdout (or stdin for `run --message -`), found "
        "locally (nothing was sent) or by the server (`INVALID_ARGUMENT`: `INVALID_NAME`, "
        "`UNKNOWN_SIGNAL`, `PAYLOAD_NOT_ALLOWED`, `EMPTY_MESSAGE`, ...); bad `server`/`verify` "
        "configuration, a `--database` that cannot be opened (`server`, `verify`, `export`, "
        "`import`), or a data directory another server holds; `backup`/`restore` refused "
        "(nothing written); `worker`/`dev`/`replay-check`: the app cannot be loaded; `replay-check`: "
        "the export file cannot be read or is not a whole export (`INVALID_EXPORT_FILE`)",
    ),
    NOT_FOUND: (
        "not found",
        "not found (`ENTITY_NOT_FOUND`; `run` without `--spawn` never creates the entity; "
        "`retry`: `RUN_NOT_FOUND`, no message with that key)",
    ),
    PRECONDITION: (
        "invalid signal or failed precondition",
        "invalid signal or failed precondition: `INVALID_SIGNAL` (the entity is stopped or killed), "
        "`ENTITY_TERMINAL` (a message to a stopped or killed entity; `retry` of a run of one: fork it "
        "instead), `RUN_NOT_RETRYABLE` (`retry` of a run that did not fail or abort), `ENTITY_BUSY` "
        "(`send` refused by a reject policy while a run is in progress), `BUSY_POLICY_NOT_ALLOWED`",
    ),
    UNAVAILABLE: (
        "unavailable or deadline exceeded",
        "unavailable or deadline exceeded: the server is unreachable or draining, or did not answer "
        "within the call deadline (retries included); a stream could not reconnect in time",
    ),
    AUTH: (
        "unauthenticated or permission denied",
        "unauthenticated (`UNAUTHENTICATED`: missing or unknown token) or permission denied "
        "(`MISSING_SCOPE`, `TYPE_NOT_ALLOWED`)",
    ),
    EXISTS: ("already exists", "already exists (`ENTITY_EXISTS`: an id is never reused)"),
    RUN_FAILED: (
        "run failed",
        "`run`, `send --wait run`: the run failed (the entity's `on_message` raised, e.g. "
        "`NonDeterministicRun`); "
        "`replay-check`: a recorded run would fail so on the new code (docs/patches.md)",
    ),
    RUN_ABORTED: (
        "run aborted",
        "`run`: the run was aborted or its message cancelled by something else than this command "
        "(another client's SIGINT), or the entity was stopped or killed before the run completed; "
        "`send --wait run`: the run was aborted or its message cancelled",
    ),
    STAGE_NOT_REACHED: (
        "stage not reached",
        "`signal --wait`, `kill --wait`: the stage waited for cannot be reached any more (the "
        "worker was lost, the stream closed, the signal was ignored or not delivered); the answer's stages "
        "say why",
    ),
    DATA_DAMAGED: (
        "data directory damaged",
        "`server`, `dev`: the data directory is damaged and the server refused to start (see "
        'docs/server.md, "Damage"; `--accept-data-loss` starts anyway); `verify`: the store is damaged',
    ),
    SOFTWARE: (
        "server tasks crashed",
        "`server`, `dev`: drained and stopped, but tasks of the server had crashed while it ran (a "
        "bug: each was logged with its traceback when it crashed)",
    ),
    STORAGE_FAILED: (
        "storage failed",
        "`server`, `dev`: the disk failed a write the server cannot take back (a failed WAL sync); "
        "the server acknowledged nothing more and stopped",
    ),
    DISK_FULL: (
        "disk full at start",
        "`server`, `dev`: the disk holding the data directory is full and the store could not be "
        "opened even read-only (a WAL to replay needs room): free space and start again. One that "
        "can be read starts read-only instead, every write refused with `DISK_FULL` until there is room",
    ),
    TIMEOUT: (
        "timed out",
        "`run`: the run did not end within `--timeout` (the command's own timeout); `send --wait run`: "
        "the run had not ended within `--timeout` (the message stays delivered); `signal --wait`, "
        "`kill --wait`: the stage had not been reached within `--timeout` (the signal stays sent); "
        "`wait`: the entity "
        "did not reach the state within `--timeout`",
    ),
    INTERRUPTED: (
        "Ctrl-C/SIGINT",
        "interrupted by SIGINT (Ctrl-C); a second one ends any command at once. `run`: after "
        "interrupting its run; `server`, `worker`, `dev`: a second SIGINT ended the drain",
    ),
    BROKEN_PIPE: (
        "stdout closed",
        "stdout was closed early (a broken pipe, e.g. `electric events a/b -f \\| head -1`), "
        "as if killed by SIGPIPE; never `server`, `worker`, `dev`: they drop output nobody reads "
        "and go on (a drain still completes)",
    ),
    TERMINATED: (
        "SIGTERM",
        "terminated by SIGTERM. `run`: after interrupting its run; "
        "`server`, `worker`, `dev`: a second SIGTERM ended the drain",
    ),
}

SUMMARY = ", ".join(f"{code} {short}" for code, (short, _) in MEANINGS.items())

DOCS_BEGIN = "<!-- BEGIN GENERATED: exit codes (python -m electric_sdk.cli.exit_codes docs/cli.md) -->"
DOCS_END = "<!-- END GENERATED: exit codes -->"


def markdown_table() -> str:
    rows = [f"| {code} | {meaning} |" for code, (_, meaning) in MEANINGS.items()]
    return "\n".join(["| code | meaning |", "|---|---|", *rows]) + "\n"


def _plain_table() -> str:
    plain = ["Every code, one per line (the first word is the code):", ""]
    for code, (_, meaning) in MEANINGS.items():
        text = meaning.replace("`", "").replace("\\|", "|")
        plain.append(f"{code:<5} {text}")
    return "\n".join(plain) + "\n"


__doc__ = f"{__doc__}\n{_plain_table()}"

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


def render_into(text: str) -> str:
    """``text`` with the block between DOCS_BEGIN and DOCS_END replaced by ``markdown_table()``."""
    head, begin, rest = text.partition(DOCS_BEGIN)
    _, end, tail = rest.partition(DOCS_END)
    if not begin or not end:
        raise ValueError(f"the markers are missing: {DOCS_BEGIN} ... {DOCS_END}")
    return f"{head}{DOCS_BEGIN}\n{markdown_table()}{DOCS_END}{tail}"


if __name__ == "__main__":
    if len(sys.argv) == 2:
        path = Path(sys.argv[1])
        path.write_text(render_into(path.read_text(encoding="utf-8")), encoding="utf-8")
    else:
        sys.stdout.write(markdown_table())
