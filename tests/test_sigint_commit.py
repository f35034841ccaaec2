"""A SIGINT that aborts the run in progress in its own commit, driven by a hand-written worker.

A Python host's run is started with ``server_may_abort``: while it is in progress under a live
lease, the server judges a SIGINT itself, and the SIGINT's commit says the run ended (the
signal inserted `pending` and updated `aborted`, the message done). The runtime then cancels
the run and records it ABORTED with its partial output. Every path a user can reach: the
runtime's own record, a run end already on its way, a runtime lost before recording, a scoped
SIGINT, and a run started without the flag (an exec host, an older worker), which the runtime
still judges.
"""

from __future__ import annotations

import grpc
import pytest
from electric_server.app import ElectricServer
from test_runtime_protocol import RawWorker, events, running

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import types_pb2 as pb

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]


@pytest.fixture
async def server(start_server: object) -> ElectricServer:
    return await start_server(lease_ttl_ms=400, heartbeat_interval_ms=50)  # type: ignore[operator, no-any-return]


async def started_run(
    stub: api_grpc.EntityServiceStub, worker: RawWorker, id_: str, *, flag: bool = True
) -> tuple[pb.EntityRef, rt.Lease, api.SendMessageResponse]:
    """agent/ID running on ``worker``, with a message whose run has started."""
    ref, lease = await running(stub, worker, id_)
    sent = await stub.SendMessage(api.SendMessageRequest(ref=ref, text="work"))
    assert (await worker.next("delivery")).event.key == sent.key
    run = pb.RunValue(
        message_key=sent.key, message_offset=sent.offset, status=pb.RUN_STATUS_STARTED, attempt=1
    )
    result = await worker.write(ref, lease.epoch, pb.STATE_RUNNING, run=run, server_may_abort=flag)
    assert result.applied, result
    return ref, lease, sent


def runs_of(log: list[pb.Event], key: str) -> list[pb.RunValue]:
    return [e.run for e in log if e.type == "run" and e.run.message_key == key]


async def test_the_sigints_commit_says_the_run_ended_and_the_runtime_adds_its_output(
    server: ElectricServer,
) -> None:
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w1", ["agent"])
        ref, lease, sent = await started_run(stub, worker, "a1")
        sig = await stub.SignalEntity(
            api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGINT, reason="stop")
        )
        assert sig.outcome == pb.SIGNAL_OUTCOME_ABORTED  # the answer says so: committed

        log = await events(stub, ref)
        insert, update = (e for e in log if e.key == sig.key)
        assert (insert.headers.operation, insert.signal.outcome) == (
            pb.OPERATION_INSERT,
            pb.SIGNAL_OUTCOME_PENDING,
        )
        assert (update.headers.operation, update.signal.outcome) == (
            pb.OPERATION_UPDATE,
            pb.SIGNAL_OUTCOME_ABORTED,
        )
        assert update.headers.txid == insert.headers.txid == sig.txid  # one commit
        assert update.signal.reason == "stop"
        assert update.signal.detail == f"aborted the run of {sent.key}"
        # The message is done: a second run of it is refused.
        again = pb.RunValue(
            message_key=sent.key, message_offset=sent.offset, status=pb.RUN_STATUS_STARTED, attempt=2
        )
        # The runtime hears the outcome, not a `pending` signal it would owe a report on.
        delivered = (await worker.next("delivery")).event
        assert (delivered.key, delivered.signal.outcome) == (sig.key, pb.SIGNAL_OUTCOME_ABORTED)
        refused = await worker.write(ref, lease.epoch, pb.STATE_RUNNING, run=again)
        assert (refused.applied, refused.reason) == (False, "MESSAGE_DONE")
        # Its record of the run, with the partial output, is the run's one end.
        ended = pb.RunValue(
            message_key=sent.key,
            message_offset=sent.offset,
            status=pb.RUN_STATUS_ABORTED,
            attempt=1,
            output="partial",
            error="SIGINT",
        )
        assert (await worker.write(ref, lease.epoch, pb.STATE_RUNNING, run=ended)).applied
        ends = [r for r in runs_of(await events(stub, ref), sent.key) if r.status != pb.RUN_STATUS_STARTED]
        assert [(r.status, r.output) for r in ends] == [(pb.RUN_STATUS_ABORTED, "partial")]
        worker.close()


async def test_a_run_end_already_on_its_way_is_recorded_aborted(server: ElectricServer) -> None:
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w1", ["agent"])
        ref, lease, sent = await started_run(stub, worker, "a2")
        await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGINT))
        # The worker's run had completed as the SIGINT committed: the SIGINT came first.
        done = pb.RunValue(
            message_key=sent.key,
            message_offset=sent.offset,
            status=pb.RUN_STATUS_COMPLETED,
            output="all of it",
        )
        assert (await worker.write(ref, lease.epoch, pb.STATE_RUNNING, run=done)).applied
        (end,) = [r for r in runs_of(await events(stub, ref), sent.key) if r.status != pb.RUN_STATUS_STARTED]
        assert (end.status, end.output) == (pb.RUN_STATUS_ABORTED, "all of it")
        assert "completed" in end.error
        # The next run starts and ends as usual.
        nxt = await stub.SendMessage(api.SendMessageRequest(ref=ref, text="next"))
        for status in (pb.RUN_STATUS_STARTED, pb.RUN_STATUS_COMPLETED):
            value = pb.RunValue(message_key=nxt.key, message_offset=nxt.offset, status=status, attempt=1)
            assert (await worker.write(ref, lease.epoch, pb.STATE_RUNNING, run=value)).applied
        assert runs_of(await events(stub, ref), nxt.key)[-1].status == pb.RUN_STATUS_COMPLETED
        worker.close()


async def test_a_runtime_lost_before_recording_leaves_the_run_ended_and_not_redelivered(
    server: ElectricServer,
) -> None:
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        first = RawWorker(channel, "w-first", ["agent"])
        ref, lease, sent = await started_run(stub, first, "a3")
        await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGINT))
        later = await stub.SendMessage(api.SendMessageRequest(ref=ref, text="later"))
        first.close()  # dies before it records the aborted run

        second = RawWorker(channel, "w-second", ["agent"])
        granted = await second.next("lease_granted")
        assert granted.lease.epoch > lease.epoch
        # The aborted message is done: only the later one comes again.
        redelivered = await second.next("delivery")
        assert (redelivered.event.type, redelivered.event.key) == ("message", later.key)
        (end,) = [r for r in runs_of(await events(stub, ref), sent.key) if r.status != pb.RUN_STATUS_STARTED]
        assert end.status == pb.RUN_STATUS_ABORTED
        assert "no partial output" in end.error
        second.close()


async def test_a_scoped_sigint_to_the_run_in_progress_aborts_it_in_its_commit(server: ElectricServer) -> None:
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w1", ["agent"])
        ref, _, sent = await started_run(stub, worker, "a4")
        queued = await stub.SendMessage(api.SendMessageRequest(ref=ref, text="queued"))
        other = await stub.SignalEntity(
            api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGINT, message_key=queued.key)
        )
        assert other.outcome == pb.SIGNAL_OUTCOME_ABORTED  # not started: cancelled, as before
        sig = await stub.SignalEntity(
            api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGINT, message_key=sent.key)
        )
        assert sig.outcome == pb.SIGNAL_OUTCOME_ABORTED
        update = [e for e in await events(stub, ref) if e.key == sig.key][-1]
        assert (update.headers.operation, update.signal.message_key) == (pb.OPERATION_UPDATE, sent.key)
        worker.close()


async def test_a_run_started_without_the_flag_leaves_the_sigint_to_the_runtime(
    server: ElectricServer,
) -> None:
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w1", ["agent"])
        ref, lease, sent = await started_run(stub, worker, "a5", flag=False)
        sig = await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGINT))
        assert sig.outcome == pb.SIGNAL_OUTCOME_PENDING
        assert [e.headers.operation for e in await events(stub, ref) if e.key == sig.key] == [
            pb.OPERATION_INSERT
        ]
        delivered = (await worker.next("delivery")).event
        assert (delivered.key, delivered.signal.outcome) == (sig.key, pb.SIGNAL_OUTCOME_PENDING)
        report = rt.SignalOutcomeUpdate(
            signal_key=sig.key, signal=pb.SIGNAL_SIGINT, outcome=pb.SIGNAL_OUTCOME_ABORTED
        )
        assert (await worker.write(ref, lease.epoch, pb.STATE_RUNNING, signal_outcome=report)).applied
        ended = pb.RunValue(message_key=sent.key, message_offset=sent.offset, status=pb.RUN_STATUS_ABORTED)
        assert (await worker.write(ref, lease.epoch, pb.STATE_RUNNING, run=ended)).applied
        worker.close()


async def test_a_paused_entitys_run_is_the_servers_to_abort_only_while_its_runtime_lives(
    server: ElectricServer,
) -> None:
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        first = RawWorker(channel, "w-first", ["agent"])
        ref, _, _ = await started_run(stub, first, "a6")
        await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGSTOP))
        first.close()  # paused with its run in progress, then its runtime dies
        # The same worker's hello ends its old session, and the lease with it, at once.
        second = RawWorker(channel, "w-first", ["agent"])
        await second.next("welcome")
        sig = await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGINT))
        assert sig.outcome == pb.SIGNAL_OUTCOME_PENDING  # the new runtime judges: no run of its own
        second.close()


async def test_a_run_lost_with_a_restart_is_not_the_servers_to_abort(start_server: object) -> None:
    """The server stops mid-run (on SQLite its sessions, in memory, go with it; on PostgreSQL the
    worker's session expires). The run is delivered again; a SIGINT before it starts again finds
    no run in progress, whatever the record kept of the lost one."""
    srv = await start_server(lease_ttl_ms=400, heartbeat_interval_ms=50)  # type: ignore[operator]
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w-before", ["agent"])
        ref, _, sent = await started_run(stub, worker, "restart")
        worker.close()
    await srv.stop(0)
    srv = await start_server(lease_ttl_ms=400, heartbeat_interval_ms=50)  # type: ignore[operator]
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w-after", ["agent"])
        await worker.next("lease_granted")
        redelivered = await worker.next("delivery")
        assert (redelivered.event.key, redelivered.attempt) == (sent.key, 2)
        sig = await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGINT))
        # Not aborted: the new runtime judges (SQLite: still running) or the entity went idle with
        # its lost runtime (PostgreSQL: the expired session's lease ended with runtime_lost).
        assert sig.outcome in (pb.SIGNAL_OUTCOME_PENDING, pb.SIGNAL_OUTCOME_IGNORED)
        worker.close()
