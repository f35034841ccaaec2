"""Durations as people write them: ``500ms``, ``10s``, ``2m``, ``1h``, ``1m30s``.

A bare number is seconds. Everything is kept in whole milliseconds, the
smallest unit any electric duration takes.
"""

from __future__ import annotations

import re

__all__ = ["MAX_WAIT_MS", "format_ms", "parse_ms"]

# The longest the server holds an answer (a signal's stage, HTTP's message run), and how long
# one with neither a timeout nor a call deadline waits: a call open longer is more likely an
# intermediary's casualty than a caller's wish. The SDK waits on past it by itself.
MAX_WAIT_MS = 3_600_000

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def parse_ms(text: str) -> int:
    """Parse a duration into milliseconds; ValueError with a clear message."""
    s = text.strip().lower()
    if s.startswith("-"):
        raise ValueError(f"invalid duration {text!r}: negative durations are refused (use e.g. 500ms or 10s)")
    if re.fullmatch(r"\d+(?:\.\d+)?", s):
        return round(float(s) * 1000)
    pos, total = 0, 0.0
    for match in _PART.finditer(s):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_MS[match.group(2)]
        pos = match.end()
    if not s or pos != len(s):
        raise ValueError(f"invalid duration {text!r}: use e.g. 500ms, 10s, 2m, 1h or 1m30s")
    return round(total)


def format_ms(ms: int) -> str:
    if ms % 3_600_000 == 0 and ms:
        return f"{ms // 3_600_000}h"
    if ms % 60_000 == 0 and ms:
        return f"{ms // 60_000}m"
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"
