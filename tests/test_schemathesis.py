"""schemathesis fuzzes a real server from the HTTP door's own OpenAPI document.

Every operation the door serves (both path forms), in schemathesis's positive
and negative modes, with a fixed seed: at least ``MIN_CASES`` calls against a
server on loopback, each answer checked against the document (its status is
listed, its content type and headers are the documented ones, its body matches
the schema) and never a 5xx; after every refused call (4xx) the store's write
counters (events, their head txid, entities, idempotency records, the txid
counter) are what they were before it. A second, shorter run turns tokens on
and sends each case with no token, an unknown one or one of test_auth's
principals. The live modes (``live=long-poll``, ``live=sse``) never end, and a
send's ``wait=run`` lasts until a run no worker starts has ended, so they are left out.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from electric_server.http.openapi import document
from electric_server.http.routes import ROUTES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    allow_header_conformance,
    content_type_conformance,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from test_auth import TOKENS, TOKENS_TOML

from electric_sdk.testing import TestServer

MIN_CASES = 1000
TOKEN_CASES = 300
# Entities spawned first, so generated calls reach existing entities too (a random name mostly
# finds none).
SEEDED = [("agent", f"a{n}") for n in range(4)]
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    positive_data_acceptance,  # the document is exact: a request it allows is taken (2xx, 404, 409)
    allow_header_conformance,
]


def write_counters(database: Path) -> tuple[Any, ...]:
    """What any write changes: the events and their head txid, entities, idempotency records,
    and the txid counter."""
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as conn:
        return (
            conn.execute("SELECT count(*), coalesce(max(txid), 0) FROM events").fetchone(),
            conn.execute("SELECT count(*) FROM entities").fetchone(),
            conn.execute("SELECT count(*) FROM idempotency").fetchone(),
            tuple(conn.execute("SELECT name, value FROM meta ORDER BY name")),
        )


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as http:
        yield http


def _seed(server: TestServer, session: requests.Session, headers: dict[str, str]) -> None:
    for type_, id_ in SEEDED:
        spawned = session.put(f"{server.http_address}/{type_}/{id_}", headers=headers, timeout=30)
        assert spawned.status_code == 201, spawned.text


def _cases() -> st.SearchStrategy[schemathesis.Case]:
    """Cases of every operation the door serves, random names and the seeded entities alike."""
    schema = schemathesis.openapi.from_dict(document())
    served_here = {route.operation for route in ROUTES if route.served_by_door}
    strategies = []
    for result in schema.get_all_operations():
        operation = result.ok()
        operation_id = operation.definition.raw.get("operationId", "")
        if operation_id.removesuffix("Electric") not in served_here:
            continue  # served by another module (http/streams.py), not mounted on this door
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            strategies.append(operation.as_strategy(generation_mode=mode))
            if "{type}" in operation.path:
                for type_, id_ in SEEDED[:2]:
                    fixed = {"type": type_, "id": id_}
                    strategies.append(operation.as_strategy(generation_mode=mode, path_parameters=fixed))
    # The live modes never end, and a wait (wait=run, with its timeout) lasts until a run no worker
    # is here to start has ended: both are tested where something answers them.
    waits = {"live", "wait", "timeout"}
    return st.one_of(strategies).filter(lambda case: not waits & set(case.query or {}))


def fuzz(
    server: TestServer, session: requests.Session, examples: int, tokens: list[dict[str, str]]
) -> Counter[int]:
    """Call ``examples`` generated cases, each with one of ``tokens``' headers; the statuses."""
    database = server.data_dir / "electric.db"
    statuses: Counter[int] = Counter()
    started = time.monotonic()

    @settings(
        max_examples=examples,
        derandomize=True,  # a fixed seed: the same cases every run
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=_cases(), auth=st.sampled_from(tokens))
    def call(case: schemathesis.Case, auth: dict[str, str]) -> None:
        if "Idempotency-Key" in case.headers:  # a fresh key: a reused one with another request is a 400
            case.headers["Idempotency-Key"] = f"key-{sum(statuses.values())}"
        before = write_counters(database)
        response = case.call(base_url=server.http_address, session=session, headers=auth, timeout=30)
        statuses[response.status_code] += 1
        case.validate_response(response, checks=CHECKS)
        if response.status_code >= 400:
            assert write_counters(database) == before, f"refused {case.method} {case.formatted_path} wrote"

    call()
    cases = sum(statuses.values())
    print(f"{cases} cases in {time.monotonic() - started:.1f}s; statuses {dict(sorted(statuses.items()))}")
    assert not [s for s in statuses if s >= 500]
    return statuses


@pytest.mark.slow
def test_schemathesis_from_the_openapi_document(session: requests.Session) -> None:
    with TestServer(http="127.0.0.1:0", synchronous="NORMAL") as server:
        _seed(server, session, {})
        statuses = fuzz(server, session, MIN_CASES + 100, [{}])
    assert sum(statuses.values()) >= MIN_CASES
    # The run reached past the refusals: the seeded entities answered, and some writes landed.
    assert statuses[200] > 0
    assert statuses[201] > 0


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
        _seed(server, session, headers[2])  # admin
        statuses = fuzz(server, session, TOKEN_CASES, headers)
    assert statuses[401] > 0
    assert statuses[403] > 0
    assert statuses[200] > 0
