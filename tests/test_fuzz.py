"""A fuzzer over every RPC of both services and the runtime stream (issue 18).

Hypothesis draws calls to every ``EntityService`` method and
``RuntimeService/Connect``: structured requests (names, signals, JSON
payloads up to past the depth limit, offsets and sizes at the edges of their
ranges, runtime frames of every kind) and raw bytes (random, or a structured
request's bytes cut short or with bytes flipped). The seed is fixed
(``derandomize``), so a run is repeatable. It runs once without tokens and
once with them (a wrong token, none, a narrow scope, a type restriction, or
the admin's). For every call it asserts:

- no ``UNKNOWN`` and no ``INTERNAL``; every error the server sends carries
  our ``ErrorInfo``;
- a refused call wrote nothing: the store's entity, event and idempotency
  rows are unchanged, but for the reaper's own writes (a fuzzed SIGTERM with
  a 1 ms grace period is reaped a moment later);
- the server still serves (health, every 50 calls and at the end);
- the log is quiet: no traceback, nothing at ERROR, nothing at WARNING but the
  refusal lines, and those within their rate limit.

The tally of status codes is printed (``pytest -s``). With
``ELECTRIC_FUZZ_TALLY=FILE`` it is written there as JSON and nothing is
asserted: that is how the counts of a server without these guarantees (an
older commit) are taken.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, struct_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.testing import TestServer

EXAMPLES = {"open": 2500, "tokens": 2000}
HEALTH_EVERY = 50
WATCH_WAIT_S = 0.25  # a watch open and quiet (from past the head) ends at this deadline, the client's
TALLY = os.environ.get("ELECTRIC_FUZZ_TALLY")
ENTITY = "/electric.v1.EntityService/"
CONNECT = "/electric.v1.RuntimeService/Connect"
UNARY = {
    "SpawnEntity",
    "GetEntity",
    "ListEntities",
    "SignalEntity",
    "SignalEntities",
    "SendMessage",
    "DeleteEntity",
    "ReadEvents",
}
STREAMS = {"WatchEvents", "WatchEntities"}
QUIET = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
REFUSAL_INTERVAL_S = 10.0  # errors.REFUSAL_LOG_INTERVAL_S
TOKENS = {
    "admin": ("fuzz-admin-token", "root", '["admin"]', None),
    "reader": ("fuzz-reader-token", "rita", '["read"]', None),
    "typed": ("fuzz-typed-token", "tess", '["read", "signal", "send", "runtime"]', '["agent"]'),
}
METADATA = {
    "admin": [("authorization", "Bearer fuzz-admin-token")],
    "reader": [("authorization", "Bearer fuzz-reader-token")],
    "typed": [("authorization", "Bearer fuzz-typed-token")],
    "wrong": [("authorization", "Bearer not-a-token-at-all")],
    "none": [],
}
# Entity types the entity calls use, and the ones workers host: no entity ever needs one of
# the fuzz's workers, so a worker session writes nothing (no lease is granted).
TYPES = ["agent"] * 6 + ["other"] * 3 + ["", "a b", "x" * 129, "é"]
WORKER_TYPES = ["wk", "wk2", "", "a/b"]

# -- strategies ---------------------------------------------------------------------------------

# Mostly names that exist or may (a1, o1, dead, short new ones), sometimes names at or past the limits.
names = st.one_of(
    st.sampled_from(["a1", "a1", "o1", "dead", "new"]),
    st.text("abc", min_size=1, max_size=3),
    st.sampled_from(["x" * 128, "x" * 129, "", "a/b", "a b", "é", ".", "-"]),
)
KNOWN = [("agent", "a1"), ("other", "o1"), ("agent", "dead"), ("agent", "new")]
refs = st.one_of(
    st.sampled_from(KNOWN).map(lambda r: pb.EntityRef(type=r[0], id=r[1])),
    st.builds(pb.EntityRef, type=st.sampled_from(TYPES), id=names),
)
enums = st.one_of(
    st.integers(1, 7), st.integers(1, 7), st.integers(-2, 9), st.sampled_from([2**31 - 1, -(2**31)])
)
uint32 = st.one_of(
    st.integers(0, 20), st.sampled_from([0, 1, 100, 1000, 1001, 2**32 - 1]), st.integers(0, 2**32 - 1)
)
uint64 = st.one_of(
    st.integers(0, 5), st.sampled_from([0, 1, 2**63 - 1, 2**63, 2**64 - 1]), st.integers(0, 2**64 - 1)
)
# A watch from past the head stays open and quiet: mostly offsets that answer at once.
watch_offsets = st.sampled_from([0, 1, 2**63 - 1, 2**63, 2**64 - 1]) | st.integers(2**63, 2**64 - 1)
keys = st.sampled_from(["", "", "", "", "k1", "k2", "a b", "k" * 128, "k" * 129, "é"])
sized_text = st.one_of(
    st.text(max_size=20),
    st.text(max_size=20),
    st.sampled_from([0, 1, 1024, 1025, 65536, 65537]).map(lambda n: "r" * n),
)
durations = st.builds(
    duration_pb2.Duration,
    seconds=st.sampled_from([-1, 0, 1, 86_400, 86_401, 2**63 - 1, -(2**63)]) | st.integers(-10, 100_000),
    nanos=st.sampled_from([0, 1, 1_000_000, 999_999_999, -1, 2**31 - 1, -(2**31)]),
)


def _value(**kind: Any) -> struct_pb2.Value:
    return struct_pb2.Value(**kind)


def _list(items: list[struct_pb2.Value]) -> struct_pb2.Value:
    value = struct_pb2.Value()
    value.list_value.values.extend(items)
    return value


def _object(items: dict[str, struct_pb2.Value]) -> struct_pb2.Value:
    value = struct_pb2.Value()
    for key, item in items.items():
        value.struct_value.fields[key].CopyFrom(item)
    return value


def _nested(depth: int) -> struct_pb2.Value:
    value = _value(number_value=1)
    for _ in range(depth):
        value = _list([value])
    return value


json_leaves = st.one_of(
    st.just(_value(null_value=0)),
    st.integers(-(2**53), 2**53).map(lambda n: _value(number_value=n)),
    st.floats().map(lambda f: _value(number_value=f)),  # NaN and infinities included: not JSON
    st.text(max_size=10).map(lambda s: _value(string_value=s)),
    st.booleans().map(lambda b: _value(bool_value=b)),
    st.just(struct_pb2.Value()),  # no kind set: not JSON
)
small_json = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=3).map(_list)
        | st.dictionaries(st.text(max_size=4), children, max_size=3).map(_object)
    ),
    max_leaves=8,
)
json_values = st.one_of(
    small_json,
    small_json,  # twice: mostly small values
    st.integers(28, 48).map(_nested),  # around the 32-level limit, and past it
    st.sampled_from([65_534, 65_535]).map(lambda n: _value(string_value="v" * n)),  # at 64 KiB, and past it
)


def _build(cls: type[Message], **fields: Any) -> Message:
    """A message from the fields drawn; None leaves a field unset."""
    return cls(**{k: v for k, v in fields.items() if v is not None})


def message(cls: type[Message], **fields: Any) -> st.SearchStrategy[Message]:
    return st.builds(lambda **kw: _build(cls, **kw), **fields)


optional = st.none
profiles = message(pb.Profile, grace_period=optional() | durations, idle_timeout=optional() | durations)
ENTITY_REQUESTS: dict[str, st.SearchStrategy[Message]] = {
    "SpawnEntity": message(
        api.SpawnEntityRequest, ref=refs, profile=optional() | profiles, idempotency_key=keys
    ),
    "GetEntity": message(api.GetEntityRequest, ref=refs),
    "ListEntities": message(
        api.ListEntitiesRequest,
        type=st.sampled_from(TYPES),
        states=st.lists(enums, max_size=3),
        page_size=uint32,
        page_token=st.sampled_from(["", "agent/a1", "garbage", "a/b/c", "é/x"]),
    ),
    "SignalEntity": message(
        api.SignalEntityRequest,
        ref=refs,
        signal=enums,
        reason=sized_text,
        payload=optional() | json_values,
        idempotency_key=keys,
        message_key=st.sampled_from(["", "m1", "a b"]),
    ),
    "SignalEntities": message(
        api.SignalEntitiesRequest,
        selector=st.one_of(
            st.builds(api.EntitySelector, type=st.sampled_from(TYPES)),
            st.builds(api.EntitySelector, refs=st.lists(refs, min_size=1, max_size=3)),
            st.builds(api.EntitySelector, states=st.lists(enums, min_size=1, max_size=2)),
            message(
                api.EntitySelector,
                type=st.sampled_from(TYPES),
                states=st.lists(enums, max_size=2),
                refs=st.lists(refs, max_size=3),
            ),
        ),
        signal=enums,
        reason=sized_text,
        payload=optional() | json_values,
        idempotency_key=keys,
    ),
    "SendMessage": message(
        api.SendMessageRequest, ref=refs, text=sized_text, data=optional() | json_values, idempotency_key=keys
    ),
    "DeleteEntity": message(api.DeleteEntityRequest, ref=refs, idempotency_key=keys),
    "ReadEvents": message(api.ReadEventsRequest, ref=refs, from_offset=uint64, limit=uint32),
    "WatchEvents": message(api.WatchEventsRequest, ref=refs, from_offset=watch_offsets),
    "WatchEntities": message(
        api.WatchEntitiesRequest,
        type=st.sampled_from(TYPES),
        states=st.lists(enums, max_size=2),
        accepts_batches=st.booleans(),
    ),
}

hosted = message(rt.HostedType, type=st.sampled_from(WORKER_TYPES), profile=optional() | profiles)
hellos = message(
    rt.Hello,
    worker_id=names,
    types=st.lists(hosted, max_size=3),
    code_version=st.text(max_size=5),
    capacity=uint32,
    accepts_batches=st.booleans(),
)
leases = message(rt.Lease, ref=refs, epoch=uint64)
operations = st.one_of(
    st.builds(dict, transition=message(rt.Transition, to=enums, cause=st.sampled_from(["", "started", "x"]))),
    st.builds(
        dict,
        run=message(
            pb.RunValue,
            message_key=st.sampled_from(["", "m1"]),
            status=enums,
            attempt=uint32,
            message_offset=uint64,
        ),
    ),
    st.builds(
        dict, signal_outcome=message(rt.SignalOutcomeUpdate, signal_key=names, outcome=enums, signal=enums)
    ),
    st.builds(
        dict, custom=message(rt.CustomEvent, type=st.sampled_from(["", "note", "state"]), data=json_values)
    ),
    st.builds(
        dict, output=message(pb.ExecOutput, task_id=names, generation=uint64, text=st.text(max_size=5))
    ),
    st.builds(dict),
)
writes = st.builds(
    lambda op, **kw: rt.RuntimeWrite(**kw, **op),
    operations,
    request_id=uint64,
    ref=refs,
    epoch=uint64,
    expect_state=enums,
    release=st.booleans(),
)
simple_frames = st.one_of(
    hellos.map(lambda h: rt.ConnectRequest(hello=h)),
    message(rt.Heartbeat, leases=st.lists(leases, max_size=2)).map(lambda h: rt.ConnectRequest(heartbeat=h)),
    message(rt.Ack, ref=refs, epoch=uint64, offset=uint64).map(lambda a: rt.ConnectRequest(ack=a)),
    writes.map(lambda w: rt.ConnectRequest(write=w)),
    message(rt.Release, ref=refs, epoch=uint64).map(lambda r: rt.ConnectRequest(release=r)),
    st.just(rt.ConnectRequest(drain=rt.Drain())),
)
frames = simple_frames | st.lists(simple_frames, max_size=3).map(
    lambda items: rt.ConnectRequest(batch=rt.RequestBatch(requests=items))
)
sessions = st.tuples(st.booleans() | st.just(True), st.lists(frames, max_size=4)).map(
    lambda t: (
        (
            [rt.ConnectRequest(hello=rt.Hello(worker_id="w1", types=[rt.HostedType(type="wk")]))]
            if t[0]
            else []
        )
        + t[1]
    )
)


def mangle(body: bytes, data: st.DataObject) -> bytes:
    """A structured body cut short, with a byte flipped, or with garbage after it."""
    how = data.draw(st.sampled_from(["cut", "flip", "append"]))
    if how == "cut" and body:
        return body[: data.draw(st.integers(0, len(body) - 1))]
    if how == "flip" and body:
        at = data.draw(st.integers(0, len(body) - 1))
        return body[:at] + bytes([body[at] ^ data.draw(st.integers(1, 255))]) + body[at + 1 :]
    return body + data.draw(st.binary(min_size=1, max_size=8))


@dataclass
class Case:
    method: str  # an EntityService method's name, or "Connect"
    bodies: list[bytes]  # the request (a unary call), or the runtime stream's frames
    who: str  # whose metadata (METADATA)


@st.composite
def cases(draw: st.DrawFn, who: list[str]) -> Case:
    method = draw(st.sampled_from([*sorted(UNARY), *sorted(STREAMS), "Connect", "Connect"]))
    kind = draw(st.sampled_from(["structured"] * 8 + ["mangled", "random"]))
    if method == "Connect":
        bodies = [f.SerializeToString() for f in draw(sessions)]
    else:
        bodies = [draw(ENTITY_REQUESTS[method]).SerializeToString()]
    if kind == "mangled":
        data = draw(st.data())
        at = draw(st.integers(0, max(0, len(bodies) - 1)))
        bodies[at:] = [mangle(bodies[at] if bodies else b"", data)]
    elif kind == "random":
        bodies = draw(st.lists(st.binary(max_size=40), min_size=1, max_size=3))
        if method != "Connect":
            bodies = bodies[:1]
    return Case(method, bodies, draw(st.sampled_from(who)))


# -- the harness --------------------------------------------------------------------------------


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _reaped(body: bytes) -> bool:
    event = pb.Event.FromString(body)
    return event.WhichOneof("value") == "state" and event.state.cause == "grace_expired"


class Harness:
    def __init__(self, server: TestServer, mode: str) -> None:
        self.mode = mode
        self.channel = grpc.insecure_channel(server.address)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.db = sqlite3.connect(f"file:{server.data_dir / 'electric.db'}?mode=ro", uri=True)
        self.tally: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self.calls = 0
        self.log = Records()
        self.seen = 0  # log records already judged
        self.started = time.monotonic()
        self.checking = TALLY is None

    def __enter__(self) -> Harness:
        logging.getLogger().addHandler(self.log)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger().removeHandler(self.log)
        self.channel.close()
        self.db.close()

    # -- what the server holds --------------------------------------------------------------

    def snapshot(self) -> tuple[int, int, int, int]:
        row = self.db.execute(
            "SELECT (SELECT COUNT(*) FROM entities), (SELECT COUNT(*) FROM events),"
            " (SELECT COALESCE(MAX(txid), 0) FROM events), (SELECT COUNT(*) FROM idempotency)"
        ).fetchone()
        return tuple(row)  # type: ignore[return-value]

    def wrote_since(self, before: tuple[int, int, int, int]) -> list[str]:
        """What was written since ``before`` that is not the reaper's."""
        after = self.snapshot()
        if after == before:
            return []
        changes = [f"{before} -> {after}"] if (after[0], after[3]) != (before[0], before[3]) else []
        new = self.db.execute("SELECT type, id, offset, kind, body FROM events WHERE txid > ?", (before[2],))
        changes += [f"{t}/{i}@{o} {k}" for t, i, o, k, body in new if not _reaped(body)]
        return changes

    # -- a call ----------------------------------------------------------------------------------

    def invoke(self, case: Case) -> tuple[grpc.StatusCode, Any]:
        """The call's status (OK for a stream the client ended itself) and the error, if any."""
        metadata = METADATA[case.who]
        try:
            if case.method in UNARY:
                self.channel.unary_unary(ENTITY + case.method)(case.bodies[0], metadata=metadata, timeout=10)
            elif case.method in STREAMS:
                call = self.channel.unary_stream(ENTITY + case.method)(
                    case.bodies[0], metadata=metadata, timeout=WATCH_WAIT_S
                )
                try:
                    next(call)  # open and answering: the first item is enough
                except StopIteration:
                    pass
                except grpc.RpcError:
                    # Our own deadline (a quiet watch) or hang-up is no answer of the server's.
                    if call.code() in QUIET and not error_reason(call):
                        return grpc.StatusCode.OK, None
                    raise
                finally:
                    call.cancel()
            else:
                call = self.channel.stream_stream(CONNECT)(iter(case.bodies), metadata=metadata, timeout=10)
                for _ in call:
                    pass
        except grpc.RpcError as error:
            return error.code(), error  # type: ignore[attr-defined]
        return grpc.StatusCode.OK, None

    def check(self, case: Case) -> None:
        before = self.snapshot()
        code, error = self.invoke(case)
        self.calls += 1
        self.tally[code.name] += 1
        reason = "" if error is None else error_reason(error)
        self.reasons[f"{case.method} {code.name} {reason}".rstrip()] += 1
        if not self.checking:
            return
        assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), (case, error.details())
        if error is not None:
            assert reason, f"{code.name} without our ErrorInfo: {error.details()} for {case}"
            assert not self.wrote_since(before), (case, reason, self.wrote_since(before))
        self.check_log()
        if self.calls % HEALTH_EVERY == 0:
            self.check_serving()

    def check_serving(self) -> None:
        for service in ("", "electric.v1.EntityService", "electric.v1.RuntimeService"):
            reply = self.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING

    def check_log(self) -> None:
        fresh, self.seen = self.log.records[self.seen :], len(self.log.records)
        for record in fresh:
            text = record.getMessage()
            assert not record.exc_info, f"a traceback in the log: {text}"
            if record.levelno >= logging.WARNING:
                assert record.levelno == logging.WARNING, text
                # A refusal, or the note (once per type) that no connected worker hosts a type.
                assert text.startswith("refused ") or record.name == "electric_server.core.presence", text
        refusals = Counter(str(r.args[3]) for r in self.log.records if r.getMessage().startswith("refused "))  # type: ignore[index]
        allowed = math.floor((time.monotonic() - self.started) / REFUSAL_INTERVAL_S) + 1
        assert all(n <= allowed for n in refusals.values()), (refusals, allowed)

    def report(self) -> None:
        elapsed = time.monotonic() - self.started
        tracebacks = sum(1 for r in self.log.records if r.exc_info)
        lines = sum(1 for r in self.log.records if r.levelno >= logging.WARNING)
        line = (
            f"fuzz ({self.mode}): {self.calls} calls in {elapsed:.1f}s: {dict(sorted(self.tally.items()))}; "
            f"log: {lines} lines at WARNING or above, {tracebacks} tracebacks"
        )
        print(line)
        for what, n in sorted(self.reasons.items()):
            print(f"  {n:5} {what}")
        if TALLY is not None:
            with Path(TALLY).open("a") as out:
                record = {"mode": self.mode, "calls": self.calls, "codes": self.tally, "log_lines": lines}
                out.write(json.dumps({**record, "tracebacks": tracebacks}) + "\n")


def error_reason(error: Any) -> str:
    """The reason of our ErrorInfo in a failed call's status; "" when it has none."""
    status = rpc_status.from_call(error)
    for detail in status.details if status is not None else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info) and info.domain == "electric.v1":
            return str(info.reason)
    return ""


@pytest.fixture
def fuzzed(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Harness]:
    mode: str = request.param
    config: dict[str, Any] = {}
    if mode == "tokens":
        tokens = tmp_path / "tokens.toml"
        tokens.write_text(
            "".join(
                f'[[tokens]]\ntoken = "{token}"\nprincipal = "{name}"\nscopes = {scopes}\n'
                + (f"types = {types}\n" if types else "")
                for token, name, scopes, types in TOKENS.values()
            )
        )
        tokens.chmod(0o600)
        config["tokens_file"] = tokens
    with TestServer(tmp_path / "data", **config) as server, Harness(server, mode) as harness:
        admin = server.client(token=TOKENS["admin"][0]) if mode == "tokens" else server.client()
        for ref in ("agent/a1", "other/o1", "agent/dead"):
            admin.spawn(ref)
        admin.kill("agent/dead")
        yield harness
        harness.check_serving()
        harness.report()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("fuzzed", ["open", "tokens"], indirect=True)
def test_fuzz_every_call(fuzzed: Harness) -> None:
    who = (
        ["none"] if fuzzed.mode == "open" else ["admin", "admin", "admin", "typed", "reader", "wrong", "none"]
    )

    @settings(
        max_examples=EXAMPLES[fuzzed.mode],
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
    @given(case=cases(who))
    def call(case: Case) -> None:
        fuzzed.check(case)

    call()
    assert fuzzed.calls >= EXAMPLES[fuzzed.mode]
