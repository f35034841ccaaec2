"""The signals' calls of ``AsyncClient`` (docs/sdk.md, docs/signals.md), in a part of their own:
one signal (and its wait for a stop stage, _stages.py), the named shortcuts, one signal to many."""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, cast

from .. import errors
from .._proto.electric.v1 import entity_service_pb2 as api
from .._wire.enums import signal_to_pb, state_to_pb
from .._wire.stop_stages import bound_passed
from .._wire.times import duration_from_ms, timestamp_to_datetime
from ..arguments import RefLike, SignalLike, StateLike, json_argument, parse_ref, parse_signal, parse_states
from ..durations import MAX_WAIT_MS
from ..lifecycle import Signal, Stage
from ..models import SignalManyResult, SignalResult
from ._caller import Caller
from ._options import DurationLike
from ._sends import new_idempotency_key
from ._stages import stage_wait, wait_stages

__all__ = ["SignalCalls"]


class SignalCalls:
    """``AsyncClient``'s signals."""

    async def signal(
        self,
        ref: RefLike,
        signal: SignalLike,
        *,
        reason: str = "",
        payload: Any = None,
        message_key: str = "",
        idempotency_key: str | None = None,
        interrupt: bool = False,
        wait: Stage | str | None = None,
        timeout: DurationLike | None = None,  # noqa: ASYNC109 - a wait's bound, in every door alike
    ) -> SignalResult:
        """Send a signal; returns the RFC's result (previous → new state, txid). ``interrupt``
        (SIGTERM only): the step in progress is interrupted at once, as by SIGINT, so the cleanup
        runs within the grace with the run's partial output. ``wait``: a stage the signal has
        (``lifecycle.STAGES``: ``unwound``, ``terminal``, …); the answer then comes once that
        stage and those before it are settled, or ``timeout`` (from the signal's acceptance)
        passes, with each stage reached or not in ``stages``."""
        sig = parse_signal(signal)
        stage, timeout_s = stage_wait(sig, wait, timeout)
        request = api.SignalEntityRequest(
            ref=parse_ref(ref).to_pb(),
            signal=signal_to_pb(sig),
            reason=reason,
            message_key=message_key,
            interrupt=interrupt,
            idempotency_key=idempotency_key or new_idempotency_key(),
        )
        if payload is not None:
            request.payload.CopyFrom(json_argument(payload, "payload"))
        caller = cast(Caller, self)
        started = time.monotonic()
        if stage is None:
            response: api.SignalEntityResponse = await caller._call("SignalEntity", request)
            return SignalResult.from_pb(response)
        request.wait = stage.value  # the server answers at the stage (one call), or by its bound
        response, capped = await self._waiting_call(request, timeout_s, started)
        result = SignalResult.from_pb(response)
        if not result.stages or (capped and bound_passed(result.stages)):
            # A server that answers at once whatever the wait (from before waits over gRPC), or
            # whose answer a shorter bound than the caller's ended (the call's deadline, the
            # server's longest): this client folds the stream itself, for what is left.
            left = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - started))
            return await self.wait_signal(result, stage, left, message_key=message_key)
        return result

    async def _waiting_call(
        self, request: api.SignalEntityRequest, timeout_s: float | None, started: float
    ) -> tuple[api.SignalEntityResponse, bool]:
        """The signal with its wait, and whether the server's bound was shorter than the caller's.
        A call cut past its retries (its replica lost, the channel not yet on another) is made
        again with the same key, as patiently as a watch reconnects: the server replays the
        signal's answer and waits on from its record, for what is left of the timeout."""
        caller = cast(Caller, self)
        patience = timeout_s if timeout_s is not None else caller.options.reconnect_s
        while True:
            # A bound already spent is 0: the server answers at once with what is reached.
            left = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - started))
            server_s = None if left is None else min(left, MAX_WAIT_MS / 1000)
            request.ClearField("timeout")
            if server_s is not None:
                request.timeout.CopyFrom(duration_from_ms(round(server_s * 1000)))
            try:
                response = await caller._call("SignalEntity", request, wait_s=server_s or 0.0)
            except (errors.Unavailable, errors.DeadlineExceeded):
                if time.monotonic() - started >= patience:
                    raise
                await asyncio.sleep(caller.options.retry.max_backoff_s)  # the channel reconnects
                continue
            return response, server_s is None or server_s != left

    async def wait_signal(
        self,
        result: SignalResult,
        wait: Stage | str,
        timeout: DurationLike | None = None,  # noqa: ASYNC109 - a wait's bound, in every door alike
        *,
        message_key: str = "",
    ) -> SignalResult:
        """Wait for a stage of a signal already sent (its ``result``, as ``signal`` answered it
        without a wait): the same answer ``signal(..., wait=...)`` gives. ``message_key``: the
        message a scoped SIGINT named."""
        stage, timeout_s = stage_wait(result.signal, wait, timeout)
        assert stage is not None
        events = cast(Caller, self).watch(result.ref, result.raw.offset + 1)
        return await wait_stages(events, result, stage, timeout_s, message_key)

    async def interrupt(
        self,
        ref: RefLike,
        *,
        reason: str = "",
        wait: Stage | str | None = None,
        timeout: DurationLike | None = None,  # noqa: ASYNC109 - a wait's bound, in every door alike
    ) -> SignalResult:
        """SIGINT: abort the current run; the entity stays alive. ``wait="unwound"``: answer once
        the run's end is recorded (see ``signal``)."""
        return await self.signal(ref, Signal.SIGINT, reason=reason, wait=wait, timeout=timeout)

    async def reload(self, ref: RefLike, *, reason: str = "") -> SignalResult:
        """SIGHUP: finish the current run, then pick up new code on the next wake."""
        return await self.signal(ref, Signal.SIGHUP, reason=reason)

    async def terminate(
        self,
        ref: RefLike,
        *,
        reason: str = "",
        interrupt: bool = False,
        wait: Stage | str | None = None,
        timeout: DurationLike | None = None,  # noqa: ASYNC109 - a wait's bound, in every door alike
    ) -> SignalResult:
        """SIGTERM: graceful shutdown within the entity's grace period; ``interrupt``: the step in
        progress is cut at once rather than at its end, so the cleanup runs within the grace.
        ``wait="terminal"``: answer once the entity is `stopped` (see ``signal``)."""
        return await self.signal(
            ref, Signal.SIGTERM, reason=reason, interrupt=interrupt, wait=wait, timeout=timeout
        )

    async def kill(
        self,
        ref: RefLike,
        *,
        reason: str = "",
        wait: Stage | str | None = None,
        timeout: DurationLike | None = None,  # noqa: ASYNC109 - a wait's bound, in every door alike
    ) -> SignalResult:
        """SIGKILL: stop at once; no handler runs. ``wait="reaped"``: answer once an exec
        entity's processes are gone (see ``signal``)."""
        return await self.signal(ref, Signal.SIGKILL, reason=reason, wait=wait, timeout=timeout)

    async def pause(self, ref: RefLike, *, reason: str = "") -> SignalResult:
        """SIGSTOP: finish the current run, deliver no new message."""
        return await self.signal(ref, Signal.SIGSTOP, reason=reason)

    async def resume(self, ref: RefLike, *, reason: str = "") -> SignalResult:
        """SIGCONT: resume delivery of queued messages."""
        return await self.signal(ref, Signal.SIGCONT, reason=reason)

    async def usr(
        self,
        ref: RefLike,
        payload: Any = None,
        *,
        reason: str = "",
        wait: Stage | str | None = None,
        timeout: DurationLike | None = None,  # noqa: ASYNC109 - a wait's bound, in every door alike
    ) -> SignalResult:
        """SIGUSR: call the entity's on_signal handler with a JSON payload. ``wait="handled"``:
        answer once the handler returned (see ``signal``)."""
        return await self.signal(
            ref, Signal.SIGUSR, reason=reason, payload=payload, wait=wait, timeout=timeout
        )

    async def signal_many(
        self,
        signal: SignalLike,
        *,
        type: str | None = None,
        states: StateLike | Iterable[StateLike] | None = None,
        refs: Sequence[RefLike] = (),
        reason: str = "",
        payload: Any = None,
        idempotency_key: str | None = None,
        interrupt: bool = False,
    ) -> SignalManyResult:
        """One signal to every entity matching the selector (type and/or states, or refs).
        ``interrupt`` (SIGTERM only): each one's step in progress is interrupted at once, as by
        ``terminate(interrupt=True)``."""
        selector = api.EntitySelector(
            type=type or "",
            states=[state_to_pb(s) for s in parse_states(states)],
            refs=[parse_ref(r).to_pb() for r in refs],
        )
        request = api.SignalEntitiesRequest(
            selector=selector,
            signal=signal_to_pb(parse_signal(signal)),
            reason=reason,
            idempotency_key=idempotency_key or new_idempotency_key(),
            interrupt=interrupt,
        )
        if payload is not None:
            request.payload.CopyFrom(json_argument(payload, "payload"))
        response: api.SignalEntitiesResponse = await cast(Caller, self)._call("SignalEntities", request)
        return SignalManyResult(
            signalled=response.signalled,
            ignored=response.ignored,
            skipped=response.skipped,
            not_found=response.not_found,
            created_at=timestamp_to_datetime(response.created_at),
        )

    async def delete(self, ref: RefLike) -> SignalResult:
        """Deprecated: exactly SIGKILL with reason "legacy delete". Use kill()."""
        warnings.warn(
            "delete() is deprecated: it sends SIGKILL; call kill() instead", DeprecationWarning, stacklevel=2
        )
        request = api.DeleteEntityRequest(ref=parse_ref(ref).to_pb(), idempotency_key=new_idempotency_key())
        response: api.DeleteEntityResponse = await cast(Caller, self)._call("DeleteEntity", request)
        return SignalResult.from_pb(response.result)
