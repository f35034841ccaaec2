"""Every speed trick of the server, by name: what it buys, what it risks, its fallback and its bench.

A fast path is a quicker way to do what a plain path (its fallback) does, which
leans on something that may not hold: a dependency's private internals, a file
format nobody promises to keep, a guess, a disk that stays fast. ``FAST_PATHS``
names each one once; everything else reads it from here: ``forced`` (the
switch), docs/server.md's fast-path table (scripts/gendocs.py), the bench that
runs each beside its fallback (its ``bench`` and ``row``) and the test that
the libraries each reaches into are pinned exactly (``libraries``). The
figures are a bench's, recorded in docs/scaling.md (``FIGURES``), not here.

``ELECTRIC_FORCE_FALLBACKS`` forces fallbacks, so the code that runs without
a trick is tested too: a comma-separated list of fast-path names, or ``all``;
an unknown name is an error naming the known ones. Each fast path reads its
switch once, where it is set up (the store when it opens, the HTTP door when
it is built, the acceptors when the server starts), not per call. ``make
test`` runs the HTTP, PostgreSQL and store tests once more with ``all``.

The modules of this package are the seams to private internals (``acceptors``,
``ready_queue``, ``wal_index``, ``http_cork``, ``route_table``): nothing
outside it touches what they reach into (tests/test_internals.py scans for
it), and each checks what it needs once and falls back, logging why, when the
installed version differs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["BENCH", "ENV", "FAST_PATHS", "FIGURES", "SEAMS", "FastPath", "forced", "forced_fallbacks"]

ENV = "ELECTRIC_FORCE_FALLBACKS"
# The bench that runs every fast path beside its forced fallback in one run, and where one
# run's figures are kept.
BENCH = "bench/bench_fastpaths.py"
FIGURES = "docs/scaling.md"


@dataclass(frozen=True, slots=True)
class FastPath:
    """One speed trick and its fallback."""

    name: str  # its switch: what ELECTRIC_FORCE_FALLBACKS names
    buys: str
    risks: str  # what it reaches into, or what may go wrong
    fallback: str  # what runs when it is forced off (or unavailable)
    home: str  # the module that owns it, from the repository's root
    row: str  # its row of BENCH, the fast path beside its fallback
    libraries: tuple[str, ...] = ()  # distributions whose internals it subclasses or clones


# fmt: off
FAST_PATHS: tuple[FastPath, ...] = (
    FastPath(
        "acceptors",
        "a busy gRPC server keeps taking calls: `--acceptors` more call requests outstanding per "
        "method than grpc.aio's one, which it re-arms three to four loop turns after each call",
        "grpc.aio's Cython core: the server's registered-call request, its method resolver and the "
        "coroutines its main loop schedules",
        "grpc's own acceptor alone",
        "server/electric_server/fastpaths/acceptors.py",
        "acceptors: SignalEntity calls/s, 64 callers",
        ("grpcio",),
    ),
    FastPath(
        "ready_queue",
        "a lone SQLite write commits in its caller, without the writer task's two turns of the loop",
        "asyncio's private ready deque (`BaseEventLoop._ready`), to tell a lone write from a crowd",
        "every write goes through the writer task",
        "server/electric_server/fastpaths/ready_queue.py",
        "ready_queue: SignalEntity p50, 1 caller",
    ),
    FastPath(
        "wal_index",
        "checkpoints follow the WAL frames really appended, so group commit checkpoints no more "
        "often than the frames call for",
        "the header of SQLite's WAL index (the `-shm` file): a documented file format, not a "
        "promised interface; a count read wrong costs an early or late checkpoint, never data",
        "each write counted as 3 frames: more checkpoints, never fewer",
        "server/electric_server/fastpaths/wal_index.py",
        "wal_index: SignalEntity calls/s, 64 callers on one entity",
    ),
    FastPath(
        "http_cork",
        "an HTTP answer's head and body leave in one `send` and one TCP segment, not two",
        "subclasses uvicorn's `H11Protocol` and wraps its transport; what a turn of the loop "
        "writes waits for the turn's end",
        "uvicorn's own `H11Protocol`",
        "server/electric_server/fastpaths/http_cork.py",
        "http_cork: POST signal req/s, 64 connections",
        ("uvicorn",),
    ),
    FastPath(
        "route_table",
        "a request finds its endpoint by its path's segments, without a regex per route, "
        "Starlette's middlewares and its exception wrapper",
        "clones Starlette's choice of route (the first whose path and method match) and hands "
        "it everything else; tested against Starlette's own `Router`",
        "Starlette's own `Router` routes every request",
        "server/electric_server/fastpaths/route_table.py",
        "route_table: POST signal req/s, 64 connections",
        ("starlette",),
    ),
    FastPath(
        "pg_one_trip",
        "a lone PostgreSQL write in one statement that commits by itself, after a read: two "
        "round trips instead of a transaction's four",
        "the connection lost while the statement is out leaves its outcome unknown; the writer "
        "ends that backend and looks for the commit's feed row",
        "a batch's transaction: BEGIN, the lock, the rows, COMMIT",
        "server/electric_server/store/postgres/one_trip.py",
        "pg_one_trip: SignalEntity p50, 1 caller, PostgreSQL",
    ),
    FastPath(
        "pg_guess",
        "a lone write on an entity this replica knows skips the read: one round trip",
        "decides on a guessed row, txid, clock and holder; the statement checks each and writes "
        "nothing on a wrong guess (a wasted trip, never a wrong write)",
        "the row read first (the one-statement write's two round trips)",
        "server/electric_server/store/postgres/guess.py",
        "pg_guess: SignalEntity p50, 1 caller, PostgreSQL",
    ),
    FastPath(
        "sqlite_inline_sync",
        "while recent WAL syncs were fast (a moving average), a sync runs on the event loop, "
        "without a hop to the sync thread and back",
        "a disk that turns slow stalls the loop for the syncs until the average moves them to "
        "the thread",
        "every sync in the sync thread",
        "server/electric_server/store/sqlite/inline_sync.py",
        "sqlite_inline_sync: SignalEntity p50, 1 caller",
    ),
)
# fmt: on
SEAMS = frozenset(path.name for path in FAST_PATHS)


def forced_fallbacks(value: str | None = None) -> frozenset[str]:
    """The fast paths whose fallback is forced: ``value``, else ``$ELECTRIC_FORCE_FALLBACKS``.

    Raises ValueError naming the known fast paths for an unknown name, so a typo
    is not silently a run without the fallback it meant to force.
    """
    text = os.environ.get(ENV, "") if value is None else value
    names = {part.strip() for part in text.split(",") if part.strip()}
    if "all" in names:
        return SEAMS
    unknown = names - SEAMS
    if unknown:
        raise ValueError(
            f"{ENV}: unknown seam {', '.join(sorted(unknown))}; known: {', '.join(sorted(SEAMS))} or all"
        )
    return frozenset(names)


def forced(name: str) -> bool:
    """Whether fast path ``name``'s fallback is forced (read when it is set up, not per call)."""
    if name not in SEAMS:
        raise ValueError(f"unknown seam {name!r}")
    return name in forced_fallbacks()
