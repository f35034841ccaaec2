"""schemathesis fuzzes a real server from the HTTP door's own OpenAPI document, with every check.

Every operation of the document (both path forms, the live reads included), in
schemathesis's positive and negative modes, against a server on loopback on
SQLite and one on a PostgreSQL database of its own: each answer goes through
every check schemathesis has (``schemathesis.checks``, as ``--checks all``): no
5xx; its status, content type, headers and body (server-sent events included,
event by event) as documented; a request the document allows is taken and one
it refuses is refused. After every refused call (4xx) the store's write counters
(events, their head txid, entities, idempotency records) are what they were, or
moved only by the server's own background work that an earlier call began (a
parent's SIGKILL cascading to its children, a child's end recorded in its parent:
core/cascade.py), each such commit read back and checked to be one.

The seed changes with each run and is printed (and named by any failure):
``ELECTRIC_FUZZ_SEED=N`` replays a run. A run lasts its time budget
(``ELECTRIC_FUZZ_SECONDS``; shorter under ``ELECTRIC_FORCE_FALLBACKS``), then
stops. Live reads and waits are bounded as a caller bounds them, with the
documented ``timeout``: a case that would hold (``live=…``, ``wait=run``) with
no timeout, or a valid one, gets a short one. A shorter run turns tokens on and
sends each case with no token, an unknown one, or one of test_auth's principals.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import psycopg
import pytest
import requests
import schemathesis
from electric_server.core.cascade import CASCADE_SENDER, CHILD_EVENT
from electric_server.http.openapi import document
from electric_server.http.query import DURATION_RE
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import SchemathesisConfig
from schemathesis.config._checks import NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES
from test_auth import TOKENS, TOKENS_TOML

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import Signal, stages_of
from electric_sdk.testing import TestServer

# A new seed each run (printed; named by a failure); ELECTRIC_FUZZ_SEED replays one.
SEED = int(os.environ.get("ELECTRIC_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
# The run's second pass (every fast path off) fuzzes briefly: the first pass fuzzed the door.
FALLBACKS = bool(os.environ.get("ELECTRIC_FORCE_FALLBACKS"))
BUDGET_S = float(os.environ.get("ELECTRIC_FUZZ_SECONDS") or (12 if FALLBACKS else 60))
TOKEN_BUDGET_S = BUDGET_S / 3
# A run that calls fewer cases a second has not fuzzed (about 40 a second unloaded, on 2 cores). A
# loaded machine calls fewer in the budget, so the run goes on past it, up to OVERTIME times it, until
# it has called that many.
MIN_CASES_PER_S = 5
OVERTIME = 5
# pytest's own timeout leaves room for the overtime, and for the server's start and stop.
pytestmark = pytest.mark.timeout(BUDGET_S * OVERTIME + 120)
# Entities spawned first, so generated calls reach existing entities too (a random name mostly
# finds none).
SEEDED = [("agent", f"a{n}") for n in range(4)]
load_all_checks()
CHECKS_ALL = list(CHECKS.get_all())  # `--checks all`
# schemathesis's defaults, but that a refusal may also be 413 (the document's answer to a text, a
# payload or a body too large: MESSAGE_TOO_LARGE, PAYLOAD_TOO_LARGE, BODY_TOO_LARGE).
CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            "negative_data_rejection": {
                "expected-statuses": [*NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES, "413"],
            }
        }
    }
)
# How long a generated live read or wait holds: the caller's bound, the documented timeout.
HOLD = "150ms"

NewEvents = list[tuple[int, str, bytes]]


class WriteCounters(Protocol):
    def __call__(self) -> tuple[Any, ...]:
        """What any write changes: the events and their head txid, entities, the calls'
        idempotency keys and the others (first, in this order), and what else the store counts."""
        ...

    def since(self, low: int, high: int) -> NewEvents:
        """The events of the commits whose txid is above ``low``, up to ``high``: (txid, kind, body)."""
        ...


class _OutOfTime(Exception):
    """The run's budget is spent: hypothesis stops at the first exception (no shrinking)."""


_SINCE = "SELECT txid, kind, body FROM events WHERE txid > {0} AND txid <= {0} ORDER BY txid"
# The keys this test's calls give (``fuzz`` makes each valid one key-N), and the others: those the
# server's background work stores (core/cascade.py's "cascade-…", "child-…", "wake-…").
_CLIENT_KEYS = "SELECT count(*) FROM idempotency WHERE key LIKE 'key-%'"
_OTHER_KEYS = "SELECT count(*) FROM idempotency WHERE key NOT LIKE 'key-%'"


class SqliteCounters:
    """The counters of a SQLite store, and its txid counter."""

    def __init__(self, database: Path) -> None:
        self._uri = f"file:{database}?mode=ro"

    def __call__(self) -> tuple[Any, ...]:
        with contextlib.closing(sqlite3.connect(self._uri, uri=True)) as conn:
            return (
                conn.execute("SELECT count(*), coalesce(max(txid), 0) FROM events").fetchone(),
                conn.execute("SELECT count(*) FROM entities").fetchone(),
                conn.execute(_CLIENT_KEYS).fetchone(),
                conn.execute(_OTHER_KEYS).fetchone(),
                tuple(conn.execute("SELECT name, value FROM meta ORDER BY name")),
            )

    def since(self, low: int, high: int) -> NewEvents:
        with contextlib.closing(sqlite3.connect(self._uri, uri=True)) as conn:
            return [(t, k, bytes(b)) for t, k, b in conn.execute(_SINCE.format("?"), (low, high))]


class PostgresCounters:
    """The same on PostgreSQL (its txid sequence moves in transactions that roll back too)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def __call__(self) -> tuple[Any, ...]:
        with self._conn.transaction():
            return tuple(
                self._conn.execute(sql).fetchone()
                for sql in (
                    "SELECT count(*), coalesce(max(txid), 0) FROM events",
                    "SELECT count(*) FROM entities",
                    _CLIENT_KEYS,
                    _OTHER_KEYS,
                )
            )

    def since(self, low: int, high: int) -> NewEvents:
        with self._conn.transaction():
            rows = self._conn.execute(_SINCE.format("%s"), (low, high)).fetchall()
        return [(t, k, bytes(b)) for t, k, b in rows]


def not_background(before: tuple[Any, ...], after: tuple[Any, ...], counters: WriteCounters) -> str:
    """What changed from ``before`` to ``after`` that is not the server's own background work
    begun by an earlier call ("" if nothing): no entity is new and no key of a call is stored;
    every new commit carries a cascade's signal or a parent's record of its child's end
    (core/cascade.py); and what else moved (the other keys, SQLite's txid counter) moved only
    beside such work."""
    (events_before, head_before), (events_after, head_after) = before[0], after[0]
    commits: dict[int, list[tuple[str, bytes]]] = {}
    for txid, kind, body in counters.since(head_before, head_after):
        commits.setdefault(txid, []).append((kind, body))
    found = {txid: [kind for kind, _ in events] for txid, events in commits.items()}
    said = f"counters {before} -> {after}; commits since: {found}"
    if after[1] != before[1] or after[2] != before[2]:
        return said  # an entity, or a call's key
    if events_after - events_before != sum(len(events) for events in commits.values()):
        return said
    if not all(any(_cascaded(kind, body) for kind, body in events) for events in commits.values()):
        return said
    return "" if commits or after[3] != before[3] else said


def _cascaded(kind: str, body: bytes) -> bool:
    if kind == CHILD_EVENT:
        return True
    return kind == "signal" and pb.Event.FromString(body).signal.sender == CASCADE_SENDER


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as http:
        yield http


def _seed_entities(server: TestServer, session: requests.Session, headers: dict[str, str]) -> None:
    for type_, id_ in SEEDED:
        spawned = session.put(f"{server.http_address}/{type_}/{id_}", headers=headers, timeout=30)
        assert spawned.status_code == 201, spawned.text


def _cases() -> st.SearchStrategy[schemathesis.Case]:
    """Cases of every operation in the document, random names and the seeded entities alike."""
    schema = schemathesis.openapi.from_dict(document(), config=CONFIG)
    strategies = []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            strategies.append(operation.as_strategy(generation_mode=mode))
            if "{type}" in operation.path:
                for type_, id_ in SEEDED[:2]:
                    fixed = {"type": type_, "id": id_}
                    strategies.append(operation.as_strategy(generation_mode=mode, path_parameters=fixed))
        # The live reads, on entities that exist, as often as the rest: each of their answers
        # is checked against the document (the event streams event by event).
        live = [p.definition["schema"]["enum"] for p in operation.query if p.name == "live"]
        fixed = {"type": SEEDED[0][0], "id": SEEDED[0][1]} if "{id}" in operation.path else None
        for mode in live[0] if live else ():
            strategies.append(operation.as_strategy(path_parameters=fixed, query={"live": mode}))
    return st.one_of(strategies)


def _bounded(case: schemathesis.Case) -> None:
    """A read that would hold (live, or a send's wait) gets the short timeout a caller would give
    it; a timeout the door refuses is left to be refused."""
    query = case.query
    if not isinstance(query, dict) or not ({"live", "wait"} & set(query)):
        return
    timeout = query.get("timeout")
    if timeout is None or (isinstance(timeout, str) and DURATION_RE.fullmatch(timeout)):
        query["timeout"] = HOLD


def _stage_of_its_signal(case: schemathesis.Case) -> None:
    """Which stages a signal's ``wait`` may name depends on the body's signal (lifecycle.STAGES),
    which no schema of a query parameter can say: the parameter's description says a stage the
    signal lacks is 400 STAGE_NOT_AVAILABLE (tests/runtime/test_stop_stages.py tests it). Such a
    case waits for ``accepted`` instead, which every signal has."""
    query, payload = case.query, case.body
    if not isinstance(query, dict) or not isinstance(payload, dict) or "wait" not in query:
        return
    try:
        signal = Signal.parse(str(payload.get("signal", "")))
    except ValueError:
        return  # refused for its signal, before its wait is read
    if isinstance(query["wait"], str) and query["wait"] not in {stage.value for stage in stages_of(signal)}:
        query["wait"] = "accepted"


def fuzz(
    server: TestServer,
    session: requests.Session,
    counters: WriteCounters,
    tokens: list[dict[str, str]],
    *,
    budget_s: float,
    seed: int,
) -> Counter[int]:
    """Call generated cases for ``budget_s``, each with one of ``tokens``' headers and every
    check; the statuses."""
    statuses: Counter[int] = Counter()
    operations: Counter[str] = Counter()
    streams: Counter[int] = Counter()  # the answers that were event streams
    started = time.monotonic()
    keys = iter(range(10**9))

    @hypothesis_seed(seed)
    @settings(
        max_examples=10**6,  # the budget ends the run
        database=None,
        deadline=None,
        phases=[Phase.generate],  # a failure stops the run as it is: the seed replays it
        suppress_health_check=list(HealthCheck),
    )
    @given(case=_cases(), auth=st.sampled_from(tokens))
    def call(case: schemathesis.Case, auth: dict[str, str]) -> None:
        elapsed = time.monotonic() - started
        if elapsed > budget_s * OVERTIME or (
            elapsed > budget_s and sum(statuses.values()) >= MIN_CASES_PER_S * budget_s
        ):
            raise _OutOfTime
        key = (case.headers or {}).get("Idempotency-Key")
        if (
            isinstance(key, str)
            and 1 <= len(key) <= 128
            and key.isascii()
            and key.isprintable()
            and " " not in key
        ):
            # A fresh key: a reused one with another request is IDEMPOTENCY_KEY_REUSED (400).
            case.headers["Idempotency-Key"] = f"key-{next(keys)}"
        _bounded(case)
        _stage_of_its_signal(case)
        before = counters()
        response = case.call(base_url=server.http_address, session=session, headers=auth, timeout=30)
        statuses[response.status_code] += 1
        operations[f"{case.method} {case.path}"] += 1
        if "text/event-stream" in str(response.headers.get("content-type")):
            streams[response.status_code] += 1
        case.validate_response(response, checks=CHECKS_ALL, headers=auth)
        if response.status_code >= 400 and (after := counters()) != before:
            wrote = not_background(before, after, counters)
            assert not wrote, f"refused {case.method} {case.formatted_path} wrote: {wrote}"

    try:
        call()
    except _OutOfTime:
        pass
    except BaseException as exc:
        raise AssertionError(
            f"schemathesis found a fault (seed {seed}: ELECTRIC_FUZZ_SEED={SEED} replays the run)"
        ) from exc
    cases = sum(statuses.values())
    print(
        f"schemathesis seed {seed} (ELECTRIC_FUZZ_SEED={SEED}), checks: "
        f"{', '.join(c.__name__ for c in CHECKS_ALL)}; {cases} cases over {len(operations)} "
        f"operations in {time.monotonic() - started:.1f}s; statuses {dict(sorted(statuses.items()))}, "
        f"{sum(streams.values())} of them event streams"
    )
    assert cases >= MIN_CASES_PER_S * budget_s, f"only {cases} cases in {budget_s * OVERTIME}s"
    return statuses


def test_only_background_work_may_move_the_counters_past_a_refusal() -> None:
    """The rule the fuzz's refusals are held to: a cascade an earlier call began may land meanwhile
    (its signal, its parent's record, their own keys); nothing else may."""

    def event(kind: str, sender: str = "") -> tuple[str, bytes]:
        message = pb.Event()
        if kind == "signal":
            message.signal.sender = sender
        return kind, message.SerializeToString()

    class Store:
        def __init__(self, *events: tuple[int, tuple[str, bytes]]) -> None:
            self.events = events

        def __call__(self) -> tuple[Any, ...]:
            raise AssertionError("not read here")

        def since(self, low: int, high: int) -> NewEvents:
            return [(txid, kind, body) for txid, (kind, body) in self.events if low < txid <= high]

    before = ((10, 5), (3,), (1,), (0,), ("txid", 5))
    cascade = Store((6, event("signal", CASCADE_SENDER)), (6, event("state")))
    moved = ((12, 6), (3,), (1,), (1,), ("txid", 6))
    assert not_background(before, moved, cascade) == ""
    assert (
        not_background(before, ((11, 6), (3,), (1,), (0,), ("txid", 6)), Store((6, event(CHILD_EVENT)))) == ""
    )
    # A key alone, stored beside no event (a record for a parent whose stream closed).
    assert not_background(before, ((10, 5), (3,), (1,), (1,), ("txid", 6)), Store()) == ""
    assert not_background(before, moved, Store((6, event("signal", "someone")), (6, event("state"))))
    assert not_background(before, ((12, 6), (3,), (2,), (1,), ("txid", 6)), cascade)  # a call's key
    assert not_background(before, ((12, 6), (4,), (1,), (1,), ("txid", 6)), cascade)  # an entity
    assert not_background(before, ((10, 5), (3,), (1,), (0,), ("txid", 6)), Store())  # a txid, alone
    assert not_background(before, ((13, 6), (3,), (1,), (1,), ("txid", 6)), cascade)  # an event unseen


def _assert_reached_past_refusals(statuses: Counter[int]) -> None:
    # The run reached past the refusals: the seeded entities answered, and some writes landed.
    assert statuses[200] > 0
    assert statuses[201] > 0


@pytest.mark.slow
def test_schemathesis_on_sqlite(session: requests.Session) -> None:
    with TestServer(http="127.0.0.1:0", synchronous="NORMAL") as server:
        _seed_entities(server, session, {})
        counters = SqliteCounters(server.data_dir / "electric.db")
        statuses = fuzz(server, session, counters, [{}], budget_s=BUDGET_S, seed=SEED)
    _assert_reached_past_refusals(statuses)


@pytest.mark.slow
def test_schemathesis_on_postgres(session: requests.Session, postgres_url: str) -> None:
    with (
        TestServer(http="127.0.0.1:0", database_url=postgres_url) as server,
        psycopg.connect(postgres_url, autocommit=True) as conn,
    ):
        _seed_entities(server, session, {})
        statuses = fuzz(server, session, PostgresCounters(conn), [{}], budget_s=BUDGET_S, seed=SEED + 1)
    _assert_reached_past_refusals(statuses)


@pytest.mark.slow
def test_schemathesis_with_tokens(session: requests.Session, tmp_path: Path) -> None:
    """With --tokens, each case carries no token, an unknown one, or one of test_auth's
    principals: every refusal (401, 403) is documented and writes nothing."""
    tokens_file = tmp_path / "tokens.toml"
    tokens_file.write_text(TOKENS_TOML)
    tokens_file.chmod(0o600)
    headers = [{}, {"authorization": "Bearer not-a-token"}] + [
        {"authorization": f"Bearer {token}"} for token, _principal, _scopes in TOKENS.values()
    ]
    with TestServer(http="127.0.0.1:0", synchronous="NORMAL", tokens_file=tokens_file) as server:
        _seed_entities(server, session, headers[2])  # admin
        counters = SqliteCounters(server.data_dir / "electric.db")
        statuses = fuzz(server, session, counters, headers, budget_s=TOKEN_BUDGET_S, seed=SEED + 2)
    assert statuses[401] > 0
    assert statuses[403] > 0
    assert statuses[200] > 0
