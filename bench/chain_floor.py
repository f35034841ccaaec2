"""The floor of SIGINT → `unwound` in electric's shape, with none of electric's code in it.

Three Python processes, as electric's figure has: a client, a server and a worker. The client
makes a unary gRPC call (grpc.aio, bytes in and out); the server commits a row (asyncpg, one
autocommit INSERT on PostgreSQL: a round trip and its WAL flush), sends a message down a
bidirectional gRPC stream the worker holds open, and the worker cancels the asyncio task it is
"running" (a sleep), waits for it to end and answers up the stream; the server commits a second
row and answers the call. That is the least any SIGINT → the run's own record can be in this
architecture (gRPC doors, a worker in its own process, durable commits on PostgreSQL), measured
on the same machine in the same run as the figure: what electric adds over it is its own code.

``python bench/chain_floor.py`` prints the p50 and p99 on the default database;
bench_dbos.py runs it beside its figure (``measure``).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import pg_common
import trip_cpu

SERVICE = "electric.bench.ChainFloor"
WARMUP = 50


def _identity(b: bytes) -> bytes:
    return b


def server_main(url: str, port_out: Any, stop: Any) -> None:
    """The server: a unary ``Call`` and the worker's ``Work`` stream; two commits per call."""
    import asyncpg
    import grpc

    async def main() -> None:
        try:
            conn = await asyncpg.connect(url, server_settings={"synchronous_commit": "on"})
        except BaseException as exc:
            port_out.put(f"cannot connect to {url}: {exc!r}")  # measure() raises it
            raise
        await conn.execute("CREATE TABLE IF NOT EXISTS chain_floor (n bigserial PRIMARY KEY, body bytea)")
        lock = asyncio.Lock()  # one connection, one statement at a time (the calls come one by one)
        outbox: asyncio.Queue[bytes] = asyncio.Queue()
        replies: dict[bytes, asyncio.Future[bytes]] = {}
        worker_ready = asyncio.Event()

        async def commit(body: bytes) -> None:
            async with lock:
                await conn.execute("INSERT INTO chain_floor (body) VALUES ($1)", body)

        async def call(request: bytes, context: Any) -> bytes:
            await commit(request)  # the signal's own commit
            done = asyncio.get_running_loop().create_future()
            replies[request] = done
            await outbox.put(request)
            answer = await done  # the worker's record of the run's end
            await commit(answer)
            return answer

        async def work(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            async def read() -> None:
                async for reply in requests:
                    replies.pop(reply[: reply.index(b"|")]).set_result(reply)

            reader = asyncio.create_task(read())
            worker_ready.set()
            try:
                while True:
                    yield await outbox.get()
            finally:
                reader.cancel()

        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Call": grpc.unary_unary_rpc_method_handler(call, _identity, _identity),
                "Work": grpc.stream_stream_rpc_method_handler(work, _identity, _identity),
            },
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        port_out.put(port)
        await asyncio.wait_for(worker_ready.wait(), 60)
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        await server.stop(0)
        await conn.close()

    asyncio.run(main())


def worker_main(port: int) -> None:
    """The worker: holds a "run" (a task in a sleep); each message cancels it, answers once it
    has ended, and starts the next."""
    import grpc

    async def main() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.stream_stream(f"/{SERVICE}/Work", _identity, _identity)()
            run = asyncio.create_task(asyncio.sleep(86400))
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    return
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
                await call.write(message + b"|aborted")
                run = asyncio.create_task(asyncio.sleep(86400))

    asyncio.run(main())


def client_main(port: int, samples: int, cpu: dict[str, Any] | None, out: Any) -> None:
    """The client: one call at a time, each timed from the call to its answer. ``cpu``: then as
    many more (``trips``), each read for the CPU it cost (trip_cpu.py) the ``groups`` of
    processes and the database's backends at ``url``, in a loop of their own."""
    import grpc

    async def main() -> dict[str, Any]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(f"/{SERVICE}/Call", _identity, _identity)
            ms: list[float] = []
            for i in range(WARMUP + samples):
                t0 = time.perf_counter()
                answer = await call(f"s{i}".encode())
                if i >= WARMUP:
                    ms.append((time.perf_counter() - t0) * 1e3)
                assert answer.endswith(b"|aborted"), answer
            result: dict[str, Any] = {"chain_ms": ms}
            if cpu is not None:
                meter = trip_cpu.TripCPU(cpu["groups"] | {"PostgreSQL": await trip_cpu.backends(cpu["url"])})
                for i in range(cpu["trips"]):
                    meter.before()
                    answer = await call(f"c{i}".encode())
                    meter.after()
                    assert answer.endswith(b"|aborted"), answer
                result["cpu"] = meter.result()
            return result

    try:
        out.put(asyncio.run(main()))
    except BaseException as exc:
        out.put({"error": repr(exc)})
        raise


def measure(url: str, samples: int, timeout: float = 300.0) -> list[float]:
    """``samples`` trips of the chain on the database at ``url`` (its table is made there)."""
    return measure_with_cpu(url, samples, 0, timeout)[0]


def measure_with_cpu(
    url: str, samples: int, cpu_trips: int, timeout: float = 300.0
) -> tuple[list[float], dict[str, Any] | None]:
    """``measure``'s trips, then ``cpu_trips`` more read for their CPU by process (trip_cpu.py:
    ``TripCPU.result()``; None when there are none, or the platform cannot read it)."""
    ctx = mp.get_context("spawn")
    port_q, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=server_main, args=(url, port_q, stop), daemon=True)
    server.start()
    worker = None
    try:
        port = port_q.get(timeout=60)
        if isinstance(port, str):
            raise RuntimeError(f"the chain floor's server failed: {port}")
        worker = ctx.Process(target=worker_main, args=(port,), daemon=True)
        worker.start()
        cpu = None
        if cpu_trips and trip_cpu.available():
            groups = {"server": [server.pid], "worker": [worker.pid]}
            cpu = {"groups": groups, "url": url, "trips": cpu_trips}
        result = common.run_in_process(client_main, port, samples, cpu, timeout=timeout, name="chain floor")
        return result["chain_ms"], result.get("cpu")
    finally:
        if worker is not None:  # first, or its channel logs the server's GOAWAY
            worker.kill()
            worker.join(10)
        stop.set()
        server.join(10)
        if server.is_alive():
            server.kill()


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=2000, help="trips (default 2000)")
    args = p.parse_args()
    with pg_common.fresh_database("electric_bench_chain_floor") as url:
        ms = measure(url, common.scale(args.samples, args.quick, 10))
    s = common.summarize(ms)
    print(f"chain floor over {len(ms)} trips: p50 {s['p50']:.3f} ms, p99 {s['p99']:.3f} ms")


if __name__ == "__main__":
    main()
