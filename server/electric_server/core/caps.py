"""Per-principal caps on what a caller may hold open: streams and worker sessions.

A stream (a ``WatchEvents``, a ``WatchEntities`` or a runtime's ``Connect``)
holds memory and a task for as long as it is open, and a worker session
leases entities; neither costs its caller anything to keep. So each principal
(the ``principal`` of a token; without ``--tokens`` every caller is the one
anonymous principal: all loopback clients share one address, so addresses
would tell nobody apart) may hold at most ``max_streams`` streams and
``max_sessions`` sessions; past that a new one is refused with
``RESOURCE_EXHAUSTED`` and ``TOO_MANY_STREAMS`` or ``TOO_MANY_SESSIONS``, and
closing one frees its slot. A slot is taken once per stream, never per
message: the hot paths do not see the caps.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..settings import MAX_SESSIONS, MAX_STREAMS
from .errors import resource_exhausted


class Caps:
    def __init__(self, max_streams: int = MAX_STREAMS.value, max_sessions: int = MAX_SESSIONS.value) -> None:
        self.max_streams = max_streams
        self.max_sessions = max_sessions
        self.streams: dict[str, int] = {}  # per principal, the slots held
        self.sessions: dict[str, int] = {}

    @contextmanager
    def stream(self, principal: str) -> Iterator[None]:
        """Hold one of ``principal``'s stream slots while the block runs (a stream is open)."""
        with _slot(
            self.streams,
            principal,
            self.max_streams,
            "TOO_MANY_STREAMS",
            "streams (watches and runtime sessions)",
        ):
            yield

    def check_stream(self, principal: str) -> None:
        """Refuse now, as ``stream`` would, if ``principal`` holds every stream slot: for a
        response whose status goes out before its stream opens (an SSE read answers 429 rather
        than 200 and a silent end). The stream still takes its slot when it opens."""
        with self.stream(principal):
            pass

    @contextmanager
    def session(self, principal: str) -> Iterator[None]:
        """Hold one of ``principal``'s worker-session slots while the block runs."""
        with _slot(self.sessions, principal, self.max_sessions, "TOO_MANY_SESSIONS", "worker sessions"):
            yield


@contextmanager
def _slot(held: dict[str, int], principal: str, cap: int, reason: str, what: str) -> Iterator[None]:
    count = held.get(principal, 0)
    if count >= cap:
        raise resource_exhausted(
            reason,
            f"principal {principal!r} already holds {count} open {what}, the most it may; close one first",
            principal=principal,
            limit=str(cap),
        )
    held[principal] = count + 1
    try:
        yield
    finally:
        left = held[principal] - 1
        if left:
            held[principal] = left
        else:
            del held[principal]
