"""Run benchmarks at two checkouts in alternating rounds and say whether each figure held.

    python bench/ab_commits.py --before ../electric-at-start --after . \
        --rounds 3 bench_signal bench_store bench_http
    python bench/ab_commits.py ... --quick bench_dbos   # a bench's quick size (see bench/README.md)
    python bench/ab_commits.py ... --args bench_dbos=--cancels=1000

For a change that must not change speed (a refactor): each checkout runs its
own bench script with its own virtualenv (``DIR/.venv/bin/python
DIR/bench/NAME.py``), before then after, round after round, so background
load lands on both sides alike. Every figure with a target is read back from
the bench's ``bench/results/NAME.json`` in that checkout and the table says,
per figure: the before-runs, the after-runs, and whether the after-median
stays within the before-runs' range or within ±15 % of their median,
whichever is wider ("held"); a bench that sets no target has every row
compared. A figure whose before-runs spread wider than 15 % of their median
is marked "wide": its comparison says little, so run it more rounds. One
JSON line goes to ``bench/results/ab_commits.json`` of the ``--after``
checkout: the table, and every run's whole record.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TOLERANCE = 0.15
TIMEOUT_S = 1800


def _run(checkout: Path, bench: str, quick: bool, extra: list[str]) -> dict[str, Any]:
    python = checkout / ".venv" / "bin" / "python"
    cmd = [str(python), str(checkout / "bench" / f"{bench}.py"), *(["--quick"] if quick else []), *extra]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=checkout, check=False, capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"{bench} failed in {checkout} (exit {proc.returncode})")
    record: dict[str, Any] = json.loads((checkout / "bench" / "results" / f"{bench}.json").read_text())
    record["wall_s"] = round(time.monotonic() - started, 1)
    return record


def _figures(record: dict[str, Any]) -> dict[str, tuple[float, str, float | None]]:
    """Each row with a target: its figure name → (value, unit, ratio); every row of a bench that
    sets no target (bench_pg_signal's are all informational)."""
    rows = [row for row in record["rows"] if row["target"] != "-"] or record["rows"]
    return {row["figure"]: (float(row["value"]), row["unit"], row["ratio"]) for row in rows}


def _verdict(before: list[float], after: list[float]) -> tuple[str, bool]:
    median = statistics.median(before)
    low, high = min(before), max(before)
    band_low, band_high = min(low, median * (1 - TOLERANCE)), max(high, median * (1 + TOLERANCE))
    after_median = statistics.median(after)
    held = band_low <= after_median <= band_high
    wide = median != 0 and (high - low) / abs(median) > TOLERANCE
    return ("held" if held else "MOVED") + (" (wide)" if wide else ""), held


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, required=True, help="the checkout at the start commit")
    p.add_argument("--after", type=Path, required=True, help="the checkout at the end commit")
    p.add_argument("--rounds", type=int, default=3, help="runs per side (default %(default)s)")
    p.add_argument("--quick", nargs="*", default=[], metavar="BENCH", help="benches run at their quick size")
    p.add_argument(
        "--args", nargs="*", default=[], metavar="BENCH=ARG", help="extra arguments for a bench's script"
    )
    p.add_argument("benches", nargs="+", metavar="BENCH")
    args = p.parse_args()
    extra: dict[str, list[str]] = {}
    for item in args.args:
        name, _, arg = item.partition("=")
        extra.setdefault(name, []).append(arg)
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {b: {"before": [], "after": []} for b in args.benches}
    for round_no in range(1, args.rounds + 1):
        for bench in args.benches:
            for side, checkout in sides.items():
                record = _run(checkout, bench, bench in args.quick, extra.get(bench, []))
                runs[bench][side].append(record)
                print(
                    f"round {round_no}: {bench} {side} ({record['git']['head']}) {record['wall_s']} s",
                    flush=True,
                )
    print()
    print(f"{'bench':<16} {'figure':<64} {'before runs':<30} {'after runs':<30} verdict")
    table = []
    for bench, by_side in runs.items():
        before_figs = [_figures(r) for r in by_side["before"]]
        after_figs = [_figures(r) for r in by_side["after"]]
        for figure in before_figs[0]:
            if not all(figure in f for f in before_figs + after_figs):
                continue
            before = [f[figure][0] for f in before_figs]
            after = [f[figure][0] for f in after_figs]
            verdict, held = _verdict(before, after)
            unit = before_figs[0][figure][1]
            table.append(
                {
                    "bench": bench,
                    "figure": figure,
                    "unit": unit,
                    "before": before,
                    "after": after,
                    "verdict": verdict,
                    "held": held,
                }
            )
            print(
                f"{bench:<16} {figure[:64]:<64} {' / '.join(map(_fmt, before)):<30} "
                f"{' / '.join(map(_fmt, after)):<30} {verdict} ({unit})"
            )
    out = sides["after"] / "bench" / "results" / "ab_commits.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "rounds": args.rounds,
                "heads": {s: runs[args.benches[0]][s][0]["git"]["head"] for s in sides},
                "figures": table,
                "runs": runs,
            },
            default=str,
        )
        + "\n"
    )
    return 0 if all(row["held"] for row in table) else 1


if __name__ == "__main__":
    raise SystemExit(main())
