"""Command blocks of the docs, run as written and checked against their comments.

A comment states what its command prints: each `backticked` fragment must
appear in the output (``…`` stands for anything; runs of spaces count as
one), and ``exit N`` is the exit status (else 0). Used by test_readme.py and
test_getting_started.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# A command's comment starts at "#" after at least two spaces (a "#" inside a command stays).
COMMENT = re.compile(r"\s{2,}#\s?(.*)$")
TICKS = re.compile(r"`([^`]+)`")
EXIT = re.compile(r"\bexit (\d+)\b")


@dataclass
class Line:
    command: str
    comment: str

    @property
    def background(self) -> bool:
        return self.command.endswith("&")

    @property
    def expected_exit(self) -> int:
        found = EXIT.search(self.comment)
        return int(found.group(1)) if found else 0

    @property
    def fragments(self) -> list[str]:
        return TICKS.findall(self.comment)


def lines(block: str) -> list[Line]:
    """A shell block's commands with their comments (comment-only and blank lines dropped)."""
    parsed = []
    for raw in block.splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        found = COMMENT.search(raw)
        command = raw[: found.start()] if found else raw
        parsed.append(Line(command.strip(), found.group(1) if found else ""))
    return parsed


def comment_fragments(code: str) -> list[str]:
    """The backticked fragments of every comment in a block of code (what it prints, in order)."""
    return [f for raw in code.splitlines() if (m := COMMENT.search(raw)) for f in TICKS.findall(m.group(1))]


def _squeeze(text: str) -> str:
    return re.sub(r"[ \t]+", " ", text)


def check_output(what: object, output: str, fragments: list[str]) -> None:
    for fragment in fragments:
        pattern = ".*?".join(re.escape(_squeeze(part)) for part in fragment.split("…"))
        assert re.search(pattern, _squeeze(output), re.S), f"{what!r}: {fragment!r} not in:\n{output}"
