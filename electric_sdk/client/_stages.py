"""A signal's answer that waits for a stage (issue 48, "Staged receipts").

``signal(ref, sig, wait="unwound", timeout="5s")`` asks the server to answer
at the stage (``SignalEntityRequest.wait``: the server folds the stream,
server core/signal_answers.py). This module is the client's own fold, for
what the server's answer leaves open: a wait without a timeout that outlasts
the call's deadline, a server from before these fields, and ``wait_signal``
for a signal already sent. It watches the entity's stream from the signal's
record, folding it with ``_wire.stop_stages.StageFollow`` (the fold every
door shares), until the stage waited for and every one before it is settled.
The watch reconnects and resumes like any other, so a broken connection or a
replica's death costs nothing. When the timeout (from the signal's
acceptance) passes first, the answer still comes: the stages not reached say
"not reached within …", as a stage the worker's loss made unreachable says
so. Which signal has which stage is ``lifecycle.STAGES``; a stage a signal
does not have, or a timeout with nothing to wait for, is refused before
anything is sent.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

import anyio

from .. import errors
from .._wire.stop_stages import StageFollow, parse_stage
from .._wire.times import to_iso
from ..durations import format_ms
from ..lifecycle import Signal, Stage, StageUnavailable
from ..models import Event, SignalResult
from ._options import DurationLike, to_duration

__all__ = ["follow_result", "stage_wait", "wait_stages"]


def stage_wait(
    signal: Signal, wait: str | Stage | None, timeout: DurationLike | None
) -> tuple[Stage | None, float | None]:
    """The stage to wait for and the bound in seconds, both checked before anything is sent."""
    stage: Stage | None = None
    if wait is not None:
        try:
            stage = parse_stage(signal, wait.value if isinstance(wait, Stage) else str(wait))
        except StageUnavailable as exc:
            raise errors.InvalidArgument(str(exc), code=StageUnavailable.reason) from None
        except ValueError as exc:
            raise errors.InvalidArgument(str(exc), code="UNKNOWN_WAIT") from None
    if timeout is None:
        return stage, None
    if stage is None:
        raise errors.InvalidArgument("a timeout needs a stage to wait for (wait=...)", code="USAGE")
    try:
        return stage, to_duration(timeout).ToMilliseconds() / 1000
    except ValueError as exc:
        raise errors.InvalidArgument(f"timeout: {exc}", code="INVALID_DURATION") from None


def follow_result(result: SignalResult, stage: Stage, message_key: str = "") -> StageFollow:
    """The stage fold of a signal's answer (``message_key``: a scoped SIGINT's), fed the events
    after its record by whoever watches the stream."""
    raw = result.raw
    return StageFollow(
        result.signal,
        result.key,
        raw.offset,
        to_iso(result.created_at),
        stage,
        run_message_key=raw.run_message_key,
        process_running=raw.process_running,
        message_key=message_key,
        outcome=result.outcome,
        state=result.new_state,
    )


async def wait_stages(
    events: AsyncIterator[Event],
    result: SignalResult,
    stage: Stage,
    timeout_s: float | None,
    message_key: str = "",
) -> SignalResult:
    """Fold ``events`` (a watch from just after the signal's record) until ``stage`` is settled,
    or ``timeout_s`` passes; ``result`` with its stages. ``message_key``: a scoped SIGINT's."""
    follow = follow_result(result, stage, message_key)
    watch = cast(AsyncGenerator[Event, None], events)
    with anyio.move_on_after(timeout_s) as bound:
        if not follow.done:
            async with contextlib.aclosing(watch) as stream:
                async for event in stream:
                    follow.see(event.type, event.key, event.value, event.offset, to_iso(event.timestamp))
                    if follow.done:
                        break
                else:
                    follow.stream_closed()
    if bound.cancelled_caught:
        follow.timed_out(format_ms(round((timeout_s or 0) * 1000)))
    follow.finish()
    return dataclasses.replace(result, stages=tuple(follow.reports[s] for s in follow.reports))
