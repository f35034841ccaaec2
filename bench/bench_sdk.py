"""SDK overhead: AsyncClient.signal() vs the raw stub, AsyncClient.watch() vs a bare stream.

Servers: ``electric server`` (fresh data dir, SQLite WAL, synchronous=FULL)
and the echo server (common.py), each in its own OS process; all client work
runs in spawned client processes (multiprocessing, spawn), one per part.

Part 1 — signal latency, one caller, sequential. The same client process
holds an ``AsyncClient``, the generated ``EntityServiceStub`` on its own
grpc.aio channel (the SDK's channel options), and a sync ``Client`` (portal
thread). Every call is SIGUSR with reason "bench" and the same small JSON
payload to one of 200 pre-spawned entities (they stay `spawning`: SIGUSR is
recorded as `ignored`, and every call appends one signal record durably).
The SDK always sends an idempotency key (a uuid4), so the stub's request
carries a fresh uuid4 key too: both make the server do the same idempotency
work, and the difference is the SDK's. The stub builds its request per call,
as a caller of the generated code would (the payload ``Value`` is built
once). Two layers in between show where the SDK's time goes: the stub call
followed by ``SignalResult.from_pb`` (the result model), and
``AsyncClient._call`` given the stub's request (the retry loop and error
translation, no models). Warm-up, then 10 rounds that alternate all five
callers (rotating order; --rounds), so drift lands on all of them. Figure: SDK p50
over all measured calls; ceiling: the stub's p50; target ratio <= 1.15.
Info: p99, client CPU per call (the whole client process), server CPU per
call, the sync Client, the layers.

Part 2 — events/s through ``AsyncClient.watch(ref, 0)``, catch-up path.
One entity gets N SIGUSR signals beforehand (64 concurrent raw-stub callers,
so the store group-commits them), then every read starts at offset 0 and
counts messages until it has the entity's whole stream (spawn event + N),
then breaks. Ceiling: the echo server's ``Stream`` (a bare grpc.aio
server-stream) sending the same number of messages, each the mean serialized
size of electric's WatchEventsResponse for these events, read as raw bytes.
Target ratio >= 0.5. Info: the raw stub's WatchEvents (protobuf decode, no
SDK models), the raw stub plus ``Event.from_pb`` per message (the SDK's event
model), and a raw-bytes read of WatchEvents (no decode: what the server and
transport allow), so the SDK's own cost is visible. 5 rounds alternate the
five readers (rotating order); medians are reported, because single reads
on this 2-core machine vary a lot (a bare stream reads 13k-25k messages/s).

Both parts also time the SDK's client-side work without a network: an
AsyncClient whose stub is replaced (in the client process only) by a fake
that returns a real response instantly, and the pieces that work is made of.
``--profile DIR`` adds a cProfile of one extra SDK round of each part.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

SIG_TYPE = "sdk"
WATCH_TYPE = "sdkw"
WATCH_ID = "w0"
REASON = "bench"
PAYLOAD = {"note": "bench", "n": 1}
# The SDK's own channel options (AsyncClient._bind); the raw stub gets the same.
CHANNEL_OPTIONS = [("grpc.keepalive_time_ms", 30_000), ("grpc.enable_retries", 0)]
WATCH_METHOD = "/electric.v1.EntityService/WatchEvents"
CALL_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 300.0
CLIENT_TIMEOUT_S = 1500.0
# Measured callers (alternating rounds). "model" and "call" are layers between stub and SDK:
#   model: the raw stub call, then SignalResult.from_pb on the response (the SDK's result model)
#   call:  AsyncClient._call with the stub's request (the SDK's retry loop and error translation)
KINDS_SIGNAL = ("sdk", "stub", "model", "call", "sync")
# Readers. "model": the raw stub's WatchEvents, then Event.from_pb per message (the SDK's event model).
KINDS_WATCH = ("echo", "sdk", "stub", "model", "bytes")


def _payload_pb() -> Any:
    from google.protobuf import struct_pb2

    value = struct_pb2.Value()
    value.struct_value.update(PAYLOAD)
    return value


class _Meter:
    """Wall, this process's CPU, the server's CPU and everyone else's, over one measured stretch."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid

    def __enter__(self) -> _Meter:
        self.srv0 = common.proc_cpu_seconds(self.server_pid)
        self.sys0 = common.system_busy_seconds()
        self.cpu0 = time.process_time()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t0
        self.client_cpu = time.process_time() - self.cpu0
        self.server_cpu = common.proc_cpu_seconds(self.server_pid) - self.srv0
        self.other_cpu = max(
            0.0, common.system_busy_seconds() - self.sys0 - self.client_cpu - self.server_cpu
        )


def _profile_text(prof: Any, path: Path, limit: int = 25) -> str:
    import io
    import pstats

    path.parent.mkdir(parents=True, exist_ok=True)
    prof.dump_stats(str(path))
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(limit)
    return f"cProfile written to {path}\n" + buf.getvalue()


def _per_op_us(func: Callable[[], Any], n: int) -> float:
    for _ in range(max(1, n // 10)):  # warm-up
        func()
    t0 = time.perf_counter()
    for _ in range(n):
        func()
    return (time.perf_counter() - t0) / n * 1e6


async def _per_op_us_async(func: Callable[[], Any], n: int) -> float:
    for _ in range(max(1, n // 10)):  # warm-up
        await func()
    t0 = time.perf_counter()
    for _ in range(n):
        await func()
    return (time.perf_counter() - t0) / n * 1e6


class _FakeCall:
    """What a grpc.aio unary-stream call looks like to ``async for`` (already-decoded items)."""

    def __init__(self, items: list[Any]) -> None:
        self._items = iter(items)

    def __aiter__(self) -> _FakeCall:
        return self

    async def __anext__(self) -> Any:
        try:
            return next(self._items)
        except StopIteration:
            raise StopAsyncIteration from None

    def cancel(self) -> bool:
        return True


class _FakeStub:
    """Answers instantly with prepared responses: the SDK's client-side work, no network."""

    def __init__(self, signal_response: Any = None, watch_items: list[Any] | None = None) -> None:
        self.signal_response = signal_response
        self.watch_items = watch_items or []

    async def SignalEntity(self, request: Any, **kw: Any) -> Any:
        return self.signal_response

    def WatchEvents(self, request: Any, **kw: Any) -> _FakeCall:
        return _FakeCall(self.watch_items)


# -- part 1: signal latency -------------------------------------------------------------------


def _signal_client(address: str, server_pid: int, params: dict[str, Any]) -> dict[str, Any]:
    import uuid

    import grpc

    from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
    from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
    from electric_sdk._proto.electric.v1 import types_pb2 as pb
    from electric_sdk.client import AsyncClient, Client
    from electric_sdk.lifecycle import Outcome, Signal
    from electric_sdk.models import SignalResult

    entities: int = params["entities"]
    per_round: int = params["calls"] // params["rounds"]
    ids = [f"e{i:05d}" for i in range(entities)]
    refs = [f"{SIG_TYPE}/{x}" for x in ids]
    payload_pb = _payload_pb()
    sigusr = Signal.SIGUSR
    nxt = 0  # entity counter shared by all kinds: call k signals entity k % entities

    def take(n: int) -> range:
        nonlocal nxt
        nxt += n
        return range(nxt - n, nxt)

    def stub_request(i: int) -> Any:
        return api.SignalEntityRequest(
            ref=pb.EntityRef(type=SIG_TYPE, id=ids[i % entities]),
            signal=pb.SIGNAL_SIGUSR,
            reason=REASON,
            payload=payload_pb,
            idempotency_key=uuid.uuid4().hex,
        )

    result: dict[str, Any] = {}
    with asyncio.Runner() as runner:

        async def setup() -> tuple[Any, Any, Any]:
            client = AsyncClient(address)  # bound to this runner's loop
            channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            stub = api_grpc.EntityServiceStub(channel)
            sem = asyncio.Semaphore(32)

            async def spawn(i: int) -> None:
                async with sem:
                    await stub.SpawnEntity(
                        api.SpawnEntityRequest(ref=pb.EntityRef(type=SIG_TYPE, id=ids[i])),
                        timeout=CALL_TIMEOUT_S,
                    )

            await asyncio.wait_for(asyncio.gather(*(spawn(i) for i in range(entities))), READ_TIMEOUT_S)
            return client, channel, stub

        client, channel, stub = runner.run(setup())
        sync_client = Client(address)

        async def equivalence() -> dict[str, Any]:
            """One call each; capture the SDK's request on its way to its stub and compare."""
            captured: list[Any] = []
            sdk_stub = client._stub_for_this_loop()
            real = sdk_stub.SignalEntity

            async def spy(request: Any, **kw: Any) -> Any:
                captured.append(request)
                return await real(request, **kw)

            sdk_stub.SignalEntity = spy
            try:
                res = await client.signal(refs[0], sigusr, reason=REASON, payload=PAYLOAD)
            finally:
                sdk_stub.SignalEntity = real
            raw_req = stub_request(0)
            raw_resp = await stub.SignalEntity(raw_req, timeout=CALL_TIMEOUT_S)
            sdk_req = captured[0]
            a, b = api.SignalEntityRequest(), api.SignalEntityRequest()
            a.CopyFrom(sdk_req)
            b.CopyFrom(raw_req)
            a.ClearField("idempotency_key")
            b.ClearField("idempotency_key")
            assert a == b, f"requests differ:\n{a}\nvs\n{b}"
            assert len(sdk_req.idempotency_key) == len(raw_req.idempotency_key) == 32
            assert res.outcome is Outcome.IGNORED, res
            assert raw_resp.outcome == pb.SIGNAL_OUTCOME_IGNORED, raw_resp
            return {
                "sdk_request_bytes": sdk_req.ByteSize(),
                "stub_request_bytes": raw_req.ByteSize(),
                "response_bytes": raw_resp.ByteSize(),
                "response": raw_resp,
            }

        eq = runner.run(equivalence())
        response = eq.pop("response")
        result["equivalence"] = eq

        async def sdk_calls(n: int, lat: list[int] | None) -> None:
            for i in take(n):
                t0 = time.perf_counter_ns()
                await client.signal(refs[i % entities], sigusr, reason=REASON, payload=PAYLOAD)
                if lat is not None:
                    lat.append(time.perf_counter_ns() - t0)

        async def stub_calls(n: int, lat: list[int] | None) -> None:
            for i in take(n):
                t0 = time.perf_counter_ns()
                await stub.SignalEntity(stub_request(i), timeout=CALL_TIMEOUT_S)
                if lat is not None:
                    lat.append(time.perf_counter_ns() - t0)

        async def model_calls(n: int, lat: list[int] | None) -> None:
            for i in take(n):
                t0 = time.perf_counter_ns()
                SignalResult.from_pb(await stub.SignalEntity(stub_request(i), timeout=CALL_TIMEOUT_S))
                if lat is not None:
                    lat.append(time.perf_counter_ns() - t0)

        async def call_calls(n: int, lat: list[int] | None) -> None:
            for i in take(n):
                t0 = time.perf_counter_ns()
                await client._call("SignalEntity", stub_request(i))
                if lat is not None:
                    lat.append(time.perf_counter_ns() - t0)

        def sync_calls(n: int, lat: list[int] | None) -> None:
            for i in take(n):
                t0 = time.perf_counter_ns()
                sync_client.signal(refs[i % entities], sigusr, reason=REASON, payload=PAYLOAD)
                if lat is not None:
                    lat.append(time.perf_counter_ns() - t0)

        callers = {"sdk": sdk_calls, "stub": stub_calls, "model": model_calls, "call": call_calls}

        def run(kind: str, n: int, lat: list[int] | None) -> None:
            if kind == "sync":
                sync_calls(n, lat)  # a plain blocking caller, outside any event loop
            else:
                runner.run(asyncio.wait_for(callers[kind](n, lat), READ_TIMEOUT_S))

        for kind in KINDS_SIGNAL:
            run(kind, params["warmup"], None)
        per_kind: dict[str, dict[str, Any]] = {
            k: {
                "lat": [],
                "client_cpu": 0.0,
                "server_cpu": 0.0,
                "other_cpu": 0.0,
                "wall": 0.0,
                "round_p50": [],
            }
            for k in KINDS_SIGNAL
        }
        for r in range(params["rounds"]):
            order = KINDS_SIGNAL[r % len(KINDS_SIGNAL) :] + KINDS_SIGNAL[: r % len(KINDS_SIGNAL)]
            for kind in order:
                acc = per_kind[kind]
                lat: list[int] = []
                with _Meter(server_pid) as m:
                    run(kind, per_round, lat)
                acc["lat"].extend(lat)
                acc["round_p50"].append(common.percentile(lat, 50) / 1e6)
                for key in ("client_cpu", "server_cpu", "other_cpu", "wall"):
                    acc[key] += getattr(m, key)
        for kind, acc in per_kind.items():
            n = len(acc["lat"])
            result[kind] = {
                "calls": n,
                "latency_ms": common.summarize([x / 1e6 for x in acc.pop("lat")]),
                "round_p50_ms": acc["round_p50"],
                "client_cpu_us_per_call": acc["client_cpu"] / n * 1e6,
                "server_cpu_us_per_call": acc["server_cpu"] / n * 1e6,
                "client_cpu_util": acc["client_cpu"] / acc["wall"],
                "server_cpu_util": acc["server_cpu"] / acc["wall"],
                "other_cpu_util": acc["other_cpu"] / acc["wall"],
            }

        if params.get("profile"):
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
            runner.run(sdk_calls(per_round, None))
            prof.disable()
            result["profile"] = _profile_text(prof, Path(params["profile"]) / "bench_sdk-signal.pstats")

        result["breakdown"] = runner.run(_signal_breakdown(address, response, payload_pb, params["micro"]))
        sync_client.close()
        runner.run(client.close())
        runner.run(channel.close())
    return result


async def _signal_breakdown(address: str, response: Any, payload_pb: Any, n: int) -> dict[str, float]:
    """Client-side costs of one signal() with no network: µs per call, in this process."""
    import uuid

    from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
    from electric_sdk._proto.electric.v1 import types_pb2 as pb
    from electric_sdk.client import AsyncClient
    from electric_sdk.lifecycle import Signal
    from electric_sdk.models import EntityRef, SignalResult

    out: dict[str, float] = {}
    fake = _FakeStub(signal_response=response)
    client = AsyncClient(address)
    try:
        client._stub = fake  # type: ignore[assignment]  # this process only: no network below
        ref = f"{SIG_TYPE}/e00001"
        sigusr = Signal.SIGUSR

        def raw_request() -> Any:
            return api.SignalEntityRequest(
                ref=pb.EntityRef(type=SIG_TYPE, id="e00001"),
                signal=pb.SIGNAL_SIGUSR,
                reason=REASON,
                payload=payload_pb,
                idempotency_key=uuid.uuid4().hex,
            )

        async def raw() -> Any:
            return await fake.SignalEntity(raw_request(), timeout=CALL_TIMEOUT_S)

        request = raw_request()
        out["AsyncClient.signal() total, fake stub"] = await _per_op_us_async(
            lambda: client.signal(ref, sigusr, reason=REASON, payload=PAYLOAD), n
        )
        out["raw stub call total, fake stub"] = await _per_op_us_async(raw, n)
        out["  AsyncClient._call (tenacity retry loop)"] = await _per_op_us_async(
            lambda: client._call("SignalEntity", request), n
        )
        out["  fake stub call alone"] = await _per_op_us_async(lambda: fake.SignalEntity(request), n)
        from electric_sdk.arguments import json_argument

        out["  payload: JSON value to the wire's Value (SDK)"] = _per_op_us(
            lambda: json_argument(PAYLOAD, "payload"), n
        )
        out["  payload: request.payload.CopyFrom(Value)"] = _per_op_us(
            lambda: api.SignalEntityRequest().payload.CopyFrom(payload_pb), n
        )
        out["  SignalResult.from_pb"] = _per_op_us(lambda: SignalResult.from_pb(response), n)
        out["  EntityRef.parse(str).to_pb()"] = _per_op_us(lambda: EntityRef.parse(ref).to_pb(), n)
        out["  uuid.uuid4().hex"] = _per_op_us(lambda: uuid.uuid4().hex, n)
        out["  raw request construction"] = _per_op_us(raw_request, n)
    except Exception as exc:  # SDK internals moved: the breakdown is evidence, not a figure
        out["error"] = repr(exc)  # type: ignore[assignment]
    finally:
        client._stub = None
        await client.close()
    return out


# -- part 2: watch throughput --------------------------------------------------------------------


async def _watch_client_async(
    el_address: str, el_pid: int, echo_address: str, echo_pid: int, params: dict[str, Any]
) -> dict[str, Any]:
    import grpc

    from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
    from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
    from electric_sdk._proto.electric.v1 import types_pb2 as pb
    from electric_sdk.client import AsyncClient
    from electric_sdk.models import Event

    n_signals: int = params["signals"]
    ref_pb = pb.EntityRef(type=WATCH_TYPE, id=WATCH_ID)
    ref_str = f"{WATCH_TYPE}/{WATCH_ID}"
    result: dict[str, Any] = {}
    payload_pb = _payload_pb()

    async with (
        grpc.aio.insecure_channel(el_address, options=CHANNEL_OPTIONS) as channel,
        grpc.aio.insecure_channel(echo_address, options=CHANNEL_OPTIONS) as echo_channel,
        AsyncClient(el_address) as client,
    ):
        stub = api_grpc.EntityServiceStub(channel)
        # Pre-write: the entity, then N signals from 64 concurrent callers (group-committed).
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref_pb), timeout=CALL_TIMEOUT_S)
        request = api.SignalEntityRequest(
            ref=ref_pb, signal=pb.SIGNAL_SIGUSR, reason=REASON, payload=payload_pb
        )
        left = n_signals

        async def writer() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await stub.SignalEntity(request, timeout=CALL_TIMEOUT_S)

        t0 = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(writer() for _ in range(64))), READ_TIMEOUT_S)
        result["prewrite_s"] = time.perf_counter() - t0
        entity = (await stub.GetEntity(api.GetEntityRequest(ref=ref_pb), timeout=CALL_TIMEOUT_S)).entity
        count = entity.head_offset
        assert count == n_signals + 1, f"head_offset {count}, expected {n_signals + 1}"

        # The exact messages WatchEvents sends on catch-up, from ReadEvents: their sizes (for the
        # ceiling's payload) and, decoded, the fake stub's stream for the breakdown.
        responses: list[Any] = []
        offset = 0
        while offset < count:
            page = await stub.ReadEvents(
                api.ReadEventsRequest(ref=ref_pb, from_offset=offset, limit=1000), timeout=CALL_TIMEOUT_S
            )
            if not page.events:
                break
            responses.extend(api.WatchEventsResponse(event=e) for e in page.events)
            offset = page.next_offset
        sizes = [r.ByteSize() for r in responses]
        assert len(sizes) == count, (len(sizes), count)
        size = round(sum(sizes) / len(sizes))
        result["messages"] = count
        result["message_bytes"] = {"mean": sum(sizes) / len(sizes), "min": min(sizes), "max": max(sizes)}
        result["ceiling_payload_bytes"] = size

        echo_stream = echo_channel.unary_stream(common.ECHO_STREAM)
        raw_stream = channel.unary_stream(WATCH_METHOD)  # bytes out, no decode
        watch_request = api.WatchEventsRequest(ref=ref_pb, from_offset=0)
        watch_request_bytes = watch_request.SerializeToString()
        echo_request = count.to_bytes(4, "big") + b"x" * size

        async def read(kind: str, n: int) -> tuple[int, float]:
            """Read n messages from offset 0; returns (messages, perf_counter when the n-th arrived)."""
            got, done = 0, float("nan")
            if kind == "sdk":
                async with contextlib.aclosing(client.watch(ref_str, 0)) as events:
                    async for ev in events:
                        got += 1
                        if got >= n:
                            done = time.perf_counter()
                            assert ev.offset == n - 1, ev.offset
                            break
                return got, done
            if kind == "model":
                call = stub.WatchEvents(watch_request, timeout=READ_TIMEOUT_S)
                try:
                    async for msg in call:
                        Event.from_pb(msg.event)
                        got += 1
                        if got >= n:
                            done = time.perf_counter()
                            break
                finally:
                    call.cancel()
                return got, done
            if kind == "stub":
                call = stub.WatchEvents(watch_request, timeout=READ_TIMEOUT_S)
            elif kind == "bytes":
                call = raw_stream(watch_request_bytes, timeout=READ_TIMEOUT_S)
            else:
                call = echo_stream(n.to_bytes(4, "big") + echo_request[4:], timeout=READ_TIMEOUT_S)
            try:
                async for _ in call:
                    got += 1
                    if got >= n:
                        done = time.perf_counter()
                        break
            finally:
                call.cancel()
            return got, done

        # Warm-up: every reader once over part of the stream.
        for kind in KINDS_WATCH:
            await asyncio.wait_for(read(kind, min(count, params["warmup"])), READ_TIMEOUT_S)
        rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS_WATCH}
        for r in range(params["rounds"]):
            order = KINDS_WATCH[r % len(KINDS_WATCH) :] + KINDS_WATCH[: r % len(KINDS_WATCH)]
            for kind in order:
                with _Meter(echo_pid if kind == "echo" else el_pid) as m:
                    t0 = time.perf_counter()
                    got, done = await asyncio.wait_for(read(kind, count), READ_TIMEOUT_S)
                assert got == count, (kind, got, count)
                wall = done - t0
                rounds[kind].append(
                    {
                        "messages": got,
                        "wall_s": wall,
                        "events_per_s": got / wall,
                        "client_cpu_us_per_msg": m.client_cpu / got * 1e6,
                        "server_cpu_us_per_msg": m.server_cpu / got * 1e6,
                        "client_cpu_util": m.client_cpu / m.wall,
                        "server_cpu_util": m.server_cpu / m.wall,
                        "other_cpu_util": m.other_cpu / m.wall,
                    }
                )
        result["rounds"] = rounds

        if params.get("profile"):
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
            await asyncio.wait_for(read("sdk", count), READ_TIMEOUT_S)
            prof.disable()
            result["profile"] = _profile_text(prof, Path(params["profile"]) / "bench_sdk-watch.pstats")

        result["breakdown"] = await _watch_breakdown(el_address, responses, params["micro_events"])
    return result


async def _watch_breakdown(address: str, responses: list[Any], n: int) -> dict[str, float]:
    """Client-side costs per event of watch() with no network: µs per event, in this process."""
    from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
    from electric_sdk.client import AsyncClient
    from electric_sdk.models import Event

    items = responses[:n]
    encoded = [r.SerializeToString() for r in items]
    events = [r.event for r in items]
    out: dict[str, float] = {}
    client = AsyncClient(address)
    try:
        client._stub = _FakeStub(watch_items=items)  # type: ignore[assignment]  # this process only
        ref = f"{WATCH_TYPE}/{WATCH_ID}"

        async def sdk() -> None:
            async for _ in client.watch(ref, 0):
                pass

        async def bare() -> None:
            async for _ in _FakeCall(items):
                pass

        t0 = time.perf_counter()
        await sdk()
        out["AsyncClient.watch() per event, fake stream"] = (time.perf_counter() - t0) / len(items) * 1e6
        t0 = time.perf_counter()
        await bare()
        out["bare async for over the fake stream"] = (time.perf_counter() - t0) / len(items) * 1e6
        it = itertools.cycle(events)
        out["  Event.from_pb"] = _per_op_us(lambda: Event.from_pb(next(it)), len(events))
        from google.protobuf import json_format

        from electric_sdk._wire.events import event_value_json
        from electric_sdk._wire.times import timestamp_to_datetime

        it = itertools.cycle(events)
        out["    event_value_json (event value -> dict)"] = _per_op_us(
            lambda: event_value_json(next(it)), len(events)
        )
        it = itertools.cycle(events)
        out["      json_format.MessageToDict(payload)"] = _per_op_us(
            lambda: json_format.MessageToDict(next(it).signal.payload), len(events)
        )
        it = itertools.cycle(events)
        out["    timestamp_to_datetime (Timestamp -> datetime)"] = _per_op_us(
            lambda: timestamp_to_datetime(next(it).headers.timestamp), len(events)
        )
        enc = itertools.cycle(encoded)
        out["  WatchEventsResponse.FromString (stub's decode)"] = _per_op_us(
            lambda: api.WatchEventsResponse.FromString(next(enc)), len(encoded)
        )
    except Exception as exc:  # SDK internals moved: the breakdown is evidence, not a figure
        out["error"] = repr(exc)  # type: ignore[assignment]
    finally:
        client._stub = None
        await client.close()
    return out


# -- processes --------------------------------------------------------------------------------------


def signal_client_main(address: str, server_pid: int, params: dict[str, Any], out: Any) -> None:
    try:
        out.put(_signal_client(address, server_pid, params))
    except BaseException:
        out.put({"error": traceback.format_exc()[-3000:]})
        raise


def watch_client_main(
    el_address: str, el_pid: int, echo_address: str, echo_pid: int, params: dict[str, Any], out: Any
) -> None:
    try:
        out.put(asyncio.run(_watch_client_async(el_address, el_pid, echo_address, echo_pid, params)))
    except BaseException:
        out.put({"error": traceback.format_exc()[-3000:]})
        raise


def run_client(target: Callable[..., None], *args: Any) -> dict[str, Any]:
    return common.run_in_process(target, *args, timeout=CLIENT_TIMEOUT_S)


def _median(rounds: list[dict[str, Any]], key: str) -> float:
    return common.percentile([r[key] for r in rounds], 50)


def main() -> None:
    p = common.bench_args(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10, help="signal: alternating rounds (calls split evenly)")
    p.add_argument("--watch-rounds", type=int, default=5, help="watch: alternating rounds (median reported)")
    p.add_argument(
        "--profile", metavar="DIR", help="also cProfile one extra SDK round of each part (client side)"
    )
    args = p.parse_args()
    quick = args.quick
    t_start = time.perf_counter()
    sig_params = {
        "entities": common.scale(200, quick, 10),
        "warmup": common.scale(200, quick, 10),
        "calls": common.scale(2000, quick, args.rounds),
        "rounds": args.rounds,
        "micro": common.scale(20_000, quick, 100),
        "profile": args.profile,
    }
    watch_params = {
        "signals": common.scale(20_000, quick, 100),
        "warmup": common.scale(2_000, quick, 100),
        "rounds": 1 if quick else args.watch_rounds,
        "micro_events": common.scale(20_000, quick, 100),
        "profile": args.profile,
    }
    with (
        tempfile.TemporaryDirectory(prefix="electric-bench-sdk-") as tmp,
        common.start_echo(log=Path(tmp) / "echo.log") as echo,
        common.start_electric(Path(tmp) / "data") as srv,
    ):
        sig = run_client(signal_client_main, srv.address, srv.pid, sig_params)
        watch = run_client(watch_client_main, srv.address, srv.pid, echo.address, echo.pid, watch_params)

    s_sdk, s_stub = sig["sdk"], sig["stub"]
    w = {k: {key: _median(watch["rounds"][k], key) for key in watch["rounds"][k][0]} for k in KINDS_WATCH}
    n_calls = s_sdk["calls"]
    wr = watch_params["rounds"]
    med = f", median of {wr}" if wr > 1 else ""

    def sig_row(figure: str, kind: str, stat: str) -> common.Row:
        if stat == "cpu":
            value, ceiling, unit = sig[kind]["client_cpu_us_per_call"], s_stub["client_cpu_us_per_call"], "us"
        else:
            value, ceiling, unit = sig[kind]["latency_ms"][stat], s_stub["latency_ms"][stat], "ms"
        return common.value_row(f"  (info) {figure}", value, ceiling, unit)

    def watch_row(figure: str, kind: str, ceiling_kind: str = "echo") -> common.Row:
        value, ceiling = w[kind]["events_per_s"], w[ceiling_kind]["events_per_s"]
        return common.value_row(f"  (info) {figure}", value, ceiling, "events/s")

    rows = [
        common.ratio_row(
            f"AsyncClient.signal() p50, 1 caller, {n_calls} calls (ceiling: raw stub)",
            s_sdk["latency_ms"]["p50"],
            s_stub["latency_ms"]["p50"],
            "ms",
            "<=",
            1.15,
        ),
        sig_row("AsyncClient.signal() p99", "sdk", "p99"),
        sig_row("AsyncClient.signal() client CPU per call", "sdk", "cpu"),
        sig_row("sync Client.signal() p50 (portal thread)", "sync", "p50"),
        sig_row("sync Client.signal() p99", "sync", "p99"),
        sig_row("sync Client.signal() client CPU per call", "sync", "cpu"),
        sig_row("layer: raw stub + SignalResult.from_pb, p50", "model", "p50"),
        sig_row("layer: AsyncClient._call (retry loop), p50", "call", "p50"),
        common.value_row(
            "  (info) server CPU per call, SDK vs stub requests",
            s_sdk["server_cpu_us_per_call"],
            s_stub["server_cpu_us_per_call"],
            "us",
        ),
        common.ratio_row(
            f"AsyncClient.watch() catch-up, {watch['messages']} events{med} (ceiling: bare stream)",
            w["sdk"]["events_per_s"],
            w["echo"]["events_per_s"],
            "events/s",
            ">=",
            0.5,
        ),
        watch_row("raw stub WatchEvents (pb decode, no SDK models)", "stub"),
        watch_row("layer: raw stub + Event.from_pb per message", "model"),
        watch_row("WatchEvents read as raw bytes (no decode)", "bytes"),
        watch_row("AsyncClient.watch() vs raw stub WatchEvents", "sdk", "stub"),
        common.value_row(
            "  (info) watch client CPU per event, SDK vs raw stub",
            w["sdk"]["client_cpu_us_per_msg"],
            w["stub"]["client_cpu_us_per_msg"],
            "us",
        ),
        common.value_row(
            "  (info) server CPU per message, electric vs echo",
            w["bytes"]["server_cpu_us_per_msg"],
            w["echo"]["server_cpu_us_per_msg"],
            "us",
        ),
    ]
    elapsed = time.perf_counter() - t_start
    info = {
        "signal_params": sig_params,
        "watch_params": watch_params,
        "signal": sig,
        "watch": watch,
        "watch_medians": w,
    }
    common.report("bench_sdk", rows, info, elapsed, quick)

    eq = sig["equivalence"]
    print(
        "\nsignal: SDK and stub requests are equivalent — the same ref, SIGUSR, reason and payload, and "
        f"each a fresh uuid4 idempotency key ({eq['sdk_request_bytes']} vs {eq['stub_request_bytes']} "
        "bytes);\n  the SDK always sends a key, so the stub does too: without one the comparison would "
        "measure the server's\n  idempotency work (request hash + idempotency row), not the SDK."
    )
    names = {
        "sdk": "AsyncClient.signal()",
        "stub": "raw stub",
        "model": "stub + SignalResult.from_pb",
        "call": "AsyncClient._call",
        "sync": "Client.signal()",
    }
    print("  per caller (CPU in cores; 'other' = everything else on the machine):")
    for kind in KINDS_SIGNAL:
        x = sig[kind]
        lat = x["latency_ms"]
        rp = ", ".join(f"{v:.3f}" for v in x["round_p50_ms"])
        print(
            f"    {names[kind]:28s} {x['calls']} calls: p50 {lat['p50']:.3f} ms, p90 {lat['p90']:.3f}, "
            f"p99 {lat['p99']:.3f}, mean {lat['mean']:.3f}; client CPU {x['client_cpu_us_per_call']:.0f} "
            f"us/call, server {x['server_cpu_us_per_call']:.0f} us/call; CPU client "
            f"{x['client_cpu_util']:.2f}, server {x['server_cpu_util']:.2f}, other {x['other_cpu_util']:.2f}"
        )
        print(f"      p50 per round: {rp}")

    def cpu(kind: str) -> float:
        return float(sig[kind]["client_cpu_us_per_call"])

    def p50(kind: str) -> float:
        return float(sig[kind]["latency_ms"]["p50"]) * 1000

    print(
        "  the SDK's extra per call, split by layer (client CPU us / p50 us; differences of the rows above):"
    )
    split = {
        "retry loop + error translation (_call - stub)": ("call", "stub"),
        "result model (stub+from_pb - stub)": ("model", "stub"),
        "request building + rest (sdk - _call - result model)": None,
        "total (sdk - stub)": ("sdk", "stub"),
        "portal thread (sync - sdk)": ("sync", "sdk"),
    }
    for label, pair in split.items():
        if pair is None:
            c = cpu("sdk") - cpu("call") - (cpu("model") - cpu("stub"))
            t = p50("sdk") - p50("call") - (p50("model") - p50("stub"))
        else:
            c, t = cpu(pair[0]) - cpu(pair[1]), p50(pair[0]) - p50(pair[1])
        print(f"    {label:54s} {c:+7.0f} us CPU  {t:+7.0f} us p50")

    mb = watch["message_bytes"]
    print(
        f"\nwatch: {watch['messages']} messages per read (spawn event + {watch_params['signals']} SIGUSR, "
        f"pre-written in {watch['prewrite_s']:.1f} s); WatchEventsResponse {mb['mean']:.1f} bytes mean "
        f"({mb['min']}-{mb['max']}), ceiling payload {watch['ceiling_payload_bytes']} bytes"
    )
    for r in range(wr):
        for kind in KINDS_WATCH:
            x = watch["rounds"][kind][r]
            print(
                f"  round {r} {kind:5s}: {x['events_per_s']:8,.0f} events/s; client CPU "
                f"{x['client_cpu_us_per_msg']:5.1f} us/msg, server {x['server_cpu_us_per_msg']:5.1f} us/msg; "
                f"CPU client {x['client_cpu_util']:.2f}, server {x['server_cpu_util']:.2f}, "
                f"other {x['other_cpu_util']:.2f}"
            )
    wc = {k: w[k]["client_cpu_us_per_msg"] for k in KINDS_WATCH}
    print(
        "  client CPU per event (medians, us): transport + decode (stub) "
        f"{wc['stub']:.1f}; + Event.from_pb {wc['model'] - wc['stub']:+.1f}; "
        f"+ watch()'s generators {wc['sdk'] - wc['model']:+.1f}; SDK total {wc['sdk']:.1f}"
    )
    for title, bd in (("signal(), per call", sig["breakdown"]), ("watch(), per event", watch["breakdown"])):
        print(f"\nSDK client-side work without a network (hot loop), {title}, us:")
        for name, value in bd.items():
            print(f"  {name:52s} {value:8.2f}" if isinstance(value, float) else f"  {name}: {value}")
    for part in (sig, watch):
        if part.get("profile"):
            print("\n" + part["profile"])


if __name__ == "__main__":
    main()
