"""How an exec entity's reply to a message is read from its stdout (issue 46, "Exec replies").

Without a ``Reply`` a message's run completes once its line is on the
process's stdin, and whatever the process prints later is only ``output``
events that no run owns. With one, the run stays in progress after the line
is written and completes with the reply as its output:

- ``Reply.until_line("END")``: the lines up to a line that is exactly the delimiter (which is
  not part of the reply);
- ``Reply.lines(n)``: the next ``n`` lines;
- ``Reply.idle("200ms")``: everything from the first byte until stdout has been quiet that long.

Each takes a ``timeout``: a reply not read whole that long after the line was written fails its
run, with what was read so far as its output (without one, a reply that never comes keeps the
run in progress until a signal or the caller's own bound).

The reply starts with the line's writing: what the process printed before it belongs to no
message. Lines end at ``\\n``; a reply's text has no final newline. The process's stdout ending
first (it exited, or was stopped) ends the run ``aborted`` with what was read so far; a SIGINT
aborts it as well. Every byte still goes into the stream as ``output`` events too.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from ...client._options import DurationLike, to_duration
from ..entity_type import DefinitionError

__all__ = ["Reply", "ReplyReader"]

ReplyKind = Literal["until_line", "lines", "idle"]


@dataclass(frozen=True)
class Reply:
    """How a message's reply is read from stdout; build it with the class methods."""

    kind: ReplyKind
    delimiter: str = ""
    count: int = 0
    gap: DurationLike | None = None
    # How long after the line is written the reply may take (None: no bound).
    timeout: DurationLike | None = None

    @classmethod
    def until_line(cls, delimiter: str, *, timeout: DurationLike | None = None) -> Reply:
        """The lines up to a line that is exactly ``delimiter``."""
        return cls("until_line", delimiter=delimiter, timeout=timeout)

    @classmethod
    def lines(cls, count: int, *, timeout: DurationLike | None = None) -> Reply:
        """The next ``count`` lines."""
        return cls("lines", count=count, timeout=timeout)

    @classmethod
    def idle(cls, gap: DurationLike, *, timeout: DurationLike | None = None) -> Reply:
        """Everything from the first byte until stdout is quiet for ``gap``."""
        return cls("idle", gap=gap, timeout=timeout)

    @classmethod
    def from_table(cls, table: Any, where: str) -> Reply:
        """The TOML form: ``reply = { until_line = "END" }``, ``{ lines = 1 }`` or ``{ idle = "200ms" }``,
        each optionally with ``timeout = "30s"``."""
        kinds = dict(table) if isinstance(table, dict) else {}
        timeout = kinds.pop("timeout", None)
        if not isinstance(table, dict) or len(kinds) != 1:
            raise DefinitionError(
                f'{where}: reply must be one of {{ until_line = "END" }}, {{ lines = 1 }}, {{ idle = "200ms" }}'
                ', each optionally with timeout = "30s"'
            )
        if timeout is not None and not isinstance(timeout, str):
            raise DefinitionError(f'{where}: reply.timeout must be a duration string, such as "30s"')
        ((kind, value),) = kinds.items()
        if kind == "until_line" and isinstance(value, str):
            return cls.until_line(value, timeout=timeout)
        if kind == "lines" and isinstance(value, int) and not isinstance(value, bool):
            return cls.lines(value, timeout=timeout)
        if kind == "idle" and isinstance(value, str):
            return cls.idle(value, timeout=timeout)
        raise DefinitionError(
            f"{where}: reply.{kind}: unknown, or of the wrong kind (a string, a whole number)"
        )

    def check(self, where: str) -> None:
        """DefinitionError when this reply could never be read."""
        if self.timeout is not None:
            try:
                timeout_ms = to_duration(self.timeout).ToMilliseconds()
            except ValueError as exc:
                raise DefinitionError(f"{where}: reply timeout: {exc}") from None
            if timeout_ms <= 0:
                raise DefinitionError(f"{where}: reply timeout must be greater than 0")
        if self.kind == "until_line":
            if not self.delimiter or "\n" in self.delimiter or "\r" in self.delimiter:
                raise DefinitionError(f"{where}: reply delimiter must be a non-empty line without a newline")
        elif self.kind == "lines":
            if not isinstance(self.count, int) or self.count < 1:
                raise DefinitionError(f"{where}: reply lines must be a whole number ≥ 1")
        elif self.kind == "idle":
            try:
                gap_ms = to_duration(self.gap if self.gap is not None else 0).ToMilliseconds()
            except ValueError as exc:
                raise DefinitionError(f"{where}: reply idle: {exc}") from None
            if gap_ms <= 0:
                raise DefinitionError(f"{where}: reply idle gap must be greater than 0")
        else:
            raise DefinitionError(f"{where}: reply kind {self.kind!r} is not until_line, lines or idle")

    @property
    def gap_s(self) -> float:
        return to_duration(self.gap if self.gap is not None else 0).ToMilliseconds() / 1000

    @property
    def timeout_s(self) -> float | None:
        return None if self.timeout is None else to_duration(self.timeout).ToMilliseconds() / 1000

    def describe(self) -> str:
        if self.kind == "until_line":
            return f"until the line {self.delimiter!r}"
        if self.kind == "lines":
            return f"{self.count} line{'s' if self.count != 1 else ''}"
        return f"until stdout is quiet for {round(self.gap_s * 1000)}ms"


class ReplyReader:
    """One generation's stdout, as replies: ``feed`` gets its bytes (from its output pump), ``read``
    waits for the reply of the message whose line was just written."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""
        self._reading = False
        self._closed = False
        self._changed = anyio.Event()

    def feed(self, data: bytes) -> None:
        """Bytes from stdout; ``b""``: stdout ended."""
        if data:
            text = self._decoder.decode(data)
        else:
            text, self._closed = self._decoder.decode(b"", final=True), True
        if self._reading:
            self._text += text
        self._changed.set()

    def begin(self) -> None:
        """A message's line is about to be written: its reply starts now."""
        self._text, self._reading = "", True

    @property
    def partial(self) -> str:
        return self._text.removesuffix("\n")

    async def read(self) -> tuple[str, bool]:
        """The reply, and whether it is whole (False: stdout ended first; the text read so far)."""
        try:
            while True:
                found = self._complete()
                if found is not None:
                    return found, True
                if self._closed:
                    return self.partial, False
                if self.reply.kind == "idle" and self._text:
                    with anyio.move_on_after(self.reply.gap_s):
                        await self._next_change()
                        continue
                    return self.partial, True
                await self._next_change()
        finally:
            self._reading = False

    async def _next_change(self) -> None:
        self._changed = anyio.Event()
        await self._changed.wait()

    def _complete(self) -> str | None:
        reply, text = self.reply, self._text
        if reply.kind == "until_line":
            lines = text.split("\n")
            for i, line in enumerate(lines[:-1]):  # complete lines only
                if line.removesuffix("\r") == reply.delimiter:
                    return "\n".join(lines[:i])
            return None
        if reply.kind == "lines":
            lines = text.split("\n")
            if len(lines) - 1 >= reply.count:
                return "\n".join(lines[: reply.count])
            return None
        return None
