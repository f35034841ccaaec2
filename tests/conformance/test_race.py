"""Signals racing each other: 32 concurrent clients send random signals (all seven) at a pool of
~20 entities hosted by a real Worker, kept busy with messages, for a bounded time; entities that
reach `stopped`/`killed` are replaced by fresh ones.

Afterwards every stream is replayed with ``electric_server.tools.verify`` (clean, every transition legal
under the table, equal to the stored record), and every response the clients got is checked
against the log: the signal record with its txid exists, judged previous → new state as the
response said, and the state just before it in the log is that previous state. The only error
allowed is INVALID_SIGNAL, and only for an entity that is terminal.

The random seed is printed (``-s`` or a failure shows it); ``ELECTRIC_RACE_SEED`` replays one.
``ELECTRIC_RACE_SECONDS`` (default 10, at most 10) bounds the racing.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from electric_server.store.sqlite import SQLiteStore
from electric_server.tools.verify import compare, replay

from electric_sdk import AsyncClient, errors
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.enums import state_from_pb
from electric_sdk.lifecycle import Signal, State
from electric_sdk.models import SignalResult
from electric_sdk.runtime import App, Context, Message, SignalInfo, Worker
from electric_sdk.testing import TestServer

pytestmark = pytest.mark.anyio

CLIENTS = 32
POOL = 20
RACE_S = min(float(os.environ.get("ELECTRIC_RACE_SECONDS", "10")), 10.0)
# Half the pool is "hot": 16 clients fire at it back to back, so signals to one entity race each
# other. The other half is "warm": 16 clients pace themselves, so its entities also run messages
# (under a constant barrage from all 32 clients, entities start almost no runs in 10 s).
HOT = range(POOL // 2)
WARM = range(POOL // 2, POOL)
HOT_PACE_S, WARM_PACE_S = 0.0, 0.6
SEED = int(os.environ.get("ELECTRIC_RACE_SEED", "20261130"))
# Weighted toward the signals that keep an entity alive, so entities live a while.
WEIGHTS: dict[Signal, int] = {
    Signal.SIGINT: 20,
    Signal.SIGHUP: 10,
    Signal.SIGUSR: 25,
    Signal.SIGSTOP: 15,
    Signal.SIGCONT: 20,
    Signal.SIGTERM: 3,
    Signal.SIGKILL: 2,
}


def make_app() -> App:
    app = App(code_version="race")

    @app.entity("racer", grace_period="300ms", idle_timeout="2s")
    class Racer:
        async def on_message(self, ctx: Context, message: Message) -> None:
            for i in range(3):
                async with ctx.step(f"tool:{i}"):
                    await anyio.sleep(0.003)
                    ctx.output.write(f"{message.text}:{i} ")

        async def on_signal(self, ctx: Context, signal: SignalInfo) -> None:
            if signal.signal is Signal.SIGTERM:
                async with ctx.step("cleanup"):
                    await anyio.sleep(0.005)

    return app


@dataclass
class Race:
    rng: random.Random
    pool: list[str] = field(default_factory=list)
    spawned: list[str] = field(default_factory=list)
    results: list[SignalResult] = field(default_factory=list)
    invalid: list[tuple[str, Signal]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    replacing: set[str] = field(default_factory=set)
    messages: int = 0
    n: int = 0

    def new_ref(self) -> str:
        self.n += 1
        return f"racer/r{self.n}"


async def replace(race: Race, client: AsyncClient, ref: str) -> None:
    """Swap a terminal entity in the pool for a fresh one (once, whoever notices first)."""
    if ref not in race.pool or ref in race.replacing:
        return
    race.replacing.add(ref)
    new = race.new_ref()
    race.spawned.append(new)
    await client.spawn(new)  # spawned before it joins the pool: no one sees an unknown entity
    race.pool[race.pool.index(ref)] = new


async def signaller(race: Race, client: AsyncClient, stop_at: float, slots: range, pace_s: float) -> None:
    signals, weights = list(WEIGHTS), list(WEIGHTS.values())
    while time.monotonic() < stop_at:
        ref = race.pool[race.rng.choice(slots)]
        sig = race.rng.choices(signals, weights)[0]
        payload = {"n": race.rng.randrange(1000)} if sig is Signal.SIGUSR else None
        try:
            result = await client.signal(ref, sig, payload=payload, reason="race")
        except errors.InvalidSignal:
            race.invalid.append((ref, sig))
            await replace(race, client, ref)
            continue
        except Exception as exc:  # anything else is a failure
            race.failures.append(f"{ref} {sig.value}: {exc!r}")
            continue
        race.results.append(result)
        if result.new_state.terminal:
            await replace(race, client, ref)
        await anyio.sleep(race.rng.uniform(0, pace_s))


async def feeder(race: Race, client: AsyncClient, stop_at: float) -> None:
    while time.monotonic() < stop_at:
        ref = race.rng.choice(race.pool)
        try:
            await client.send(ref, f"m{race.messages}")
            race.messages += 1
        except errors.FailedPrecondition:  # terminal entity: refused, as it should be
            await replace(race, client, ref)
        await anyio.sleep(0.002)


def check_responses(ref: str, events: list, results: list[SignalResult]) -> list[str]:
    """Each response fits the log: its signal record (by txid), states, and the state before it."""
    problems: list[str] = []
    state: State | None = None
    by_txid: dict[int, tuple[pb.SignalValue, State | None]] = {}
    for stored in events:
        event = pb.Event.FromString(stored.body)
        kind = event.WhichOneof("value")
        if kind == "signal" and stored.operation == pb.OPERATION_INSERT:
            by_txid[stored.txid] = (event.signal, state)
        elif kind == "state":
            state = state_from_pb(event.state.state)
    for result in results:
        found = by_txid.get(result.txid)
        if found is None:
            problems.append(f"txid {result.txid} ({result.signal.value}): no signal record in the log")
            continue
        value, before = found
        logged = (state_from_pb(value.previous_state), state_from_pb(value.new_state))
        if logged != (result.previous_state, result.new_state):
            problems.append(
                f"txid {result.txid}: response {result.previous_state.value}→{result.new_state.value}, "
                f"log {logged}"
            )
        if before is not result.previous_state:
            problems.append(
                f"txid {result.txid}: log state before the signal {before}, response says "
                f"{result.previous_state.value}"
            )
    return problems


async def test_concurrent_signals_match_the_log(tmp_path: Path) -> None:
    print(f"race seed={SEED} seconds={RACE_S} (ELECTRIC_RACE_SEED to replay)")
    race = Race(random.Random(SEED))
    data = tmp_path / "electric"
    with TestServer(data, lease_ttl_ms=2000, heartbeat_interval_ms=100) as server:
        worker = Worker(make_app(), server.address)
        clients = [server.async_client() for _ in range(CLIENTS + 1)]
        # The worker runs on its own event loop (a portal thread), so the 32 clients on this loop
        # do not starve it: the entities keep running messages while the signals race.
        with anyio.from_thread.start_blocking_portal() as portal:
            try:
                with anyio.fail_after(RACE_S + 60):
                    await anyio.to_thread.run_sync(portal.start_task, worker.run)
                    for _ in range(POOL):
                        ref = race.new_ref()
                        race.pool.append(ref)
                        race.spawned.append(ref)
                        await clients[0].spawn(ref)
                    stop_at = time.monotonic() + RACE_S
                    async with anyio.create_task_group() as tg:
                        for i, c in enumerate(clients[:CLIENTS]):
                            slots, pace = (HOT, HOT_PACE_S) if i % 2 else (WARM, WARM_PACE_S)
                            tg.start_soon(signaller, race, c, stop_at, slots, pace)
                        tg.start_soon(feeder, race, clients[CLIENTS], stop_at)
                    await anyio.to_thread.run_sync(portal.call, worker.shutdown, 1.0)
            finally:
                for c in clients:
                    await c.close()

    counts: dict[str, int] = {}
    for r in race.results:
        counts[r.signal.value] = counts.get(r.signal.value, 0) + 1
    print(
        f"race: {len(race.results)} responses {counts}, {len(race.invalid)} INVALID_SIGNAL, "
        f"{race.messages} messages, {len(race.spawned)} entities"
    )
    assert not race.failures, f"seed={SEED}: unexpected errors:\n" + "\n".join(race.failures[:20])
    assert len(race.results) > CLIENTS, f"seed={SEED}: too few signals got through"

    by_ref: dict[str, list[SignalResult]] = {}
    for r in race.results:
        by_ref.setdefault(f"{r.ref.type}/{r.ref.id}", []).append(r)
    store = SQLiteStore(data / "electric.db", readonly=True)
    await store.open()
    problems: list[str] = []
    seen_states: set[State] = set()
    completed_runs = started_runs = 0
    try:
        with anyio.fail_after(60):
            for ref in race.spawned:
                key = tuple(ref.split("/"))
                record = await store.get_entity(key)  # type: ignore[arg-type]
                assert record is not None, ref
                for p in compare(record, await replay(store, key)):  # type: ignore[arg-type]
                    problems.append(f"{ref}: replay: {p}")
                events = await store.read_events(key, 0, 1_000_000)  # type: ignore[arg-type]
                assert len(events) == record.head_offset
                for stored in events:
                    event = pb.Event.FromString(stored.body)
                    if event.WhichOneof("value") == "state":
                        seen_states.add(state_from_pb(event.state.state))  # type: ignore[arg-type]
                    elif event.WhichOneof("value") == "run":
                        completed_runs += event.run.status == pb.RUN_STATUS_COMPLETED
                        started_runs += event.run.status == pb.RUN_STATUS_STARTED
                for p in check_responses(ref, events, by_ref.get(ref, [])):
                    problems.append(f"{ref}: {p}")
                if any(r == ref for r, _ in race.invalid) and not record.state.terminal:
                    problems.append(f"{ref}: INVALID_SIGNAL, but the entity is {record.state.value}")
    finally:
        await store.close()
    print(
        f"race: states seen {sorted(s.value for s in seen_states)}, {started_runs} runs started, {completed_runs} completed"
    )
    assert not problems, f"seed={SEED}:\n" + "\n".join(problems[:50])
    # The race reached the interesting states, and the worker did real work.
    assert {State.RUNNING, State.PAUSED, State.STOPPING, State.STOPPED, State.KILLED} <= seen_states
    assert completed_runs > 0
