"""Child entities from entity code: ``ctx.spawn`` and ``ctx.send``, each a recorded step.

A spawn or a send is a side effect on the server, so each runs as a recorded
step whose idempotency key is the step's own (``ctx.step_key``): a run delivered
again replays the step's record and does not spawn or send twice, and a step
retried after a crash mid-call repeats the same request, which the server
answers once. They reach the server through the worker's client (the addresses
it was given). The child records the running entity as its parent, so the
parent's SIGTERM and SIGKILL cascade to it (docs/runtime.md, "Child entities").

Each spawn and send the server answered is also recorded in the parent's stream,
an ``electric.child`` record of the run (``{"phase": "spawned" | "sent", "run",
"child", "message"}``), before the run's end: a SIGINT that aborts the run
reaches the children named there (server core/child_interrupts.py), and the stop
fold's ``downstream`` stage waits for them (_wire/stop_stages.py). A send cut
before its answer is recorded with no message key: its child's SIGINT is then
unscoped. A send with ``wake=True`` says so in its record (with the message's
offset): the server delivers that run's end to this entity as a message (server
core/child_wakes.py).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Literal

import anyio

from .. import errors
from .._proto.electric.v1 import runtime_service_pb2 as rt
from .._wire.json_values import json_to_value
from ..client._options import DurationLike
from ..client._sends import wait_timeout_s
from ..models import EntityRef

if TYPE_CHECKING:
    from .context import Context

__all__ = ["CHILD_EVENT", "send_step", "spawn_step"]

CHILD_EVENT = "electric.child"
RECORD_BOUND_S = 5.0  # a cut send's record waits this long at most


async def _record(ctx: Context, phase: str, child: EntityRef, message: str = "", **more: Any) -> None:
    fenced = getattr(ctx._host, "_fenced", None)
    if fenced is None:  # the test harness keeps no stream
        return
    data = {"phase": phase, "run": ctx.message_key, "child": child.url, "message": message, **more}
    # Written straight through the lease, as runtime/mcp.py's records: before the run's end.
    await fenced.write(retry=True, custom=rt.CustomEvent(type=CHILD_EVENT, data=json_to_value(data)))


async def spawn_step(
    ctx: Context, ref: str | EntityRef, grace_period: DurationLike | None, idle_timeout: DurationLike | None
) -> EntityRef:
    child = EntityRef.parse(ref)

    async def spawn() -> str:
        entity = await ctx._host.client().spawn(
            child,
            grace_period=grace_period,
            idle_timeout=idle_timeout,
            idempotency_key=ctx.step_key,
            parent=ctx.ref,
        )
        await _record(ctx, "spawned", entity.ref)
        return entity.ref.url

    return EntityRef.parse(await ctx.step(f"electric:spawn {child.url}", spawn))


async def send_step(
    ctx: Context,
    ref: str | EntityRef,
    text: str,
    data: Any,
    wait: Literal["run"] | None,
    timeout: DurationLike | None,  # noqa: ASYNC109 - the wait's bound, as client.send's
    wake: bool = False,
) -> dict[str, Any]:
    target = EntityRef.parse(ref)
    timeout_s = wait_timeout_s(wait, timeout)  # checked before anything is sent
    if wake and wait is not None:
        raise errors.InvalidArgument(
            "wake=True wakes this entity when the run ends; it does not combine with wait='run'",
            code="USAGE",
        )

    async def send() -> dict[str, Any]:
        client = ctx._host.client()
        try:
            receipt = await client.send(target, text, data=data, idempotency_key=ctx.step_key)
        except anyio.get_cancelled_exc_class():
            # The message may have landed: its child's SIGINT must still find it (unscoped).
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(RECORD_BOUND_S),
                contextlib.suppress(Exception),
            ):
                await _record(ctx, "sent", target)
            raise
        # wake: the server delivers the run's end to this entity (server core/child_wakes.py).
        wake_me = {"offset": receipt.offset, "wake": True} if wake else {}
        await _record(ctx, "sent", target, receipt.key, **wake_me)
        if wait == "run":
            return (await client.wait_run(receipt, timeout_s)).to_json()
        return receipt.to_json()

    return await ctx.step(f"electric:send {target.url}", send)
