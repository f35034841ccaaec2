"""Which event types a stream holds: the built-in ones the server writes, and the rule for those an
entity's code emits (``ctx.emit``).

One home for both sides. The server refuses a custom event of a type this rule does not take
(``INVALID_EVENT_TYPE``, nothing written): a worker is not trusted to have checked. The SDK
checks before sending, so a handler fails the same way in the ``EntityHarness``, which has no
server, as against a real one, and without a round trip.
"""

from __future__ import annotations

import re

__all__ = ["BUILTIN_TYPES", "CONTROL_RE", "MAX_LABEL_CHARS", "custom_type_problem", "is_label"]

# The event types the server writes itself (docs/server.md, "Events").
BUILTIN_TYPES = frozenset({"signal", "state", "message", "run", "exec", "output"})
# C0 and C1 control characters: a label with one cannot be shown on one line, nor keyed safely.
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
MAX_LABEL_CHARS = 128


def is_label(value: str) -> bool:
    """1-128 characters, none of them a control character."""
    return 0 < len(value) <= MAX_LABEL_CHARS and not CONTROL_RE.search(value)


def custom_type_problem(kind: str) -> str | None:
    """Why ``kind`` cannot be a custom event's type, or None when it can."""
    if kind in BUILTIN_TYPES or not is_label(kind):
        return (
            f"{kind!r} is not an entity-defined event type (1-{MAX_LABEL_CHARS} characters, no control "
            "character, not a built-in type)"
        )
    return None
