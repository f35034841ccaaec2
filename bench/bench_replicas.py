"""Replicas on one PostgreSQL: how late a grace expiry is when the replica that armed it dies.

Two `electric server --database URL` replicas, A and B, at their defaults (`--poll 500ms`,
`--lease-ttl 10s`), on a fresh database. A worker speaking the runtime protocol by hand holds N
entities through A, each `running` with a 1 s grace, and never handles SIGTERM. Every entity gets
a SIGTERM through A (`stopping`, deadline = commit + 1 s); then A is killed with SIGKILL. B, which
heard of the deadlines through the commit feed (and would find any it missed by polling the
database), writes `stopped` (cause grace_expired).

Figure: per entity, the `stopped` event's timestamp minus the `stopping` event's deadline (both
by PostgreSQL's clock), p50 and p99. Target (issue 20): p99 <= 1 s past the deadline.
Ceiling: the same run with A left alive, so A's own reaper fires each deadline from its heap
(the single-replica path).

Database: ELECTRIC_BENCH_DATABASE_URL's server (default: the tests' PostgreSQL at
postgresql://postgres@127.0.0.1:5432/test); a database of its own is created and dropped.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import runtime_service_pb2_grpc as rt_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.times import duration_from_ms

ENTITIES = 100
GRACE_MS = 1000
TARGET_LATE_S = 1.0
DSN = os.environ.get("ELECTRIC_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _with_database(name: str) -> str:
    return DSN.rsplit("/", 1)[0] + "/" + name


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(DSN)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


class _RawWorker:
    """Takes every lease it is granted and writes spawning → running; ignores every signal."""

    def __init__(self, channel: grpc.aio.Channel, n: int) -> None:
        self.requests: asyncio.Queue[rt.ConnectRequest] = asyncio.Queue()
        hello = rt.Hello(worker_id="bench-replicas", types=[rt.HostedType(type="grace")], code_version="v1")
        self.requests.put_nowait(rt.ConnectRequest(hello=hello))
        self.call = rt_grpc.RuntimeServiceStub(channel).Connect(self._requests())
        self.running = 0
        self.all_running = asyncio.Event()
        self.n = n
        self._ids = 0
        self._reader = asyncio.ensure_future(self._read())
        self._beat = asyncio.ensure_future(self._heartbeats())

    async def _requests(self) -> Any:
        while True:
            yield await self.requests.get()

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(1)
            self.requests.put_nowait(rt.ConnectRequest(heartbeat=rt.Heartbeat()))

    async def _read(self) -> None:
        with_errors = (grpc.aio.AioRpcError, asyncio.CancelledError)
        try:
            while (response := await self.call.read()) is not grpc.aio.EOF:
                kind = response.WhichOneof("msg")
                if kind == "lease_granted":
                    lease = response.lease_granted.lease
                    self._ids += 1
                    transition = rt.Transition(to=pb.STATE_RUNNING, cause="started")
                    write = rt.RuntimeWrite(
                        request_id=self._ids,
                        ref=lease.ref,
                        epoch=lease.epoch,
                        expect_state=pb.STATE_SPAWNING,
                        transition=transition,
                    )
                    self.requests.put_nowait(rt.ConnectRequest(write=write))
                elif kind == "write_result" and response.write_result.applied:
                    self.running += 1
                    if self.running == self.n:
                        self.all_running.set()
        except with_errors:
            pass

    def close(self) -> None:
        self._beat.cancel()
        self._reader.cancel()
        self.call.cancel()


async def _late_ms(url: str, tmp: Path, n: int, kill: bool) -> list[float]:
    """One run: ms past each deadline that `stopped` was written, A killed or not."""
    a = common.start_electric(tmp / "a", "--database", url)
    b = common.start_electric(tmp / "b", "--database", url)
    try:
        async with grpc.aio.insecure_channel(a.address) as to_a, grpc.aio.insecure_channel(b.address) as to_b:
            worker = _RawWorker(to_a, n)
            refs = [pb.EntityRef(type="grace", id=f"e{i}") for i in range(n)]
            on_a = api_grpc.EntityServiceStub(to_a)
            profile = pb.Profile(grace_period=duration_from_ms(GRACE_MS))
            for ref in refs:
                await on_a.SpawnEntity(api.SpawnEntityRequest(ref=ref, profile=profile))
            await asyncio.wait_for(worker.all_running.wait(), 60)
            await asyncio.gather(
                *(on_a.SignalEntity(api.SignalEntityRequest(ref=r, signal=pb.SIGNAL_SIGTERM)) for r in refs)
            )
            if kill:
                os.kill(a.pid, signal.SIGKILL)
            worker.close()
            on_b = api_grpc.EntityServiceStub(to_b)
            late: list[float] = []
            deadline = time.monotonic() + 60
            for ref in refs:
                while True:
                    page = await on_b.ReadEvents(api.ReadEventsRequest(ref=ref, limit=100))
                    states = [e for e in page.events if e.type == "state"]
                    stopping = [e for e in states if e.state.state == pb.STATE_STOPPING]
                    stopped = [e for e in states if e.state.state == pb.STATE_STOPPED]
                    if stopped:
                        due = stopping[-1].state.deadline.ToMilliseconds()
                        late.append(stopped[-1].headers.timestamp.ToMilliseconds() - due)
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{ref.id} never stopped")
                    await asyncio.sleep(0.05)
            return late
    finally:
        a.stop()
        b.stop()


def main() -> None:
    args = common.bench_args(__doc__.splitlines()[0]).parse_args()
    n = common.scale(ENTITIES, args.quick, minimum=10)
    started = time.perf_counter()
    name = f"electric_bench_replicas_{os.getpid()}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    tmp = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    try:
        for run in ("alive", "killed"):
            (tmp / run).mkdir()
        alive = asyncio.run(_late_ms(_with_database(name), tmp / "alive", n, kill=False))
        asyncio.run(_admin(f'DROP DATABASE "{name}" WITH (FORCE)'))
        asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
        killed = asyncio.run(_late_ms(_with_database(name), tmp / "killed", n, kill=True))
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        shutil.rmtree(tmp, ignore_errors=True)
    p50, p99 = common.percentile(killed, 50) / 1000, common.percentile(killed, 99) / 1000
    c50, c99 = common.percentile(alive, 50) / 1000, common.percentile(alive, 99) / 1000
    rows = [
        common.value_row("grace expiry, arming replica killed, late p50", p50, c50, "s"),
        common.value_row("grace expiry, arming replica killed, late p99", p99, c99, "s", "<=", TARGET_LATE_S),
    ]
    info = {"entities": n, "grace_ms": GRACE_MS, "late_ms_killed": killed, "late_ms_alive": alive}
    common.report("bench_replicas", rows, info, time.perf_counter() - started, args.quick)


if __name__ == "__main__":
    main()
