"""Failover (issue 47): the replica holding a worker's session dies, the run goes on through another.

Real `electric server` replicas on one PostgreSQL database (test_replicas.py's fixture: polls of
20 ms, sessions living 1 s past their last renewal, unless a test says otherwise) and a worker
given every replica's address. The worker notices the dead replica by its stream's own error
(kill -9 resets its connections) or by keepalive (a replica frozen with SIGSTOP answers nothing);
its hello on another replica ends the old session there, and that session's leases, before the
welcome; the run is delivered again and replays what it recorded.
"""

from __future__ import annotations

import grpc
import pytest
from test_replicas import StartReplica, anyio_backend, closed, one_loop, replica, stub  # noqa: F401
from test_runtime_protocol import RawWorker, running

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import types_pb2 as pb

pytestmark = pytest.mark.anyio


async def test_the_hello_ends_the_old_sessions_leases_before_its_welcome(replica: StartReplica) -> None:  # noqa: F811
    """Worker w holds a running entity through A; its hello on B ends that lease before B welcomes
    it (the polls are 500 ms and sessions live 60 s: neither could have), and A, alive, can no
    longer write under the old epoch."""
    slow = ("--poll", "500ms", "--lease-ttl", "60s")
    a, b = replica(*slow), replica(*slow)
    async with grpc.aio.insecure_channel(a.address) as to_a, grpc.aio.insecure_channel(b.address) as to_b:
        old = RawWorker(to_a, "w-hello", ["agent"])
        ref, lease = await running(stub(to_a), old, "hello")
        new = RawWorker(to_b, "w-hello", ["agent"])
        await new.next("welcome")
        entity = (await stub(to_b).GetEntity(api.GetEntityRequest(ref=ref))).entity
        assert entity.state == pb.STATE_IDLE  # its lease ended as lost: running → idle
        stale = await old.write(ref, lease.epoch, pb.STATE_IDLE, custom=rt.CustomEvent(type="step"))
        assert not stale.applied
        await stub(to_b).SendMessage(api.SendMessageRequest(ref=ref, text="wake"))
        granted = (await new.next("lease_granted")).lease
        assert granted.epoch > lease.epoch
        await closed(old)
        await closed(new)
