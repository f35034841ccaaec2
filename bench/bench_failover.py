"""Failover: kill -9 of the replica holding a worker's session → the run's next record (issue 47).

Three ``electric server --database URL`` replicas at their defaults (``--poll 500ms``,
``--lease-ttl 10s``) on a fresh database, and one real ``electric worker`` given all three
addresses (``--address a,b,c``) at its defaults. Each round spawns an entity whose run records a
step every ``TICK_S`` for as long as it lives, waits for its first step record, finds the replica
holding the worker's session (``electric workers``' REPLICA), and ends that replica:

- the figure (``kill``): SIGKILL. The worker must notice the dead connection, say hello to another
  replica (whose hello ends the dead one's session in the shared book), and the entity is leased
  again; the run is delivered again and replays its recorded steps;
- the ceiling (``drain``): SIGTERM, the same worker's reconnect to a live replica when the old one
  says goodbye itself: its leases are handed over at once, nothing is detected or fenced by time;
- info (``freeze``): SIGSTOP, a replica that stops answering without its connections resetting
  (its host gone, the network cut): only the worker's keepalive notices (then SIGKILL).

Both are measured from the signal to the arrival, at a watch on a replica that stays up, of the
run's next record: the first step record of a later attempt (the redelivered run's first new
step). The ended replica is started again on its port before the next round, so the worker
always has three addresses, one of them just dead. Kill, drain and freeze rounds take turns.

Figure: p50 and p99 of kill → next record, beside the same of drain → next record, and their
ratio. Target (issue 47): p99 <= 1.5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import pg_common

APP_MODULE = '''
"""bench_failover's entity type (written by bench/bench_failover.py)."""

import anyio

from electric_sdk.runtime import App

app = App("benchfo")


async def tick():
    await anyio.sleep(TICK_S)


@app.entity("fo", grace_period="1s", idle_timeout="1h")
async def fo(ctx, message):
    while True:
        await ctx.step("tick", tick)
'''

HOW = {"kill": signal.SIGKILL, "drain": signal.SIGTERM, "freeze": signal.SIGSTOP}
TICK_S = 0.05
KILLS = 50
TARGET_P99_S = 1.5
WAIT_S = 60.0


class Cluster:
    """Three replicas on fixed ports, each started again on its port after it is ended."""

    def __init__(self, url: str, tmp: Path, extra: tuple[str, ...]) -> None:
        self.url, self.tmp, self.extra = url, tmp, extra
        self.ports = [common.free_port() for _ in range(3)]
        self.procs: list[common.ServerProc] = []
        self.logs: list[Path] = []
        self.starts = 0
        for port in self.ports:
            proc, log = self._start(port)
            self.procs.append(proc)
            self.logs.append(log)

    def _start(self, port: int) -> tuple[common.ServerProc, Path]:
        self.starts += 1
        data, log = self.tmp / f"replica{self.starts}", self.tmp / f"replica{self.starts}.log"
        listen = f"{common.HOST}:{port}"
        return common.start_electric(data, "--database", self.url, *self.extra, listen=listen, log=log), log

    @property
    def addresses(self) -> str:
        return ",".join(f"{common.HOST}:{port}" for port in self.ports)

    def index_of(self, replica: str) -> int:
        for i, log in enumerate(self.logs):
            if f"replica {replica})" in log.read_text():
                return i
        raise RuntimeError(f"no replica here is {replica!r}")

    def end(self, i: int, how: signal.Signals) -> None:
        self.procs[i].proc.send_signal(how)

    def restart(self, i: int) -> None:
        proc = self.procs[i].proc
        if proc.poll() is None:
            proc.kill()  # a frozen one (kill -9 ends a stopped process too)
        if proc.wait(30) is None:
            raise RuntimeError("the replica did not end")
        self.procs[i], self.logs[i] = self._start(self.ports[i])

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop(5)


async def _next_record(client: Any, ref: str, offset: int, attempt: int, live: asyncio.Event) -> float:
    """Wait for a step record of a later attempt than ``attempt``; when it arrived (perf_counter).
    ``live`` is set at the first step record seen: the watch is open and caught up."""
    watch = cast(AsyncGenerator[Any, None], client.watch(ref, offset))
    async with contextlib.aclosing(watch) as events:
        async for event in events:
            if event.type != "electric.step":
                continue
            live.set()
            if int(event.value["data"]["attempt"]) > attempt:
                return time.perf_counter()
    raise RuntimeError(f"{ref}: the stream ended before the run's next record")


async def _first_step(client: Any, ref: str) -> tuple[int, int]:
    """The offset after the run's first step record, and its attempt."""
    watch = cast(AsyncGenerator[Any, None], client.watch(ref, 0))
    async with contextlib.aclosing(watch) as events:
        async for event in events:
            if event.type == "electric.step":
                return event.offset + 1, int(event.value["data"]["attempt"])
    raise RuntimeError(f"{ref}: the stream ended before its first step")


async def _round(cluster: Cluster, worker_id: str, n: int, how: signal.Signals, wait_s: float) -> float:
    from electric_sdk import AsyncClient

    ref = f"fo/r{n}"
    async with AsyncClient(cluster.addresses) as anywhere:
        await anywhere.spawn(ref)
        await anywhere.send(ref, "go")
        offset, attempt = await asyncio.wait_for(_first_step(anywhere, ref), WAIT_S)
        sessions = [w for w in await anywhere.workers() if w.worker_id == worker_id]
    if len(sessions) != 1:
        raise RuntimeError(f"the worker has {len(sessions)} sessions: {sessions}")
    holder = cluster.index_of(sessions[0].replica)
    watcher = cluster.procs[(holder + 1) % 3].address
    async with AsyncClient(watcher) as client:
        live = asyncio.Event()
        waiting = asyncio.ensure_future(_next_record(client, ref, offset, attempt, live))
        # A step lands every TICK_S: the first one the watch sees says it is open and caught up.
        await asyncio.wait_for(live.wait(), WAIT_S)
        ended_at = time.perf_counter()
        cluster.end(holder, how)
        arrived = await asyncio.wait_for(waiting, wait_s)
        await client.signal(ref, "SIGKILL")
    cluster.restart(holder)
    return arrived - ended_at


def _worker_id(log: Path) -> str:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        m = re.search(r"worker (\S+) connected to", log.read_text())
        if m:
            return m.group(1)
        # The worker process's own log line is the only word of its connection: read it again.
        time.sleep(0.05)
    raise RuntimeError(f"the worker did not connect:\n{log.read_text()[-2000:]}")


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=KILLS, help="kill rounds (as many drain and freeze rounds)")
    p.add_argument("--server-arg", action="append", default=[], help="an extra flag for every replica")
    p.add_argument("--wait", type=float, default=WAIT_S, help="longest wait for a round's next record, s")
    args = p.parse_args()
    args.kills = common.scale(args.kills, args.quick, 5)
    started = time.perf_counter()
    took: dict[str, list[float]] = {how: [] for how in HOW}
    with (
        pg_common.fresh_database("electric_bench_failover") as url,
        tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp_,
    ):
        tmp = Path(tmp_)
        (tmp / "benchfo_app.py").write_text(APP_MODULE.replace("TICK_S", repr(TICK_S)))
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp), os.environ.get("PYTHONPATH")]))
        }
        cluster = Cluster(url, tmp, tuple(args.server_arg))
        log = tmp / "worker.log"
        worker = common.start_worker(cluster.addresses, log, "benchfo_app:app", env=env)
        try:
            worker_id = _worker_id(log)
            for n in range(len(HOW) * args.kills):
                how = list(HOW)[n % len(HOW)]
                took[how].append(asyncio.run(_round(cluster, worker_id, n, HOW[how], args.wait)))
                print(f"  round {n} ({how}): {took[how][-1]:.3f} s", file=sys.stderr)
        except BaseException:
            print(f"--- worker log:\n{log.read_text()[-3000:]}", file=sys.stderr)
            raise
        finally:
            common.stop_worker(worker, 5)
            cluster.stop()
    kill, drain, freeze = took["kill"], took["drain"], took["freeze"]
    rows = [
        common.value_row(
            "kill -9 of the session's replica → run's next record, p50",
            common.percentile(kill, 50),
            common.percentile(drain, 50),
            "s",
        ),
        common.value_row(
            "kill -9 of the session's replica → run's next record, p99",
            common.percentile(kill, 99),
            common.percentile(drain, 99),
            "s",
            "<=",
            TARGET_P99_S,
        ),
        common.value_row(
            "info: SIGSTOP of it (no reset: keepalive) → next record, p99",
            common.percentile(freeze, 99),
            common.percentile(drain, 99),
            "s",
        ),
    ]
    info = {"tick_s": TICK_S, **{f"{how}_s": took[how] for how in HOW}}
    common.report("bench_failover", rows, info, time.perf_counter() - started, args.quick)


if __name__ == "__main__":
    main()
