"""Run ``electric server`` under a profiler (for finding what dominates a bench figure).

    python bench/profile_server.py --mode sample --out /tmp/p -- server --listen 127.0.0.1:0 --data D

Any bench profiles its server when ELECTRIC_BENCH_PROFILE=DIR is set
(optionally ELECTRIC_BENCH_PROFILE_MODE=sample|cprofile): common.start_electric
then starts the server through this wrapper and the report lands in DIR when
the server drains (SIGTERM).

Modes:
- ``timing``: wraps SQLiteStore's writer connection and batch methods (at
  class level, in this process only; the source is unchanged) and writes
  OUT.txt: batches, writes per batch, wall vs writer-thread CPU per batch and
  per SQL statement kind, and write_many latency seen from the loop.
- ``none``: no instrumentation (with --switch-interval, a GIL experiment).
- ``sample`` (default): a thread samples every thread's Python stack every
  2 ms (sys._current_frames) — wall-clock, all threads (event loop, SQLite
  writer), low overhead. Writes OUT.txt (top self / inclusive frames per
  thread, with % of that thread's samples) and OUT.collapsed (flamegraph
  input).
- ``cprofile``: cProfile on the event-loop thread and on the SQLite writer
  thread (deterministic, but inflates Python call overhead; time inside
  grpc's Cython shows up as builtin calls such as Context.run). Writes
  OUT.prof, OUT.writerN.prof and OUT.txt.

Caveat for ``sample``: an in-process sampler needs the GIL to look, so it
over-reports places where threads release the GIL (select, fsync) and
under-reports pure-Python stretches; py-spy (external) has no such bias.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import pstats
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any


class Sampler:
    def __init__(self, interval: float = 0.002, max_seconds: float = 1800.0) -> None:
        self.interval = interval
        self.max_seconds = max_seconds
        self.stacks: collections.Counter[tuple[str, tuple[str, ...]]] = collections.Counter()
        self.samples: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    @staticmethod
    def _stack(frame: FrameType | None) -> tuple[str, ...]:
        out = []
        depth = 0
        while frame is not None and depth < 80:
            code = frame.f_code
            fn = code.co_filename
            for marker in ("site-packages/", "electric_server/", "electric_sdk/", "python3.11/"):
                i = fn.find(marker)
                if i >= 0:
                    fn = fn[i:]
                    break
            out.append(f"{code.co_name} ({fn}:{frame.f_lineno})")
            frame = frame.f_back
            depth += 1
        return tuple(reversed(out))

    def _run(self) -> None:
        me = threading.get_ident()
        deadline = time.monotonic() + self.max_seconds
        while not self._stop.wait(self.interval) and time.monotonic() < deadline:
            names = {t.ident: t.name for t in threading.enumerate()}
            for tid, frame in sys._current_frames().items():
                if tid == me:
                    continue
                name = names.get(tid, str(tid))
                if name.startswith("electric-sqlite-writer"):
                    name = "sqlite-writer"
                self.samples[name] += 1
                self.stacks[(name, self._stack(frame))] += 1

    def write(self, out: Path, top: int = 45) -> None:
        with open(f"{out}.collapsed", "w") as f:
            for (thread, stack), n in self.stacks.most_common():
                f.write(f"{thread};{';'.join(stack)} {n}\n")
        lines = []
        for thread, total in self.samples.most_common():
            self_c: collections.Counter[str] = collections.Counter()
            incl: collections.Counter[str] = collections.Counter()
            for (t, stack), n in self.stacks.items():
                if t != thread or not stack:
                    continue
                self_c[stack[-1]] += n
                for fr in set(stack):
                    incl[fr] += n
            lines.append(
                f"=== thread {thread}: {total} samples ({total * self.interval:.1f} s at {self.interval * 1000:.0f} ms)"
            )
            lines.append("--- self (leaf frame: where the thread was) ---")
            lines += [f"{n / total * 100:6.1f}%  {fr}" for fr, n in self_c.most_common(top)]
            lines.append("--- inclusive ---")
            lines += [f"{n / total * 100:6.1f}%  {fr}" for fr, n in incl.most_common(top)]
            lines.append("")
        Path(f"{out}.txt").write_text("\n".join(lines))


class _Timed:
    """Wall and thread-CPU time per SQL statement kind on the writer connection."""

    def __init__(self, conn: Any, stats: dict[str, list[int]]) -> None:
        self._conn = conn
        self._stats = stats

    def _timed(self, method: str, sql: str, *args: Any) -> Any:
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        try:
            return getattr(self._conn, method)(sql, *args)
        finally:
            key = (
                " ".join(sql.split()[:3]) if method == "execute" else f"{method} " + " ".join(sql.split()[:3])
            )
            st = self._stats.setdefault(key, [0, 0, 0])
            st[0] += 1
            st[1] += time.perf_counter_ns() - w0
            st[2] += time.thread_time_ns() - c0

    def execute(self, sql: str, *args: Any) -> Any:
        return self._timed("execute", sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        return self._timed("executemany", sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def install_timing(out: Path) -> Any:
    """Instrument the SQLite store (class-level wrappers; the source is unchanged)."""
    from electric_server.store import committer as cm
    from electric_server.store import sqlite as sq
    from electric_server.store.sqlite import writer as wr

    sql: dict[str, list[int]] = {}
    batches: list[tuple[int, int, int]] = []  # (writes, wall ns, CPU ns of the thread that ran it)
    write_lat: list[int] = []
    open_file, transact, write_many = (
        wr.SQLiteWriter._open,
        cm.GroupCommitter._transact,
        sq.SQLiteStore.write_many,
    )

    def _open(self: Any, accept_data_loss: bool) -> None:
        open_file(self, accept_data_loss)
        self.conn = _Timed(self.conn, sql)

    async def _transact(self: Any, writes: Any) -> Any:
        """A batch's transaction: its writes decided and committed (its WAL sync after)."""
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        try:
            return await transact(self, writes)
        finally:
            batches.append((len(writes), time.perf_counter_ns() - w0, time.thread_time_ns() - c0))

    async def _write_many(self: Any, writes: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return await write_many(self, writes)
        finally:
            write_lat.append(time.perf_counter_ns() - t0)

    wr.SQLiteWriter._open = _open  # type: ignore[method-assign]
    cm.GroupCommitter._transact = _transact  # type: ignore[method-assign]
    sq.SQLiteStore.write_many = _write_many  # type: ignore[method-assign]

    def write() -> None:
        lines = []
        if batches:
            n = len(batches)
            writes = sum(b[0] for b in batches)
            wall = sum(b[1] for b in batches)
            cpu = sum(b[2] for b in batches)
            walls = sorted(b[1] for b in batches)
            lines.append(
                f"batches {n}, writes {writes} (mean {writes / n:.1f}/batch); transaction wall "
                f"{wall / 1e9:.2f} s (p50 {walls[n // 2] / 1e3:.0f} us, p99 {walls[int(n * 0.99)] / 1e3:.0f} us), "
                f"its thread's CPU {cpu / 1e9:.2f} s; per write: wall {wall / writes / 1e3:.1f} us, "
                f"CPU {cpu / writes / 1e3:.1f} us"
            )
        if write_lat:
            lat = sorted(write_lat)
            lines.append(
                f"store.write_many latency (loop side): n {len(lat)}, p50 {lat[len(lat) // 2] / 1e3:.0f} us, "
                f"p99 {lat[int(len(lat) * 0.99)] / 1e3:.0f} us"
            )
        lines.append(
            f"{'statement':48s} {'calls':>8s} {'wall s':>8s} {'cpu s':>8s} {'wall us/call':>13s} {'cpu us/call':>12s}"
        )
        for key, (calls, wall_ns, cpu_ns) in sorted(sql.items(), key=lambda kv: -kv[1][1]):
            lines.append(
                f"{key[:48]:48s} {calls:8d} {wall_ns / 1e9:8.2f} {cpu_ns / 1e9:8.2f} "
                f"{wall_ns / calls / 1e3:13.1f} {cpu_ns / calls / 1e3:12.1f}"
            )
        Path(f"{out}.txt").write_text("\n".join(lines) + "\n")

    return write


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["sample", "cprofile", "timing", "none"], default="sample")
    p.add_argument("--out", required=True, help="output path prefix")
    p.add_argument("--switch-interval", type=float, help="sys.setswitchinterval (GIL hand-off experiment)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    args = p.parse_args()
    argv = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    from electric_sdk.cli.main import main as electric_main

    if args.mode == "none":
        return electric_main(argv)
    if args.mode == "timing":
        write = install_timing(out)
        try:
            return electric_main(argv)
        finally:
            write()
    if args.mode == "sample":
        sampler = Sampler()
        sampler.start()
        try:
            return electric_main(argv)
        finally:
            sampler.stop()
            sampler.write(out)
    # The SQLite writer thread gets its own profiler (cProfile is per thread).
    writer_profiles: list[cProfile.Profile] = []
    original_run = threading.Thread.run

    def run(self: threading.Thread) -> None:
        if not self.name.startswith("electric-sqlite-writer"):
            original_run(self)
            return
        wp = cProfile.Profile()
        writer_profiles.append(wp)
        wp.enable()
        try:
            original_run(self)
        finally:
            wp.disable()

    threading.Thread.run = run  # type: ignore[method-assign]
    prof = cProfile.Profile()
    prof.enable()
    try:
        return electric_main(argv)
    finally:
        prof.disable()
        prof.dump_stats(f"{out}.prof")
        s = io.StringIO()
        for title, profile in [("event-loop thread", prof)] + [
            ("sqlite writer thread", w) for w in writer_profiles
        ]:
            s.write(f"\n########## {title}\n")
            st = pstats.Stats(profile, stream=s)
            st.sort_stats("tottime").print_stats(45)
            st.sort_stats("cumulative").print_stats(60)
        for i, w in enumerate(writer_profiles):
            w.dump_stats(f"{out}.writer{i}.prof")
        Path(f"{out}.txt").write_text(s.getvalue())


if __name__ == "__main__":
    sys.exit(main())
