"""At most one log line per kind per interval, for faults that recur with every call.

A refusal logged on every call would drown the log (a full disk refuses every
write); one logged once would hide that it goes on. So a kind is logged at
most once per interval, and that line counts the occurrences left out since
the last one.
"""

from __future__ import annotations

import time

__all__ = ["LogThrottle"]


class LogThrottle:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._left_out: dict[str, int] = {}

    def admit(self, kind: str) -> int | None:
        """None: ``kind`` was logged within the interval (this one is counted, not logged).
        Otherwise log it now, saying how many were left out since its last line (returned)."""
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval_s:
            self._left_out[kind] = self._left_out.get(kind, 0) + 1
            return None
        self._last[kind] = now
        return self._left_out.pop(kind, 0)
