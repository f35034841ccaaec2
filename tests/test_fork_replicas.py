"""Fork and retry across three `electric server` replicas on one PostgreSQL database (real
processes): each call through one replica, each read through another. Everything a fork or a
retry reads or writes is in the database, so no replica needs to have seen the others' commits.
"""

from __future__ import annotations

import anyio
import grpc
import pytest
from helpers import error_info
from test_replicas import StartReplica, anyio_backend, closed, one_loop, read_all, replica, stub  # noqa: F401 - fixtures
from test_runtime_protocol import RawWorker

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import types_pb2 as pb

pytestmark = pytest.mark.anyio


def _kept(event: pb.Event) -> bytes:
    """What a fork keeps of a copied event: all but its headers (the fork's commit's own)."""
    kept = pb.Event()
    kept.CopyFrom(event)
    kept.ClearField("headers")
    return kept.SerializeToString(deterministic=True)


async def test_fork_and_retry_through_three_replicas(replica: StartReplica) -> None:  # noqa: F811 - the fixture
    a, b, c = replica(), replica(), replica()
    async with (
        grpc.aio.insecure_channel(a.address) as to_a,
        grpc.aio.insecure_channel(b.address) as to_b,
        grpc.aio.insecure_channel(c.address) as to_c,
    ):
        via_a, via_b, via_c = stub(to_a), stub(to_b), stub(to_c)
        origin = pb.EntityRef(type="agent", id="origin")
        await via_a.SpawnEntity(api.SpawnEntityRequest(ref=origin))
        first = await via_b.SendMessage(api.SendMessageRequest(ref=origin, text="first"))
        await via_b.SendMessage(api.SendMessageRequest(ref=origin, text="second"))
        # Cancelled before its run started: its run is `aborted`, a run a retry may run again.
        await via_c.SignalEntity(
            api.SignalEntityRequest(ref=origin, signal=pb.SIGNAL_SIGINT, message_key=first.key)
        )
        events = await read_all(via_c, origin)
        at = len(events) - 1

        # Forked through A at an offset, read through B: the origin's events, then its own.
        forked = await via_a.ForkEntity(
            api.ForkEntityRequest(
                origin=origin, id="fork", offset=at, reason="replicas", idempotency_key="k1"
            )
        )
        assert forked.offset == at
        assert forked.entity.state == pb.STATE_IDLE
        fork_ref = pb.EntityRef(type="agent", id="fork")
        copied = await read_all(via_b, fork_ref)
        assert [_kept(e) for e in copied[:at]] == [_kept(e) for e in events[:at]]
        assert copied[at].type == "electric.fork"
        assert copied[at].custom.data.struct_value["origin"] == "/agent/origin"
        assert copied[-1].state.state == pb.STATE_IDLE

        # The same idempotency key through C answers the first fork, writing nothing.
        again = await via_c.ForkEntity(
            api.ForkEntityRequest(
                origin=origin, id="fork", offset=at, reason="replicas", idempotency_key="k1"
            )
        )
        assert again == forked
        assert len(await read_all(via_a, fork_ref)) == len(copied)

        # Two forks to one new id through two replicas at once: exactly one is made.
        outcomes: list[object] = []

        async def fork_via(entities: object, reason: str) -> None:
            try:
                made = await entities.ForkEntity(  # type: ignore[attr-defined]
                    api.ForkEntityRequest(origin=origin, id="race", reason=reason)
                )
                outcomes.append(made.entity.ref.id)
            except grpc.aio.AioRpcError as exc:
                outcomes.append(error_info(exc).reason)

        async with anyio.create_task_group() as tg:
            tg.start_soon(fork_via, via_a, "a")
            tg.start_soon(fork_via, via_b, "b")
        assert sorted(map(str, outcomes)) == ["ENTITY_EXISTS", "race"]

        # Bad offsets through C: refused with their reason, nothing made.
        head = (await via_a.GetEntity(api.GetEntityRequest(ref=origin))).entity.head_offset
        for bad, code in ((-1, grpc.StatusCode.INVALID_ARGUMENT), (head + 1, grpc.StatusCode.OUT_OF_RANGE)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await via_c.ForkEntity(api.ForkEntityRequest(origin=origin, id="bad", offset=bad))
            assert refused.value.code() == code
            assert error_info(refused.value).reason == "INVALID_OFFSET"
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await via_a.GetEntity(api.GetEntityRequest(ref=pb.EntityRef(type="agent", id="bad")))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND

        # A retry through B of the run cancelled through C, read through A.
        retried = await via_b.RetryRun(api.RetryRunRequest(ref=origin, run=first.key, reason="again"))
        message = (await read_all(via_a, origin))[retried.offset]
        assert message.message.text == "first"
        assert message.message.retry.message_key == first.key
        assert message.message.retry.reason == "again"
        with pytest.raises(grpc.aio.AioRpcError) as beyond:
            await via_c.RetryRun(api.RetryRunRequest(ref=origin, run=first.key, from_step=1))
        assert error_info(beyond.value).reason == "INVALID_STEP"


async def test_a_fork_settles_the_signals_its_origin_had_pending(replica: StartReplica) -> None:  # noqa: F811
    """A SIGUSR a worker on A has not reported on yet is `pending` in the origin's stream; the fork,
    made through B, settles its copy `ignored` in its own commit, so no lease of the fork gets it."""
    a, b = replica(), replica()
    async with grpc.aio.insecure_channel(a.address) as to_a, grpc.aio.insecure_channel(b.address) as to_b:
        worker = RawWorker(to_a, "w-origin", ["agent"])
        await worker.next("welcome")
        origin = pb.EntityRef(type="agent", id="busy")
        await stub(to_a).SpawnEntity(api.SpawnEntityRequest(ref=origin))
        lease = (await worker.next("lease_granted")).lease
        started = rt.Transition(to=pb.STATE_RUNNING, cause="started")
        assert (await worker.write(origin, lease.epoch, pb.STATE_SPAWNING, transition=started)).applied
        usr = await stub(to_a).SignalEntity(api.SignalEntityRequest(ref=origin, signal=pb.SIGNAL_SIGUSR))
        assert usr.outcome == pb.SIGNAL_OUTCOME_PENDING

        forked = await stub(to_b).ForkEntity(api.ForkEntityRequest(origin=origin, id="busy-fork"))
        events = await read_all(stub(to_a), pb.EntityRef(type="agent", id="busy-fork"))
        own = events[forked.offset :]
        assert [e.type for e in own] == ["electric.fork", "signal", "state"]
        assert own[1].key == usr.key
        assert own[1].headers.operation == pb.OPERATION_UPDATE
        assert own[1].signal.outcome == pb.SIGNAL_OUTCOME_IGNORED
        assert own[1].signal.detail.startswith("copied by the fork of /agent/busy")
        # The origin's own signal is still its runtime's to report on.
        origin_events = await read_all(stub(to_b), origin)
        assert [e.signal.outcome for e in origin_events if e.key == usr.key] == [pb.SIGNAL_OUTCOME_PENDING]
        await closed(worker)
