"""The dashboard in a real browser: 10,000 entities against 100, on the same page.

Two ``electric server`` processes (fresh data dirs): one with 10,000 entities, one with 100, of
four types (``fleet-a`` .. ``fleet-d``, round robin), every fifth one killed (final: hidden until
asked for), the rest waiting in ``spawning`` (no worker hosts them). Each gets a real Voilà serving
notebooks/control_panel.ipynb, and headless Chromium (Debian's, driven by playwright-core through
tests/browser/dashboard_timing.mjs, the browser test's own helpers) opens a fresh page per round
and times, on the clock of the Node process that drives it:

- first render: from navigating to the page to the table's first page shown with the full count
  (a Voilà kernel starts and runs the notebook; the WatchEntities snapshot; the first page);
- type filter: from choosing ``fleet-b`` to its rows and count shown (applied to the rows held);
- informational: the part of the first render after the table appeared (snapshot and first
  page), an id search within the type, "show stopped, killed" (a new stream of every state), and
  how many elements the page holds (a page of rows, whatever the fleet).

The 100-entity page is the ceiling of each figure: the same page, the same steps, in the same
rounds (alternating which size goes first; 7 by default, as single pages on this shared
2-core machine vary by ±50%), medians. Targets: ratio ≤ 1.5 for both figures (the
page costs about the same whatever the fleet), and the filter within 0.5 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from electric_sdk import AsyncClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_args, ratio_row, report, start_electric, value_row

# The browser test's Voilà runner and page helpers: the bench times the page the test drives.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "browser"))
from dashboard_app import CHROMIUM, HERE, NODE, Voila, ensure_playwright

TYPES = ("fleet-a", "fleet-b", "fleet-c", "fleet-d")
FILTER_TYPE = "fleet-b"
SEARCH = "n0001"  # ids n00010 .. n00019
CONCURRENCY = 64
PAGE_TIMEOUT_S = 300


def dataset(n: int) -> list[tuple[str, bool]]:
    """(ref, killed) for ``n`` entities."""
    return [(f"{TYPES[i % len(TYPES)]}/n{i:05d}", i % 5 == 4) for i in range(n)]


def plan(n: int) -> dict[str, Any]:
    """The counts the table must show at each step (the table's own rule: a search is a
    case-insensitive part of ``type/id``; stopped and killed only when asked for)."""
    rows = dataset(n)
    live = [ref for ref, killed in rows if not killed]
    of_type = [ref for ref in live if ref.startswith(f"{FILTER_TYPE}/")]
    return {
        "live": len(live),
        "type": FILTER_TYPE,
        "of_type": len(of_type),
        "search": SEARCH,
        "found": sum(SEARCH in ref for ref in of_type),
        "all": len(rows),
    }


async def populate(address: str, n: int) -> None:
    async with AsyncClient(address) as client:
        slots = asyncio.Semaphore(CONCURRENCY)

        async def make(ref: str, killed: bool) -> None:
            async with slots:
                await client.spawn(ref)
                if killed:
                    await client.kill(ref)

        await asyncio.gather(*(make(ref, killed) for ref, killed in dataset(n)))


def time_page(voila: Voila, n: int) -> dict[str, float]:
    assert NODE is not None
    result = subprocess.run(
        [NODE, str(HERE / "dashboard_timing.mjs"), voila.url, json.dumps(plan(n))],
        check=False,
        env={**os.environ, "CHROMIUM": str(CHROMIUM)},
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT_S,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{n} entities: {result.stdout}\n{result.stderr}\n{''.join(voila.lines[-40:])}")
    timings: dict[str, float] = json.loads(result.stdout.strip().splitlines()[-1])
    return timings


def main() -> None:
    p = bench_args((__doc__ or "").splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--entities", type=int, default=10_000)
    args = p.parse_args()
    if CHROMIUM is None or NODE is None:
        raise SystemExit("needs Chromium (Debian: apt-get install chromium) and Node.js")
    ensure_playwright()
    big = args.entities // 10 if args.quick else args.entities
    sizes = (big, 100)
    begun = time.perf_counter()
    samples: dict[int, list[dict[str, float]]] = {n: [] for n in sizes}
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
        servers = {n: start_electric(Path(tmp) / f"data-{n}") for n in sizes}
        voilas: dict[int, Voila] = {}
        try:
            for n, server in servers.items():
                made = time.perf_counter()
                asyncio.run(populate(server.address, n))
                print(f"{n:,} entities spawned in {time.perf_counter() - made:.1f} s", flush=True)
            for n, server in servers.items():
                env = {**os.environ, "ELECTRIC_ADDRESS": server.address}
                for name in ("ELECTRIC_TOKEN", "ELECTRIC_ENTITY"):
                    env.pop(name, None)
                voilas[n] = Voila(env)
            for voila in voilas.values():
                voila.wait_ready(120)
            time_page(voilas[100], 100)  # a warm-up page: the first kernel start reads every file cold
            for round_ in range(args.rounds):
                for n in sizes if round_ % 2 == 0 else sizes[::-1]:
                    timings = time_page(voilas[n], n)
                    samples[n].append(timings)
                    print(f"round {round_ + 1}, {n:,} entities: {timings}", flush=True)
        finally:
            for voila in voilas.values():
                voila.stop()
            for server in servers.values():
                server.stop()

    def medians(key: str, scale: float = 1000) -> tuple[float, float]:
        """The median of ``key`` on the big page and on the 100-entity one (ms / scale)."""
        big_page, small_page = (statistics.median(s[key] for s in samples[n]) / scale for n in sizes)
        return big_page, small_page

    label = f"{big:,}"
    elements = medians("dom_elements", 1)
    rows = [
        ratio_row(f"first render, {label} entities (vs 100)", *medians("first_render_ms"), "s", "<=", 1.5),
        ratio_row(f"type filter, {label} entities (vs 100)", *medians("type_filter_ms"), "s", "<=", 1.5),
        value_row(f"type filter, {label} entities", *medians("type_filter_ms"), "s", "<=", 0.5),
        value_row(f"rows after the table appeared, {label} (vs 100)", *medians("rows_after_table_ms"), "s"),
        value_row(f"id search, {label} (vs 100)", *medians("search_ms"), "s"),
        value_row(f"show stopped, killed: a new stream, {label} (vs 100)", *medians("show_final_ms"), "s"),
        value_row(f"elements on the page, {label} (vs 100)", *elements, "elements"),
    ]
    info = {
        "sizes": list(sizes),
        "rounds": args.rounds,
        "plans": {n: plan(n) for n in sizes},
        "samples": samples,
    }
    report("bench_dashboard", rows, info, time.perf_counter() - begun, args.quick)


if __name__ == "__main__":
    main()
