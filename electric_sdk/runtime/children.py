"""Child entities from entity code: ``ctx.spawn`` and ``ctx.send``, each a recorded step.

A spawn or a send is a side effect on the server, so each runs as a recorded
step whose idempotency key is the step's own (``ctx.step_key``): a run delivered
again replays the step's record and does not spawn or send twice, and a step
retried after a crash mid-call repeats the same request, which the server
answers once. They reach the server through the worker's client (the addresses
it was given). The child records the running entity as its parent, so the
parent's SIGTERM and SIGKILL cascade to it (docs/runtime.md, "Child entities").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from ..client._options import DurationLike
from ..models import EntityRef, RunResult

if TYPE_CHECKING:
    from .context import Context

__all__ = ["send_step", "spawn_step"]


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
        return entity.ref.url

    return EntityRef.parse(await ctx.step(f"electric:spawn {child.url}", spawn))


async def send_step(
    ctx: Context,
    ref: str | EntityRef,
    text: str,
    data: Any,
    wait: Literal["run"] | None,
    timeout: DurationLike | None,  # noqa: ASYNC109 - the wait's bound, as client.send's
) -> dict[str, Any]:
    target = EntityRef.parse(ref)

    async def send() -> dict[str, Any]:
        client = ctx._host.client()
        key = ctx.step_key
        if wait == "run":
            result: RunResult = await client.send(
                target, text, data=data, idempotency_key=key, wait="run", timeout=timeout
            )
            return result.to_json()
        receipt = await client.send(target, text, data=data, idempotency_key=key)
        return receipt.to_json()

    return await ctx.step(f"electric:send {target.url}", send)
