"""The test hook between planning an action and issuing it.

Every action on a generation is planned (what, to which generation, why),
then the hook runs, then the generation is re-observed and the action issued
only if it is still proved. A race test installs a hook that changes the
process in that window (kills it, reaps it behind the runtime's back, ...)
and checks that nothing is sent::

    from electric_sdk.runtime.exec import ActionPlan, action_hook

    async def race(plan: ActionPlan) -> None:
        if plan.action == "graceful":
            os.kill(plan.evidence.pid, signal.SIGKILL)

    with action_hook(race):
        ...

The hook is process-wide and meant for tests; it may be sync or async.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .evidence import Evidence

__all__ = ["ActionHook", "ActionPlan", "action_hook", "run_hook", "set_action_hook"]


@dataclass(frozen=True)
class ActionPlan:
    task_id: str
    evidence: Evidence
    # "graceful", "force" or "forward"
    action: str
    # "SIGTERM", "SIGKILL", "stdin:close", "terminate", "SIGSTOP", ...
    name: str
    group: bool
    reason: str


ActionHook = Callable[[ActionPlan], Awaitable[None] | None]
_hook: ActionHook | None = None


def set_action_hook(hook: ActionHook | None) -> ActionHook | None:
    """Install ``hook`` (None removes it); returns the one it replaces."""
    global _hook
    previous, _hook = _hook, hook
    return previous


@contextmanager
def action_hook(hook: ActionHook) -> Iterator[None]:
    previous = set_action_hook(hook)
    try:
        yield
    finally:
        set_action_hook(previous)


async def run_hook(plan: ActionPlan) -> None:
    hook = _hook
    if hook is not None:
        result = hook(plan)
        if inspect.isawaitable(result):
            await result
