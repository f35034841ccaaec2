"""The smallest end-to-end check: spawn, signal, read back over real gRPC."""

from __future__ import annotations

import pytest

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb

pytestmark = pytest.mark.anyio


async def test_spawn_kill_read(stub: api_grpc.EntityServiceStub) -> None:
    ref = pb.EntityRef(type="agent", id="a1")
    await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref))
    result = await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGKILL))
    assert (result.previous_state, result.new_state) == (pb.STATE_SPAWNING, pb.STATE_KILLED)
    page = await stub.ReadEvents(api.ReadEventsRequest(ref=ref))
    assert [e.type for e in page.events] == ["state", "signal", "state"]
    assert page.end_of_stream
