"""A process's stdout and stderr, into the entity's stream as bounded ``output`` events.

Bytes are read as they come and written in chunks: whatever arrived within
``FLUSH_S`` of the first pending byte, at most ``CHUNK_CHARS`` per event, so a
chatty process costs a bounded number of writes. Each stream of a generation
keeps at most ``limit`` bytes; beyond that the pipe is still drained (a full
pipe would block the process) but the bytes are only counted, and one chunk
marked ``truncated`` says how many were dropped.
"""

from __future__ import annotations

import codecs
import contextlib
import math
import os
from collections.abc import Awaitable, Callable
from typing import IO

import anyio

from ..._proto.electric.v1 import types_pb2 as pb

__all__ = ["CHUNK_CHARS", "FLUSH_S", "OutputPump"]

CHUNK_CHARS = 16 * 1024
FLUSH_S = 0.02
_READ = 64 * 1024

Emit = Callable[[pb.ExecOutput], Awaitable[None]]


class OutputPump:
    def __init__(
        self,
        stream: IO[bytes],
        name: str,
        task_id: str,
        generation: int,
        limit: int,
        emit: Emit,
        tap: Callable[[bytes], None] | None = None,
    ):
        self._fd = stream.fileno()
        os.set_blocking(self._fd, False)
        self._name, self._task_id, self._generation = name, task_id, generation
        self._limit, self._emit = limit, emit
        # Sees every byte as it is read, before the limit (a reply is read whole: exec/reply.py);
        # b"" once at the end.
        self._tap = tap
        self._kept = 0
        self._dropped = 0
        self._told_dropped = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.done = anyio.Event()

    async def run(self) -> None:
        pending, first = "", math.inf
        try:
            eof = False
            while not eof:
                wait = math.inf if not pending else max(0.0, first + FLUSH_S - anyio.current_time())
                with anyio.move_on_after(wait):
                    await anyio.wait_readable(self._fd)
                    data = b""
                    with contextlib.suppress(BlockingIOError):
                        data = os.read(self._fd, _READ)
                        eof = not data
                        if self._tap is not None and data:
                            self._tap(data)
                    text = self._keep(data)
                    if text and not pending:
                        first = anyio.current_time()
                    pending += text
                if pending and (
                    eof or len(pending) >= CHUNK_CHARS or anyio.current_time() >= first + FLUSH_S
                ):
                    await self._flush(pending)
                    pending, first = "", math.inf
                elif self._dropped and not self._told_dropped and not pending:
                    await self._flush("")  # once, when dropping starts; the total comes at EOF
            pending += self._decoder.decode(b"", final=True)
            if pending or self._dropped > self._told_dropped:
                await self._flush(pending)
        except OSError:
            pass  # the pipe was closed under us: the generation is gone
        finally:
            if self._tap is not None:
                self._tap(b"")
            self.done.set()

    def _keep(self, data: bytes) -> str:
        room = max(0, self._limit - self._kept)
        kept, dropped = data[:room], len(data) - min(room, len(data))
        self._kept += len(kept)
        self._dropped += dropped
        return self._decoder.decode(kept) if kept else ""

    async def _flush(self, text: str) -> None:
        chunks = [text[i : i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS)] or [""]
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            truncated = last and self._dropped > self._told_dropped
            if truncated:
                self._told_dropped = self._dropped
            await self._emit(
                pb.ExecOutput(
                    task_id=self._task_id,
                    generation=self._generation,
                    stream=self._name,
                    text=chunk,
                    truncated=truncated,
                    dropped_bytes=self._dropped,
                )
            )
