"""Patches: ``ctx.patched(id)`` and ``ctx.deprecate_patch(id)``, so a fix ships while runs
recorded on the old code finish on the old path (Temporal's ``patched``/``deprecate_patch``).

A run delivered again replays its recorded steps by position (steps.py): new
code that inserts, removes or renames a step where a run in flight recorded
another fails that run with ``NonDeterministicRun``. A patch guards the change::

    facts = await ctx.step("tool:search", search, message.text)
    if ctx.patched("check-sources"):
        facts = await ctx.step("tool:check", check, facts)  # the new path
    await ctx.step("model:answer", answer, facts)

``patched(id)`` answers, the first rule that applies deciding:

1. what it answered for ``id`` earlier in this attempt: one attempt never
   takes both paths of a patch;
2. True if an earlier attempt recorded a marker for ``id`` at this position:
   it took the new path here;
3. False if an earlier attempt recorded a step at this position: the code
   that recorded it took the old path (it predates the patch, or was told
   False);
4. True otherwise — a new run, or a replay past its recorded steps — and the
   answer is recorded: a marker ``{"run", "attempt", "index", "outcome":
   "patched", "patch": id}`` among the run's ``electric.step`` records,
   written just before the record of the next step (so ``patched`` need not
   be awaited). A later attempt then answers True at the same position. A
   marker with no step recorded after it is never needed: a replay that finds
   nothing recorded at its position answers True again.

A marker holds no position of its own: it names the position of the step
that follows it. So the steps' positions, and the segments of ``ctx.state``
changes written with them, are the same with or without patches, and removing
a patch never makes a run non-deterministic by itself.

``deprecate_patch(id)``, once no run that took the old path can be delivered
again (``electric replay-check`` says so): the new path, always. A marker
recorded here is accepted, its absence is fine, and nothing is recorded, so a
later version may drop the call. The life of a patch, as in Temporal:
``if ctx.patched(id): new`` + old path; then ``ctx.deprecate_patch(id)`` +
new path only; then the new path alone.

In a signal handler, and inside a recorded step (whose code a replay never
runs), nothing is replayed: ``patched`` answers True and records nothing.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgument
from .steps import PATCHED, RunSteps, in_step

__all__ = ["MAX_PATCH_ID", "RunPatches", "deprecate_patch", "patched", "unwritten_markers"]

# A patch id is a name in the code and in the records: short, like a step's name.
MAX_PATCH_ID = 128


class RunPatches:
    """One attempt's patches: the markers its run's earlier attempts recorded (by position), the
    answers given so far, and the markers not yet written."""

    __slots__ = ("answers", "recorded", "unwritten")

    def __init__(self, markers: list[dict[str, Any]] | tuple[dict[str, Any], ...] = ()) -> None:
        self.recorded: dict[int, set[str]] = {}
        for data in markers:
            self.recorded.setdefault(int(data["index"]), set()).add(str(data["patch"]))
        self.answers: dict[str, bool] = {}
        self.unwritten: list[dict[str, Any]] = []

    def answer(self, patch_id: str, position: int, *, step_recorded: bool) -> tuple[bool, bool]:
        """(the answer, whether it is new and must be recorded) at ``position``."""
        if (given := self.answers.get(patch_id)) is not None:
            return given, False
        if patch_id in self.recorded.get(position, ()):
            taken, new = True, False
        elif step_recorded:
            taken, new = False, False
        else:
            taken, new = True, True
        self.answers[patch_id] = taken
        return taken, new


def _check_id(patch_id: object) -> str:
    if not isinstance(patch_id, str) or not 1 <= len(patch_id) <= MAX_PATCH_ID:
        raise InvalidArgument(
            f"a patch id is a text of 1 to {MAX_PATCH_ID} characters, got {patch_id!r:.80}",
            code="INVALID_PATCH_ID",
        )
    return patch_id


def _patches(steps: RunSteps, run_key: str | None, patch_id: str) -> RunPatches | None:
    """The run's patches, or None where nothing is replayed (a signal handler, a step's code)."""
    _check_id(patch_id)
    if run_key is None or in_step(steps):
        return None
    if steps.current is not None or not steps.in_body():
        what = f"step {steps.current!r} runs" if steps.current is not None else "parallel steps may run"
        raise RuntimeError(
            f"ctx.patched({patch_id!r}) called while {what} in another task: a patch is answered "
            "at a position of the run's steps, so it is asked between them, in the run's own task"
        )
    steps.settle(f"ctx.patched({patch_id!r}) called")
    if steps.patches is None:
        steps.patches = RunPatches(list(steps.markers))
    return steps.patches


def patched(steps: RunSteps, patch_id: str, *, run_key: str | None, attempt: int) -> bool:
    """``ctx.patched(patch_id)`` for the run ``run_key`` (None: not a run); see the module."""
    patches = _patches(steps, run_key, patch_id)
    if patches is None:
        return True
    position = steps.index
    taken, new = patches.answer(patch_id, position, step_recorded=steps.recorded_at(position))
    if new:
        patches.unwritten.append(
            {"run": run_key, "attempt": attempt, "index": position, "outcome": PATCHED, "patch": patch_id}
        )
    return taken


def deprecate_patch(steps: RunSteps, patch_id: str, *, run_key: str | None) -> None:
    """``ctx.deprecate_patch(patch_id)``: the new path from now on in this attempt, whatever the
    records say here; nothing is recorded."""
    patches = _patches(steps, run_key, patch_id)
    if patches is not None:
        patches.answers[patch_id] = True


def unwritten_markers(steps: RunSteps) -> list[dict[str, Any]]:
    """The markers to write now, before the record of the step they precede (then forgotten)."""
    patches = steps.patches
    if patches is None or not patches.unwritten:
        return []
    markers, patches.unwritten = patches.unwritten, []
    return markers
