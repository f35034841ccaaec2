"""``AsyncClient.send``, and its wait for the run the message starts (issue 46, "One way to wait").

``send(ref, text, wait="run", timeout=...)`` sends the message, then watches
the entity's stream from the message's offset, folding it with
``_wire.run_outcome.RunFollow`` (the fold every door shares), until the run
ends. The watch is ``AsyncClient.watch``: it reconnects, to any of the
client's addresses, and resumes after the last event seen, so a broken
connection or a replica's death costs nothing. The timeout counts from the
message's acceptance; when it passes, ``RunNotEnded`` says where the run was,
and the message stays delivered. The client waits, not the server: over gRPC
a wait is a watch the client already has, and it resumes on any replica.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Literal, cast, overload

import anyio

from .. import busy, errors
from .._proto.electric.v1 import entity_service_pb2 as api
from .._wire.enums import state_from_pb
from .._wire.run_outcome import WAIT_KINDS, RunFollow
from .._wire.times import timestamp_to_datetime
from ..arguments import RefLike, json_argument, parse_ref
from ..durations import format_ms
from ..models import EntityRef, Event, MessageReceipt, RunResult
from ._caller import Caller
from ._options import DurationLike, to_duration

__all__ = [
    "SendCalls",
    "busy_policy_argument",
    "follow_run",
    "message_receipt",
    "new_idempotency_key",
    "run_result",
    "wait_timeout_s",
]


class SendCalls:
    """``AsyncClient``'s sends."""

    @overload
    async def send(
        self,
        ref: RefLike,
        text: str = "",
        *,
        data: Any = None,
        idempotency_key: str | None = None,
        wait: None = None,
        timeout: DurationLike | None = None,  # noqa: ASYNC109 - a wait's bound, in every door alike
        policy: str | None = None,
    ) -> MessageReceipt: ...

    @overload
    async def send(
        self,
        ref: RefLike,
        text: str = "",
        *,
        data: Any = None,
        idempotency_key: str | None = None,
        wait: Literal["run"],
        timeout: DurationLike | None = None,  # noqa: ASYNC109 - a wait's bound, in every door alike
        policy: str | None = None,
    ) -> RunResult: ...

    async def send(
        self,
        ref: RefLike,
        text: str = "",
        *,
        data: Any = None,
        idempotency_key: str | None = None,
        wait: Literal["run"] | None = None,
        timeout: DurationLike | None = None,  # noqa: ASYNC109 - a wait's bound, in every door alike
        policy: str | None = None,
    ) -> MessageReceipt | RunResult:
        """Send the entity a message; its receipt. With ``wait="run"``, wait for the run it starts
        and answer how it ended (``RunResult``); past ``timeout`` (from the message's acceptance;
        None: no bound), ``RunNotEnded`` (the message stays delivered). ``policy``: what it does
        if a run is in progress ("enqueue", "reject", "interrupt", "rollback", "steer"; None: its type's
        policy; docs/double-texting.md): a rejected message raises ``EntityBusy``."""
        timeout_s = wait_timeout_s(wait, timeout)
        r = parse_ref(ref)
        request = api.SendMessageRequest(
            ref=r.to_pb(),
            text=text,
            idempotency_key=idempotency_key or new_idempotency_key(),
            policy=busy_policy_argument(policy),
        )
        if data is not None:
            request.data.CopyFrom(json_argument(data, "data"))
        receipt = message_receipt(r, await cast(Caller, self)._call("SendMessage", request))
        if wait is None:
            return receipt
        return await self.wait_run(receipt, timeout_s)

    async def wait_run(self, receipt: MessageReceipt, timeout_s: float | None = None) -> RunResult:
        """Wait for the run of the message ``receipt`` names; ``RunNotEnded`` after ``timeout_s``."""
        run = RunFollow(receipt.key, entity_state=receipt.state.value)
        with anyio.move_on_after(timeout_s):
            await follow_run(cast(Caller, self).watch(receipt.ref, receipt.offset), run)
            return run_result(receipt, run)
        bound = format_ms(round((timeout_s or 0) * 1000))
        raise errors.RunNotEnded(
            f"the run of {receipt.key} on {receipt.ref.url} had not ended within {bound} "
            f"(it is {run.status}); the message stays delivered",
            receipt=receipt,
            run_status=run.status,
        )


async def follow_run(events: AsyncIterator[Event], run: RunFollow) -> None:
    """Fold ``events`` into ``run`` until the run ends (or the stream closes)."""
    watch = cast(AsyncGenerator[Event, None], events)
    async with contextlib.aclosing(watch) as stream:  # closed at the end: the server stream ends now
        async for event in stream:
            run.see(event.type, event.key, event.value, event.offset)
            if run.ended:
                return
    run.stream_closed()


def busy_policy_argument(policy: str | None) -> str:
    """A send's ``policy``, checked before anything is sent ("" the type's)."""
    try:
        parsed = busy.parse(policy or "")
    except ValueError as exc:
        raise errors.InvalidArgument(str(exc), code="INVALID_BUSY_POLICY") from None
    return parsed.value if parsed else ""


def wait_timeout_s(wait: str | None, timeout: DurationLike | None) -> float | None:
    """The wait's bound in seconds, once both are checked: an unknown wait, or a timeout without
    a wait, is refused before anything is sent."""
    if wait is not None and wait not in WAIT_KINDS:
        raise errors.InvalidArgument(
            f"wait must be one of {', '.join(WAIT_KINDS)}, got {wait!r}", code="UNKNOWN_WAIT"
        )
    if timeout is None:
        return None
    if wait is None:
        raise errors.InvalidArgument("a timeout needs something to wait for (wait='run')", code="USAGE")
    try:
        return to_duration(timeout).ToMilliseconds() / 1000
    except ValueError as exc:
        raise errors.InvalidArgument(f"timeout: {exc}", code="INVALID_DURATION") from None


def run_result(receipt: MessageReceipt, run: RunFollow) -> RunResult:
    return RunResult(receipt, run.status, run.output, run.error, run.attempt, run.entity_state, run.question)


def message_receipt(
    ref: EntityRef, response: api.SendMessageResponse | api.RetryRunResponse
) -> MessageReceipt:
    state = state_from_pb(response.state)
    assert state is not None
    created = timestamp_to_datetime(response.created_at)
    if isinstance(response, api.RetryRunResponse):
        return MessageReceipt(ref, response.key, response.offset, response.txid, created, state)
    return MessageReceipt(
        ref,
        response.key,
        response.offset,
        response.txid,
        created,
        state,
        response.policy,
        response.signal_key,
    )


def new_idempotency_key() -> str:
    return uuid.uuid4().hex
