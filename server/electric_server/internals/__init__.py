"""Our dependencies' private internals, each behind one small named seam with a fallback.

Three wins lean on things their owners do not promise to keep:

| seam | what it reaches into | the fallback |
|---|---|---|
| ``acceptors`` | grpc.aio's Cython core: extra outstanding call requests per method | grpc's own acceptor |
| ``ready_queue`` | asyncio's ready queue: a lone write skips the writer task | every write goes through the writer task |
| ``wal_index`` | SQLite's ``-shm`` header: checkpoints follow the frames really appended | 3 frames counted per write: more checkpoints, never fewer |

Each seam checks what it needs once and falls back, logging why, when the
installed version differs. Nothing outside this package touches those
internals (tests/test_internals.py scans for them).

The store's fast paths (``pg_one_trip``, ``pg_guess``, ``sqlite_inline_sync``:
store/fastpath.py) reach into nothing private but take their switches here too.

``ELECTRIC_FORCE_FALLBACKS`` forces fallbacks, so the code that runs on a
dependency without the internal is tested here too: a comma-separated list of
seam names, or ``all``. ``make test`` runs the store and accept tests once
more with every fallback forced.
"""

from __future__ import annotations

import os

__all__ = ["ENV", "SEAMS", "forced", "forced_fallbacks"]

ENV = "ELECTRIC_FORCE_FALLBACKS"
SEAMS = frozenset(
    {
        "acceptors",
        "ready_queue",
        "wal_index",
        # The store's fast paths: tricks of our own, each with its switch here (store/fastpath.py).
        "pg_guess",
        "pg_one_trip",
        "sqlite_inline_sync",
    }
)


def forced_fallbacks(value: str | None = None) -> frozenset[str]:
    """The seams whose fallback is forced: ``value``, else ``$ELECTRIC_FORCE_FALLBACKS``.

    Raises ValueError naming the known seams for an unknown name, so a typo is
    not silently a run without the fallback it meant to force.
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


def forced(seam: str) -> bool:
    """Whether ``seam``'s fallback is forced (read when the seam is set up, not per call)."""
    if seam not in SEAMS:
        raise ValueError(f"unknown seam {seam!r}")
    return seam in forced_fallbacks()
