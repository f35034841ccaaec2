"""`electric replay-check MODULE:APP`: the new code against recorded runs, before a deploy.

The check itself is the runtime's (runtime/replay.py): each recorded run
replayed, every recorded step answered from its record, stopped at the first
step that is not recorded, so no step runs. The runs are read from a server
(by default the runs in flight there; ``--all-runs``: every started run) or
from an ``electric export`` file. It prints each run that would fail —
entity, run, step position and both names — and a summary line, and exits 8
(as a run failed with ``NonDeterministicRun`` does) when any would, 0 when none.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import anyio

from .. import errors
from ..client import AsyncClient
from ..runtime.replay import DEFAULT_RUN_TIMEOUT_S, ReplayResult
from . import exit_codes
from .commands import Invocation, duration_s

SUMMARY = "replay recorded runs with new code before a deploy: exit 8 if any would fail"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("app", metavar="MODULE:APP", help="the new code, e.g. examples.agents:app")
    source = p.add_mutually_exclusive_group()
    # --server is --address, named for what it is here: where the recorded runs are read.
    source.add_argument(
        "--server",
        dest="address",
        metavar="HOST:PORT",
        default=argparse.SUPPRESS,
        help="read the runs from this server (default: --address, ELECTRIC_ADDRESS)",
    )
    source.add_argument(
        "--file", type=Path, metavar="FILE", help="read the runs from an `electric export` file"
    )
    p.add_argument(
        "--type",
        dest="types",
        action="append",
        metavar="TYPE",
        help="only entities of this type (repeatable; default: every type of the app)",
    )
    p.add_argument(
        "--all-runs", action="store_true", help="also the runs that ended (completed, failed, aborted)"
    )
    p.add_argument(
        "--run-timeout",
        metavar="DURATION",
        default=f"{DEFAULT_RUN_TIMEOUT_S:g}s",
        help="how long a run's code may wait between two steps before it is reported unchecked "
        "(default %(default)s)",
    )
    p.epilog = (
        "The code between steps runs: keep it free of side effects (docs/patches.md). "
        "Exit 0: every run replays; 8: at least one would fail."
    )


def command(ctx: Invocation, args: argparse.Namespace) -> int:
    from ..runtime.replay_sources import ExportFileError, replay_check
    from .runtime_cmds import load_app_spec

    run_timeout_s = duration_s(args.run_timeout, "--run-timeout")
    app = load_app_spec(args.app)

    async def check() -> ReplayResult:
        if args.file is not None:
            return await replay_check(
                app, file=args.file, types=args.types, all_runs=args.all_runs, run_timeout_s=run_timeout_s
            )
        async with AsyncClient(options=ctx.options) as client:
            return await replay_check(
                app, client=client, types=args.types, all_runs=args.all_runs, run_timeout_s=run_timeout_s
            )

    try:
        result = anyio.run(check)
    except ExportFileError as exc:
        raise errors.InvalidArgument(str(exc), code="INVALID_EXPORT_FILE") from None
    out = ctx.out
    if out.json_mode:
        out.record(
            {
                "ok": result.ok,
                "entities": result.entities,
                "runs": result.runs,
                "problems": [
                    {
                        f: getattr(p, f)
                        for f in ("entity", "run", "index", "kind", "recorded", "asked", "error")
                    }
                    for p in result.problems
                ],
                "unchecked": list(result.unchecked),
            }
        )
    else:
        for problem in result.problems:
            out.line(str(problem))
        for run in result.unchecked:
            out.note(f"unchecked: {run}: its code waited more than {args.run_timeout} between two steps")
        out.line(result.summary())
    return exit_codes.RUN_FAILED if result.problems else exit_codes.OK
