"""``electric versions``: each entity type's code versions, and the choice of the one new wakes get.

Without a choice flag it lists; ``--select VERSION`` (a rollback is selecting the older one),
``--newest`` (back to the newest announced), ``--ramp VERSION --percent P`` and ``--no-ramp``
change the type's choice (the ``admin`` scope) and print the type as it is then.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import errors
from ..code_versions import TypeVersions, versioning_text
from . import console

if TYPE_CHECKING:
    from .commands import Invocation

__all__ = ["add_arguments", "versions", "versions_text", "waiting_lines"]

HEADERS = ("VERSION", "WORKERS", "IN FLIGHT", "WAITING", "VERSIONING", "NEW WAKES")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("type", nargs="?", metavar="TYPE", help="only this entity type (the one a choice is for)")
    p.add_argument(
        "--select", metavar="VERSION", help="new wakes get this version (a rollback: an older one)"
    )
    p.add_argument("--newest", action="store_true", help="new wakes get the newest version announced again")
    p.add_argument("--ramp", metavar="VERSION", help="send --percent of the type's entities to this version")
    p.add_argument("--percent", type=int, metavar="P", help="the ramp's share, 1-100, sticky per entity")
    p.add_argument("--no-ramp", action="store_true", help="end the ramp")
    p.add_argument("--reason", default="", help="why; written to the server's log")


def versions(ctx: Invocation, args: argparse.Namespace) -> int:
    changing = args.select is not None or args.newest or args.ramp is not None or args.no_ramp
    if args.percent is not None and args.ramp is None:
        raise errors.InvalidArgument("--percent goes with --ramp VERSION", code="INVALID_RAMP")
    if args.ramp is not None and args.percent is None:
        raise errors.InvalidArgument("--ramp needs --percent P (1-100)", code="INVALID_RAMP")
    if args.select is not None and args.newest:
        raise errors.InvalidArgument("--select and --newest exclude each other", code="INVALID_ARGUMENT")
    if args.ramp is not None and args.no_ramp:
        raise errors.InvalidArgument("--ramp and --no-ramp exclude each other", code="INVALID_ARGUMENT")
    if not changing:
        found = ctx.client.versions(args.type)
        if ctx.out.json_mode:
            ctx.out.record({"types": [t.to_json() for t in found]})
        elif not found:
            ctx.out.line(f"no worker ever announced {args.type!r}" if args.type else "no type announced yet")
        else:
            ctx.out.line("\n\n".join(versions_text(t) for t in found))
        return 0
    if not args.type:
        raise errors.InvalidArgument("name the entity type whose version to choose", code="INVALID_ARGUMENT")
    # What the flags leave alone stays as it is (an unknown type: the server says so).
    now = next(iter(ctx.client.versions(args.type)), None)
    kept_selected = now.selected if now is not None else None
    selected = None if args.newest else (args.select if args.select is not None else kept_selected)
    if args.no_ramp:
        ramp, percent = None, 0
    elif args.ramp is not None:
        ramp, percent = args.ramp, args.percent
    else:
        ramp, percent = (now.ramp_version, now.ramp_percent) if now is not None else (None, 0)
    chosen = ctx.client.set_version(
        args.type, selected, ramp_version=ramp, ramp_percent=percent, reason=args.reason
    )
    if ctx.out.json_mode:
        ctx.out.record(chosen.to_json())
    else:
        ctx.out.line(versions_text(chosen))
    return 0


def versions_text(t: TypeVersions) -> str:
    how = f"selected by an operator: {t.selected}" if t.selected else "the newest announced"
    head = f"{t.type}: new wakes get {t.current or '-'} ({how})"
    if t.ramp_version:
        head += f"; {t.ramp_percent}% of its entities get {t.ramp_version} (ramp)"
    rows = []
    for v in t.versions:
        marks = []
        if v.code_version == t.current:
            marks.append("yes")
        if v.code_version == t.ramp_version:
            marks.append(f"{t.ramp_percent}%")
        rows.append(
            [
                v.code_version,
                ",".join(v.workers) if v.workers else "none",
                str(v.runs_in_flight),
                str(v.runs_waiting),
                versioning_text(v),
                " ".join(marks) or "-",
            ]
        )
    return "\n".join([head, console.table(HEADERS, rows, frozenset({2, 3}))])


def waiting_lines(found: Sequence[TypeVersions]) -> list[str]:
    """``electric workers``' note: the runs waiting for a code version no connected worker runs."""
    return [
        f"{n} run(s) of {t.type} waiting for code {version}: no worker of it is connected"
        for t in found
        for version, n in t.waiting.items()
    ]
