"""The gRPC door answers a signal at a stage itself (issue 48, "Staged receipts"):
``SignalEntityRequest.wait`` and ``timeout``, ``SignalEntityResponse.stages``, so any generated
client gets the receipt in one call, and the SDK's own fold is the continuation, not the rule.

A real server on either store, a worker on the test's loop, the generated stub beside the SDK.
"""

from __future__ import annotations

import anyio
import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from helpers import error_info

from electric_sdk import AsyncClient
from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.lifecycle import Signal, Stage, stages_of
from electric_sdk.testing import TestServer

from .rt_support import running_worker, until
from .test_stop_stages import _app, _in_step

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]

# How long a "slow" SIGUSR's handler takes (test_stop_stages' app): more than the calls below.
SLOW_S = 1.5


def _ref(name: str) -> pb.EntityRef:
    type_, id_ = name.split("/")
    return pb.EntityRef(type=type_, id=id_)


def _stages(response: api.SignalEntityResponse) -> dict[str, api.StageReport]:
    return {s.stage: s for s in response.stages}


async def test_the_generated_stub_gets_the_receipt_in_one_call(
    electric: TestServer, client: AsyncClient
) -> None:
    async with running_worker(_app(), electric.address), grpc.aio.insecure_channel(electric.address) as ch:
        key = await _in_step(client, "agent/g1")
        stub = api_grpc.EntityServiceStub(ch)
        request = api.SignalEntityRequest(
            ref=_ref("agent/g1"),
            signal=pb.SIGNAL_SIGINT,
            idempotency_key="g1-int",
            wait="unwound",
            timeout=Duration(seconds=30),
        )
        response = await stub.SignalEntity(request, timeout=60)
        stages = _stages(response)
        assert list(stages) == [s.value for s in stages_of(Signal.SIGINT)]
        assert all(s.reached for s in stages.values()), response.stages
        assert stages["accepted"].offset == response.offset
        events = (await client.events("agent/g1", 0, 1000)).events
        (ended,) = [
            e
            for e in events
            if e.type == "run" and e.value["message_key"] == key and e.value["status"] == "aborted"
        ]
        assert stages["unwound"].offset == ended.offset  # the answer came with the run's own end
        assert stages["unwound"].at.ToMilliseconds() == round(ended.timestamp.timestamp() * 1000)
        # The same key again, with another bound (how to answer is not what was written): the
        # answer replayed, its stages read back from the stream.
        request.timeout.FromSeconds(20)
        again = await stub.SignalEntity(request, timeout=60)
        assert again.key == response.key
        assert [(s.stage, s.reached, s.offset) for s in again.stages] == [
            (s.stage, s.reached, s.offset) for s in response.stages
        ]
        later = (await client.events("agent/g1", 0, 1000)).events
        assert [e.offset for e in later if e.type == "signal" and e.operation == "insert"] == [
            response.offset
        ]


async def test_the_grpc_door_refuses_a_bad_wait_and_writes_nothing(
    electric: TestServer, client: AsyncClient
) -> None:
    await client.spawn("agent/bad")
    before = (await client.events("agent/bad")).head_offset
    async with grpc.aio.insecure_channel(electric.address) as ch:
        stub = api_grpc.EntityServiceStub(ch)
        for signal, wait, timeout, reason in (
            (pb.SIGNAL_SIGUSR, "unwound", None, "STAGE_NOT_AVAILABLE"),
            (pb.SIGNAL_SIGINT, "terminal", None, "STAGE_NOT_AVAILABLE"),
            (pb.SIGNAL_SIGTERM, "soon", None, "UNKNOWN_WAIT"),
            (pb.SIGNAL_SIGTERM, "", Duration(seconds=1), "USAGE"),
            (pb.SIGNAL_SIGTERM, "terminal", Duration(nanos=500), "INVALID_DURATION"),
            (pb.SIGNAL_SIGTERM, "terminal", Duration(seconds=-1), "INVALID_DURATION"),
        ):
            request = api.SignalEntityRequest(ref=_ref("agent/bad"), signal=signal, wait=wait)
            if timeout is not None:
                request.timeout.CopyFrom(timeout)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stub.SignalEntity(request, timeout=30)
            assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT, (wait, raised.value.details())
            assert error_info(raised.value).reason == reason, wait
    assert (await client.events("agent/bad")).head_offset == before
    assert (await client.get("agent/bad")).state.value != "stopping"


async def test_a_timeout_of_zero_answers_at_once_with_what_is_reached(
    electric: TestServer, client: AsyncClient
) -> None:
    """`timeout` 0 is "now", as a send's `wait=run` takes it: the answer comes once the signal is
    committed, each stage reached by then said so and the rest "not reached within 0s"; the SDK's
    `timeout=0` is that same bound."""
    async with running_worker(_app(), electric.address), grpc.aio.insecure_channel(electric.address) as ch:
        await _in_step(client, "agent/z1")
        stub = api_grpc.EntityServiceStub(ch)
        request = api.SignalEntityRequest(ref=_ref("agent/z1"), signal=pb.SIGNAL_SIGUSR, wait="handled")
        request.payload.string_value = "block"  # its handler never returns
        request.timeout.SetInParent()  # present, and 0
        stages = _stages(await stub.SignalEntity(request, timeout=30))
        assert stages["accepted"].reached
        assert not stages["handled"].reached
        assert stages["handled"].detail == "not reached within 0s"
        answer = await client.usr("agent/z1", "block", wait="handled", timeout=0)
        assert answer.reached("accepted")
        (report,) = [r for r in answer.stages if r.stage is Stage.HANDLED]
        assert report.detail == "not reached within 0s"
        await client.spawn("agent/z2")  # no run in progress: nothing left to unwind
        idle = await client.interrupt("agent/z2", wait="unwound", timeout=0)
        assert idle.reached("unwound"), idle.stages


async def test_a_wait_the_timeout_cuts_says_so(electric: TestServer, client: AsyncClient) -> None:
    async with running_worker(_app(), electric.address):
        await _in_step(client, "agent/t1")
        answer = await client.usr("agent/t1", "slow", wait="handled", timeout="100ms")
        assert not answer.reached("handled")
        (report,) = [r for r in answer.stages if r.stage is Stage.HANDLED]
        assert report.detail == "not reached within 100ms"
        assert answer.reached("accepted")


async def test_the_call_deadline_bounds_the_answer_and_the_sdk_waits_on(
    electric: TestServer, client: AsyncClient
) -> None:
    """No timeout: the server answers just before the call's deadline, saying so; the SDK then
    goes on from the signal's record by itself, so its answer still says `handled`."""
    async with (
        running_worker(_app(), electric.address),
        grpc.aio.insecure_channel(electric.address) as ch,
        AsyncClient(electric.address, timeout_s=0.5) as short,
    ):
        await _in_step(client, "agent/d1")
        stub = api_grpc.EntityServiceStub(ch)
        request = api.SignalEntityRequest(
            ref=_ref("agent/d1"), signal=pb.SIGNAL_SIGUSR, wait="handled", idempotency_key="d1-usr"
        )
        request.payload.string_value = "slow"
        response = await stub.SignalEntity(request, timeout=0.6)
        handled = _stages(response)["handled"]
        assert not handled.reached
        assert handled.detail.startswith("not reached within the call's deadline"), handled.detail
        await until(client, "agent/d1", lambda e: e.type == "handler")  # that one's handler ended
        started = anyio.current_time()
        answer = await short.usr("agent/d1", "slow", wait="handled")
        assert answer.reached("handled"), answer.stages
        assert anyio.current_time() - started >= SLOW_S  # past the 0.5 s call: the SDK waited on


async def test_a_signal_the_entity_ignores_is_answered_at_once(
    electric: TestServer, client: AsyncClient
) -> None:
    """A SIGUSR or SIGTERM to an entity still `spawning` (no worker hosts its type) is ignored by
    the table: its answer says what never comes of it at once, over gRPC and in the SDK's own
    fold alike, rather than waiting out a 30 s bound (or, with none, for ever)."""
    await client.spawn("unhosted/i1")
    usr = await client.usr("unhosted/i1", "x", wait="handled", timeout="30s")
    (handled,) = [r for r in usr.stages if r.stage is Stage.HANDLED]
    assert not handled.reached
    assert handled.detail == "not delivered: SIGUSR in spawning is ignored"
    term = await client.terminate("unhosted/i1", wait="terminal", timeout="30s")
    stages = {r.stage: r for r in term.stages}
    assert stages[Stage.REAPED].reached  # no process was running
    for stage in (Stage.UNWOUND, Stage.DOWNSTREAM, Stage.TERMINAL):
        assert not stages[stage].reached
        assert stages[stage].detail == "SIGTERM in spawning is ignored", stages[stage]
    # The SDK's own fold (its continuation past a call's deadline) settles it the same way.
    accepted = await client.usr("unhosted/i1", "y")
    again = await client.wait_signal(accepted, "handled", 30)
    assert [r.detail for r in again.stages if r.stage is Stage.HANDLED] == [handled.detail]
    async with grpc.aio.insecure_channel(electric.address) as ch:
        request = api.SignalEntityRequest(ref=_ref("unhosted/i1"), signal=pb.SIGNAL_SIGTERM, wait="terminal")
        response = await api_grpc.EntityServiceStub(ch).SignalEntity(request, timeout=30)
    assert _stages(response)["terminal"].detail == "SIGTERM in spawning is ignored"
    assert (await client.get("unhosted/i1")).state.value == "spawning"
