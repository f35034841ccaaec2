"""The runtime protocol, driven by a hand-written worker over the real bidi stream:
leases with growing epochs, delivery of messages and signals, fenced writes,
lost leases, and redelivery with attempt numbers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anyio
import grpc
import pytest
from conftest import StartServer
from electric_server.app import ElectricServer
from helpers import error_info

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import entity_service_pb2_grpc as api_grpc
from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._proto.electric.v1 import runtime_service_pb2_grpc as rt_grpc
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk.runtime_session import SESSION_ACCEPTED

pytestmark = pytest.mark.anyio


class RawWorker:
    """A worker speaking the protocol by hand: requests in, responses out."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        worker_id: str,
        types: list[str],
        version: str = "v1",
        accepts_batches: bool = False,
        heartbeats: bool = True,
        profile: pb.Profile | None = None,
    ) -> None:
        self.requests: asyncio.Queue[rt.ConnectRequest | None] = asyncio.Queue()
        self.requests.put_nowait(
            rt.ConnectRequest(
                hello=rt.Hello(
                    worker_id=worker_id,
                    types=[rt.HostedType(type=t, profile=profile) for t in types],
                    code_version=version,
                    accepts_batches=accepts_batches,
                )
            )
        )
        self.call = rt_grpc.RuntimeServiceStub(channel).Connect(self._requests())
        self._ids = 0
        self.accepts_batches = accepts_batches
        self.batches_seen = 0
        self._unpacked: list[rt.ConnectResponse] = []
        self._beating = asyncio.get_running_loop().create_task(self._heartbeat()) if heartbeats else None

    async def _heartbeat(self) -> None:
        """Heartbeat as a worker does, at the interval the test server asks for (50 ms), so a
        loaded machine cannot expire a lease mid-test; a worker meant to go silent opts out."""
        while True:
            await asyncio.sleep(0.05)
            self.requests.put_nowait(rt.ConnectRequest(heartbeat=rt.Heartbeat()))

    async def _requests(self) -> AsyncIterator[rt.ConnectRequest]:
        while (item := await self.requests.get()) is not None:
            yield item

    async def next(self, kind: str) -> Any:
        """The next response of this kind; others in between are skipped."""
        with anyio.fail_after(10):
            while True:
                if self._unpacked:
                    response = self._unpacked.pop(0)
                else:
                    response = await self.call.read()
                    assert response is not grpc.aio.EOF, f"the session ended while waiting for {kind}"
                    if response.WhichOneof("msg") == "batch":
                        # Only for a worker that said it takes them; every test checks that.
                        assert self.accepts_batches, "a batch sent to a worker that does not accept them"
                        self.batches_seen += 1
                        self._unpacked.extend(response.batch.responses)
                        continue
                if response.WhichOneof("msg") == kind:
                    return getattr(response, kind)

    async def write(self, ref: pb.EntityRef, epoch: int, expect: int, **op: Any) -> rt.WriteResult:
        self._ids += 1
        self.requests.put_nowait(
            rt.ConnectRequest(
                write=rt.RuntimeWrite(request_id=self._ids, ref=ref, epoch=epoch, expect_state=expect, **op)  # type: ignore[arg-type]
            )
        )
        result: rt.WriteResult = await self.next("write_result")
        assert result.request_id == self._ids
        return result

    def stop_heartbeats(self) -> None:
        if self._beating is not None:
            self._beating.cancel()

    async def until_ended(self) -> None:
        """Read until the server ends the session (its status OK). A heartbeat grpc was writing
        as the server ended the call fails on this side, and grpc.aio then reports that write's
        failure (INTERNAL, a failed SendMessageOperation) instead of the end: an end all the
        same, and the heartbeats go on until then, so no lease expires meanwhile."""
        try:
            while (await self.call.read()) is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError as exc:
            failed_send = "SendMessageOperation" in (exc.debug_error_string() or "")
            if exc.code() != grpc.StatusCode.INTERNAL or not failed_send:
                raise

    def close(self) -> None:
        self.stop_heartbeats()
        # End the request stream too: once the call is over, cancel() no longer
        # stops grpc's task that feeds it, which would be left waiting on the queue.
        self.requests.put_nowait(None)
        self.call.cancel()


async def running(
    stub: api_grpc.EntityServiceStub, worker: RawWorker, id_: str
) -> tuple[pb.EntityRef, rt.Lease]:
    """Spawn agent/ID, take its lease on ``worker`` and write spawning → running."""
    ref = pb.EntityRef(type="agent", id=id_)
    await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref))
    lease: rt.Lease = (await worker.next("lease_granted")).lease
    started = await worker.write(
        ref, lease.epoch, pb.STATE_SPAWNING, transition=rt.Transition(to=pb.STATE_RUNNING, cause="started")
    )
    assert started.applied, started
    return ref, lease


async def usr_then_kill(
    stub: api_grpc.EntityServiceStub, worker: RawWorker, ref: pb.EntityRef
) -> tuple[api.SignalEntityResponse, api.SignalEntityResponse]:
    """SIGUSR, delivered to ``worker`` (its outcome owed), then SIGKILL: the entity has ended."""
    usr = await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGUSR))
    assert (await worker.next("delivery")).event.key == usr.key
    kill = await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGKILL))
    return usr, kill


async def read_to_end(call: Any) -> None:
    while (await call.read()) is not grpc.aio.EOF:
        pass


async def events(stub: api_grpc.EntityServiceStub, ref: pb.EntityRef) -> list[pb.Event]:
    return list((await stub.ReadEvents(api.ReadEventsRequest(ref=ref, limit=1000))).events)


@pytest.fixture
async def runtime_server(start_server: StartServer) -> ElectricServer:
    return await start_server(lease_ttl_ms=400, heartbeat_interval_ms=50)


async def test_lease_delivery_and_fenced_writes(runtime_server: ElectricServer) -> None:
    async with grpc.aio.insecure_channel(runtime_server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w1", ["agent"])
        welcome = await worker.next("welcome")
        assert welcome.heartbeat_interval.ToMilliseconds() == 50
        ref = pb.EntityRef(type="agent", id="a1")
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref))
        granted = await worker.next("lease_granted")
        epoch = granted.lease.epoch
        assert granted.entity.state == pb.STATE_SPAWNING
        assert epoch == 1

        started = await worker.write(
            ref, epoch, pb.STATE_SPAWNING, transition=rt.Transition(to=pb.STATE_RUNNING, cause="started")
        )
        assert started.applied, started
        assert started.entity.state == pb.STATE_RUNNING

        # Fencing: a stale epoch, a wrong expected state, an illegal transition: refused, nothing written.
        before = await events(stub, ref)
        stale = await worker.write(ref, epoch + 1, pb.STATE_RUNNING, custom=rt.CustomEvent(type="note"))
        assert (stale.applied, stale.reason) == (False, "STALE_EPOCH")
        moved = await worker.write(
            ref, epoch, pb.STATE_IDLE, transition=rt.Transition(to=pb.STATE_RUNNING, cause="wake")
        )
        assert (moved.applied, moved.reason) == (False, "STATE_CHANGED")
        illegal = await worker.write(
            ref, epoch, pb.STATE_RUNNING, transition=rt.Transition(to=pb.STATE_STOPPED, cause="started")
        )
        assert (illegal.applied, illegal.reason) == (False, "INVALID_TRANSITION")
        assert await events(stub, ref) == before

        # A message is delivered in order with its attempt; a signal the moment it lands.
        sent = await stub.SendMessage(api.SendMessageRequest(ref=ref, text="hello"))
        delivery = await worker.next("delivery")
        assert (delivery.event.type, delivery.event.key, delivery.attempt) == ("message", sent.key, 1)
        run = pb.RunValue(
            message_key=sent.key, message_offset=sent.offset, status=pb.RUN_STATUS_STARTED, attempt=1
        )
        assert (await worker.write(ref, epoch, pb.STATE_RUNNING, run=run)).applied
        usr = await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGUSR))
        assert usr.outcome == pb.SIGNAL_OUTCOME_PENDING  # the runtime reports it
        signal_delivery = await worker.next("delivery")
        assert signal_delivery.event.key == usr.key
        outcome = rt.SignalOutcomeUpdate(
            signal_key=usr.key, signal=pb.SIGNAL_SIGUSR, outcome=pb.SIGNAL_OUTCOME_DELIVERED
        )
        assert (await worker.write(ref, epoch, pb.STATE_RUNNING, signal_outcome=outcome)).applied
        done = pb.RunValue(
            message_key=sent.key, message_offset=sent.offset, status=pb.RUN_STATUS_COMPLETED, output="hi"
        )
        assert (await worker.write(ref, epoch, pb.STATE_RUNNING, run=done)).applied
        log = await events(stub, ref)
        update = log[-2]
        assert (update.key, update.headers.operation) == (usr.key, pb.OPERATION_UPDATE)
        assert update.signal.outcome == pb.SIGNAL_OUTCOME_DELIVERED
        assert log[-1].run.status == pb.RUN_STATUS_COMPLETED
        worker.close()


async def test_lost_lease_goes_idle_and_the_message_is_redelivered(runtime_server: ElectricServer) -> None:
    async with grpc.aio.insecure_channel(runtime_server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        first = RawWorker(channel, "w-first", ["agent"])
        ref, lease = await running(stub, first, "lost")
        sent = await stub.SendMessage(api.SendMessageRequest(ref=ref, text="work"))
        await first.next("delivery")
        run = pb.RunValue(
            message_key=sent.key, message_offset=sent.offset, status=pb.RUN_STATUS_STARTED, attempt=1
        )
        assert (await first.write(ref, lease.epoch, pb.STATE_RUNNING, run=run)).applied
        first.close()  # the worker dies mid-run

        second = RawWorker(channel, "w-second", ["agent"])
        granted = await second.next("lease_granted")
        assert granted.lease.epoch > lease.epoch
        assert granted.entity.state == pb.STATE_IDLE  # running → idle, cause runtime_lost
        redelivered = await second.next("delivery")
        assert (redelivered.event.key, redelivered.attempt) == (sent.key, 2)
        state_events = [e.state for e in await events(stub, ref) if e.type == "state"]
        assert (state_events[-1].state, state_events[-1].cause) == (pb.STATE_IDLE, "runtime_lost")
        # The dead worker's epoch is fenced off for good.
        assert (
            await second.write(ref, lease.epoch, pb.STATE_IDLE, custom=rt.CustomEvent(type="x"))
        ).reason == ("STALE_EPOCH")
        second.close()


async def test_missed_heartbeats_expire_the_lease(runtime_server: ElectricServer) -> None:
    async with grpc.aio.insecure_channel(runtime_server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        silent = RawWorker(channel, "w-silent", ["agent"], heartbeats=False)
        ref, _lease = await running(stub, silent, "quiet")
        # No heartbeat follows: after the lease TTL the server ends the session.
        with anyio.fail_after(10):
            while (await silent.call.read()) is not grpc.aio.EOF:
                pass
        entity = (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity
        assert entity.state == pb.STATE_IDLE
        silent.close()


async def test_paused_entities_get_no_messages_until_sigcont(runtime_server: ElectricServer) -> None:
    async with grpc.aio.insecure_channel(runtime_server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w-pause", ["agent"])
        ref, _lease = await running(stub, worker, "p1")
        await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGSTOP))
        assert (await worker.next("delivery")).event.signal.signal == pb.SIGNAL_SIGSTOP
        queued = await stub.SendMessage(api.SendMessageRequest(ref=ref, text="later"))
        await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGCONT))
        # The queued message flows only after SIGCONT landed, never while paused.
        seen = []
        while True:
            delivery = await worker.next("delivery")
            if delivery.event.type == "message":
                assert delivery.event.key == queued.key
                break
            seen.append(delivery.event.signal.signal if delivery.event.type == "signal" else None)
        assert pb.SIGNAL_SIGCONT in seen
        worker.close()


async def reload_and_wake(
    stub: api_grpc.EntityServiceStub, holder: RawWorker, ref: pb.EntityRef, lease: rt.Lease
) -> None:
    """SIGHUP a running entity its ``holder`` leases: the holder goes idle (``reload``) and lets
    go, and a message wakes the entity on whichever worker the server picks now."""
    await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGHUP))
    await holder.next("delivery")
    idle = await holder.write(
        ref, lease.epoch, pb.STATE_RUNNING, transition=rt.Transition(to=pb.STATE_IDLE, cause="reload")
    )
    assert idle.applied
    holder.requests.put_nowait(rt.ConnectRequest(release=rt.Release(ref=ref, epoch=lease.epoch)))
    await stub.SendMessage(api.SendMessageRequest(ref=ref, text="wake up"))


async def test_sighup_sends_the_next_wake_to_the_newest_code(runtime_server: ElectricServer) -> None:
    async with grpc.aio.insecure_channel(runtime_server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        old = RawWorker(channel, "w-old", ["agent"], version="v1")
        ref, lease = await running(stub, old, "hup")
        new = RawWorker(channel, "w-new", ["agent"], version="v2")
        await new.next("welcome")
        await reload_and_wake(stub, old, ref, lease)
        granted = await new.next("lease_granted")  # v2 is the newest announced: it gets the wake
        assert granted.entity.state == pb.STATE_IDLE
        old.close()
        new.close()


async def test_workers_need_the_runtime_scope(start_server: StartServer, tmp_path: Any) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[[tokens]]\ntoken = "reader-token-1"\nprincipal = "reader"\nscopes = ["read", "signal", "send"]\n'
        '[[tokens]]\ntoken = "worker-token-1"\nprincipal = "w"\nscopes = ["runtime"]\ntypes = ["agent"]\n'
    )
    tokens.chmod(0o600)  # a tokens file others may read is refused
    srv = await start_server(tokens_file=tokens)
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = rt_grpc.RuntimeServiceStub(channel)

        async def connect(token: str, types: list[str]) -> tuple[Any, bool]:
            """Connect as runtime_session says: hello only once the server accepted the stream."""
            call = stub.Connect(metadata=[("authorization", f"Bearer {token}")])
            accepted = (await call.initial_metadata()).get(SESSION_ACCEPTED[0]) == SESSION_ACCEPTED[1]
            if accepted:
                hello = rt.Hello(worker_id="w1", types=[rt.HostedType(type=t) for t in types])
                await call.write(rt.ConnectRequest(hello=hello))
            return call, accepted

        for token, types, code, at_the_door in [
            ("reader-token-1", ["agent"], grpc.StatusCode.PERMISSION_DENIED, True),
            ("nobody-token-1", ["agent"], grpc.StatusCode.UNAUTHENTICATED, True),
            ("worker-token-1", ["other"], grpc.StatusCode.PERMISSION_DENIED, False),  # after hello
        ]:
            with anyio.fail_after(10):
                call, accepted = await connect(token, types)
            assert accepted is not at_the_door
            with anyio.fail_after(10), pytest.raises(grpc.aio.AioRpcError) as denied:
                await call.read()
            assert denied.value.code() == code
        with anyio.fail_after(10):
            call, accepted = await connect("worker-token-1", ["agent"])
            assert accepted
            assert (await call.read()).HasField("welcome")
        # An announce (the worker's code changed) is held to the same types as its hello.
        announce = rt.Announce(types=[rt.HostedType(type="other")], code_version="v2")
        await call.write(rt.ConnectRequest(announce=announce))
        with anyio.fail_after(10), pytest.raises(grpc.aio.AioRpcError) as denied:
            await read_to_end(call)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert error_info(denied.value).reason == "TYPE_NOT_ALLOWED"


async def test_a_killed_entity_closes_when_its_lease_ends(runtime_server: ElectricServer) -> None:
    async with grpc.aio.insecure_channel(runtime_server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w-kill", ["agent"])
        ref, lease = await running(stub, worker, "k1")
        usr, kill = await usr_then_kill(stub, worker, ref)
        assert (
            await stub.GetEntity(api.GetEntityRequest(ref=ref))
        ).entity.closed is False  # the runtime may still write its closing records
        assert (await worker.next("delivery")).event.key == kill.key
        outcome = rt.SignalOutcomeUpdate(
            signal_key=usr.key, signal=pb.SIGNAL_SIGUSR, outcome=pb.SIGNAL_OUTCOME_IGNORED
        )
        assert (await worker.write(ref, lease.epoch, pb.STATE_KILLED, signal_outcome=outcome)).applied
        worker.requests.put_nowait(rt.ConnectRequest(release=rt.Release(ref=ref, epoch=lease.epoch)))
        watch = stub.WatchEvents(api.WatchEventsRequest(ref=ref))
        with anyio.fail_after(10):
            async for item in watch:
                if item.HasField("end_of_stream"):
                    break
        assert (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity.closed
        worker.close()


async def test_after_the_end_only_the_runtimes_closing_records_apply(start_server: StartServer) -> None:
    """After `killed` (as after `stopped`) the runtime may still write the outcome of a signal it
    was given, the end of the run in progress, exec receipts and output; nothing that begins
    anything (ENTITY_TERMINAL), and no outcome of a signal it was not given."""
    server = await start_server(lease_ttl_ms=60_000, heartbeat_interval_ms=50)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w-end", ["agent"])
        ref, lease = await running(stub, worker, "end")
        await stub.SendMessage(api.SendMessageRequest(ref=ref, text="work"))
        message = (await worker.next("delivery")).event
        run = pb.RunValue(message_key=message.key, attempt=1, message_offset=message.offset)
        run.status = pb.RUN_STATUS_STARTED
        assert (await worker.write(ref, lease.epoch, pb.STATE_RUNNING, run=run)).applied
        usr, kill = await usr_then_kill(stub, worker, ref)

        async def refused(expect: int, **op: Any) -> str:
            result = await worker.write(ref, lease.epoch, expect, **op)
            assert not result.applied, op
            return result.reason

        # A worker that has not seen the end yet learns of it at once (no STATE_CHANGED first).
        custom = rt.CustomEvent(type="note")
        assert await refused(pb.STATE_RUNNING, custom=custom) == "ENTITY_TERMINAL"
        assert await refused(pb.STATE_KILLED, custom=custom) == "ENTITY_TERMINAL"
        step = pb.RunValue(message_key=message.key, status=pb.RUN_STATUS_STEP, message_offset=message.offset)
        assert await refused(pb.STATE_KILLED, run=step) == "ENTITY_TERMINAL"
        assert await refused(pb.STATE_KILLED, run=run) == "ENTITY_TERMINAL"  # a run start
        back = rt.Transition(to=pb.STATE_RUNNING, cause="wake")
        assert await refused(pb.STATE_KILLED, transition=back) == "ENTITY_TERMINAL"
        settled = rt.SignalOutcomeUpdate(signal_key=kill.key, outcome=pb.SIGNAL_OUTCOME_IGNORED)
        assert await refused(pb.STATE_KILLED, signal_outcome=settled) == "UNKNOWN_SIGNAL"  # the server's

        closing: list[dict[str, Any]] = [
            {"signal_outcome": rt.SignalOutcomeUpdate(signal_key=usr.key, outcome=pb.SIGNAL_OUTCOME_IGNORED)},
            {"exec": pb.ExecReceipt(task_id="t", action=pb.EXEC_ACTION_FORCE, action_name="SIGKILL")},
            {"output": pb.ExecOutput(task_id="t", stream="stdout", text="last words")},
        ]
        for op in closing:
            assert (await worker.write(ref, lease.epoch, pb.STATE_KILLED, **op)).applied, op
        run.status, run.output = pb.RUN_STATUS_ABORTED, "partial"
        assert (await worker.write(ref, lease.epoch, pb.STATE_KILLED, run=run)).applied  # the run in progress
        assert await refused(pb.STATE_KILLED, run=run) == "ENTITY_TERMINAL"  # it has ended: no second end
        worker.close()


async def test_the_settle_not_the_lease_ttl_bounds_the_closing_records(start_server: StartServer) -> None:
    server = await start_server(lease_ttl_ms=60_000, heartbeat_interval_ms=50, settle_ms=100)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w-settle", ["agent"])
        ref, lease = await running(stub, worker, "settle-bound")
        await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGKILL))
        with anyio.fail_after(10):  # never released, its lease good for a minute: the settle closes it
            async for item in stub.WatchEvents(api.WatchEventsRequest(ref=ref)):
                if item.HasField("end_of_stream"):
                    break
        result = await worker.write(ref, lease.epoch, pb.STATE_KILLED, exec=pb.ExecReceipt(task_id="t"))
        assert (result.applied, result.reason) == (False, "STALE_EPOCH")  # the lease ended with it
        worker.close()


async def outcomes_after_eof(
    stub: api_grpc.EntityServiceStub, ref: pb.EntityRef
) -> dict[str, pb.SignalValue]:
    """Watch the stream to its EOF; each signal's latest value (its outcome update, if any)."""
    latest: dict[str, pb.SignalValue] = {}
    with anyio.fail_after(10):
        async for item in stub.WatchEvents(api.WatchEventsRequest(ref=ref)):
            if item.HasField("end_of_stream"):
                return latest
            if item.event.type == "signal":
                latest[item.event.key] = item.event.signal
    raise AssertionError("the watch ended without EOF")


async def test_a_lost_runtime_of_an_ended_entity_leaves_no_signal_pending(
    runtime_server: ElectricServer,
) -> None:
    """No later lease will report on a killed entity's signals: once its runtime is lost, each one
    it never reported on is settled `ignored` (a SIGTERM's cleanup too), and the stream closes."""
    async with grpc.aio.insecure_channel(runtime_server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w-lost", ["agent"])
        ref, _lease = await running(stub, worker, "lost")
        term = await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGTERM))
        await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGKILL))
        worker.close()  # lost, having reported nothing
        latest = await outcomes_after_eof(stub, ref)
        assert latest[term.key].outcome == pb.SIGNAL_OUTCOME_IGNORED
        assert "lease ended first (runtime_lost" in latest[term.key].detail
        assert all(value.outcome != pb.SIGNAL_OUTCOME_PENDING for value in latest.values())


async def test_a_stream_a_restart_left_open_after_the_end_closes(start_server: StartServer) -> None:
    """The server stopped within an ended entity's settle (its worker still held the lease): the
    restarted server closes the stream, settling what was still pending."""
    server = await start_server(lease_ttl_ms=60_000, heartbeat_interval_ms=50, settle_ms=60_000)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w-restart", ["agent"])
        ref, _lease = await running(stub, worker, "restart")
        usr, _kill = await usr_then_kill(stub, worker, ref)
        assert not (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity.closed
        worker.close()
    await server.stop(0)  # a draining server writes nothing for its sessions
    server = await start_server(lease_ttl_ms=60_000, heartbeat_interval_ms=50)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        latest = await outcomes_after_eof(stub, ref)
        assert latest[usr.key].outcome == pb.SIGNAL_OUTCOME_IGNORED
        assert "lease ended after the entity's end" in latest[usr.key].detail
        assert (await stub.GetEntity(api.GetEntityRequest(ref=ref))).entity.closed


async def test_a_runtime_that_never_lets_go_is_cut_off(runtime_server: ElectricServer) -> None:
    async with grpc.aio.insecure_channel(runtime_server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w-hold", ["agent"])
        ref = pb.EntityRef(type="agent", id="k2")
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref))
        lease = (await worker.next("lease_granted")).lease
        heartbeat = rt.ConnectRequest(heartbeat=rt.Heartbeat(leases=[lease]))
        await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGKILL))
        watch = stub.WatchEvents(api.WatchEventsRequest(ref=ref))
        async with anyio.create_task_group() as tg:

            async def keep_alive() -> None:  # alive all along, but it never releases the lease
                while True:
                    worker.requests.put_nowait(heartbeat)
                    await anyio.sleep(0.05)  # the heartbeat interval the server asked for

            tg.start_soon(keep_alive)
            with anyio.fail_after(10):
                async for item in watch:
                    if item.HasField("end_of_stream"):
                        break
            tg.cancel_scope.cancel()
        # The session itself is still alive: only the lease on the dead entity was ended.
        assert runtime_server.runtime.sessions["w-hold"].closed is False
        worker.close()


async def test_signals_pending_without_a_runtime_reach_the_next_lease(runtime_server: ElectricServer) -> None:
    async with grpc.aio.insecure_channel(runtime_server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        first = RawWorker(channel, "w-a", ["agent"])
        ref, _lease = await running(stub, first, "pend")
        usr = await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGUSR))
        assert (await first.next("delivery")).event.key == usr.key
        first.close()  # dies before reporting the outcome: the signal is still pending
        second = RawWorker(channel, "w-b", ["agent"])
        await second.next("welcome")
        await stub.SendMessage(api.SendMessageRequest(ref=ref, text="wake"))  # idle now: a message wakes it
        await second.next("lease_granted")
        again = await second.next("delivery")  # the pending signal comes first, then the message
        assert (again.event.key, again.event.signal.outcome) == (usr.key, pb.SIGNAL_OUTCOME_PENDING)
        assert (await second.next("delivery")).event.type == "message"
        second.close()


async def test_signals_a_released_lease_never_reported_on_are_settled(runtime_server: ElectricServer) -> None:
    """A runtime that lets go (Release) had its chance: what it never reported on gets `ignored`,
    saying why, so no signal stays pending (a lost runtime's go to the next lease instead)."""
    async with grpc.aio.insecure_channel(runtime_server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w-rel", ["agent"])
        ref, lease = await running(stub, worker, "settle")
        usr = await stub.SignalEntity(
            api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGUSR, reason="check in")
        )
        insert = (await worker.next("delivery")).event
        assert insert.key == usr.key
        worker.requests.put_nowait(rt.ConnectRequest(release=rt.Release(ref=ref, epoch=lease.epoch)))
        update = None
        async with asyncio.timeout(10):  # the release is applied asynchronously: watch for the update
            async for item in stub.WatchEvents(api.WatchEventsRequest(ref=ref, from_offset=0)):
                if item.event.key == usr.key and item.event.headers.operation == pb.OPERATION_UPDATE:
                    update = item.event
                    break
        assert update is not None
        assert update.signal.outcome == pb.SIGNAL_OUTCOME_IGNORED
        assert "lease ended first (released" in update.signal.detail
        # The update's value is the insert's whole value, with the outcome: who sent it and why.
        whole = pb.SignalValue()
        whole.CopyFrom(insert.signal)
        whole.outcome, whole.detail = update.signal.outcome, update.signal.detail
        assert update.signal == whole
        assert (whole.sender, whole.reason, whole.previous_state) == (
            "anonymous",
            "check in",
            pb.STATE_RUNNING,
        )
        worker.close()


async def test_a_draining_worker_hands_its_entities_to_another(runtime_server: ElectricServer) -> None:
    async with grpc.aio.insecure_channel(runtime_server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        old = RawWorker(channel, "w-old-drain", ["agent"])
        ref = pb.EntityRef(type="agent", id="d1")
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref))
        lease = (await old.next("lease_granted")).lease
        new = RawWorker(channel, "w-new-drain", ["agent"])
        await new.next("welcome")
        old.requests.put_nowait(rt.ConnectRequest(drain=rt.Drain()))
        old.requests.put_nowait(rt.ConnectRequest(release=rt.Release(ref=ref, epoch=lease.epoch)))
        granted = await new.next("lease_granted")  # never back to the draining worker
        assert granted.lease.epoch > lease.epoch
        old.close()
        new.close()


async def test_a_types_profile_is_fixed_at_the_first_lease(runtime_server: ElectricServer) -> None:
    """Spawned before any worker announced the type, or a moment later: the same profile. What the
    spawn leaves unset shows as pending until the first lease fixes it from the type's default."""
    grace, idle = pb.PROFILE_FIELD_GRACE_PERIOD, pb.PROFILE_FIELD_IDLE_TIMEOUT
    async with grpc.aio.insecure_channel(runtime_server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)

        async def spawn(id_: str, profile: pb.Profile | None = None) -> pb.Entity:
            request = api.SpawnEntityRequest(ref=pb.EntityRef(type="profiled", id=id_), profile=profile)
            return (await stub.SpawnEntity(request)).entity

        early = await spawn("early")  # no worker has announced the type yet
        assert list(early.pending_profile) == [grace, idle]
        assert not early.profile.HasField("grace_period")
        assert not early.profile.HasField("idle_timeout")
        explicit = await spawn("explicit", pb.Profile(grace_period=convert_ms(40)))
        assert list(explicit.pending_profile) == [idle]
        assert explicit.profile.grace_period.ToMilliseconds() == 40  # the request's own value
        profile = pb.Profile(grace_period=convert_ms(250), idle_timeout=convert_ms(1500))
        worker = RawWorker(channel, "w-prof", ["profiled"], profile=profile)
        late = await spawn("late")  # the type is announced now: still pending until its lease
        assert list(late.pending_profile) == [grace, idle]
        granted = {}
        for _ in range(3):
            lease = await worker.next("lease_granted")
            granted[lease.entity.ref.id] = lease.entity
        expected = {"early": (250, 1500), "explicit": (40, 1500), "late": (250, 1500)}
        for id_, ms in expected.items():
            got = (
                await stub.GetEntity(api.GetEntityRequest(ref=pb.EntityRef(type="profiled", id=id_)))
            ).entity
            for entity in (granted[id_], got):
                assert not entity.pending_profile
                assert (
                    entity.profile.grace_period.ToMilliseconds(),
                    entity.profile.idle_timeout.ToMilliseconds(),
                ) == ms, id_
        worker.close()


async def test_the_newest_code_versions_type_profile_wins_and_is_kept(start_server: StartServer) -> None:
    """Type defaults are stored: after a restart, with only an older version's worker connected,
    the newest version's announcement still applies."""
    server = await start_server(lease_ttl_ms=400, heartbeat_interval_ms=50)
    async with grpc.aio.insecure_channel(server.address) as channel:
        for version, ms in (("v1", 100), ("v2", 250)):
            announcer = RawWorker(
                channel,
                f"w-{version}",
                ["versioned"],
                version,
                profile=pb.Profile(grace_period=convert_ms(ms)),
            )
            await announcer.next("welcome")
            announcer.close()
    await server.stop(0)
    server = await start_server(lease_ttl_ms=400, heartbeat_interval_ms=50)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        ref = pb.EntityRef(type="versioned", id="x")
        await stub.SpawnEntity(api.SpawnEntityRequest(ref=ref))
        old = RawWorker(
            channel, "w-v1-again", ["versioned"], "v1", profile=pb.Profile(grace_period=convert_ms(100))
        )
        granted = (await old.next("lease_granted")).entity
        assert granted.profile.grace_period.ToMilliseconds() == 250  # v2's, though only v1 is connected
        assert granted.profile.idle_timeout.ToMilliseconds() == 60_000  # announced by neither: the server's
        old.close()


def convert_ms(ms: int) -> Any:
    from google.protobuf import duration_pb2

    return duration_pb2.Duration(seconds=ms // 1000, nanos=ms % 1000 * 1_000_000)


async def test_a_batch_applies_in_order_and_a_write_can_give_the_lease_back(
    runtime_server: ElectricServer,
) -> None:
    """A RequestBatch applies as if its requests came one by one. A transition with `release` ends
    the lease in its own commit: the signals the runtime owed are settled there, the next write
    with that epoch is refused, and the next message is leased anew."""
    async with grpc.aio.insecure_channel(runtime_server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w-batch", ["agent"])
        ref, lease = await running(stub, worker, "batched")
        usr = await stub.SignalEntity(api.SignalEntityRequest(ref=ref, signal=pb.SIGNAL_SIGUSR))
        assert (await worker.next("delivery")).event.key == usr.key

        def write(request_id: int, **op: Any) -> rt.ConnectRequest:
            return rt.ConnectRequest(
                write=rt.RuntimeWrite(
                    request_id=request_id, ref=ref, epoch=lease.epoch, expect_state=pb.STATE_RUNNING, **op
                )
            )

        to_idle = rt.Transition(to=pb.STATE_IDLE, cause="idle_timeout")
        batch = [
            write(101, custom=rt.CustomEvent(type="first")),
            write(102, custom=rt.CustomEvent(type="second")),
            write(103, transition=to_idle, release=True),
            write(104, custom=rt.CustomEvent(type="too_late")),
        ]
        worker.requests.put_nowait(rt.ConnectRequest(batch=rt.RequestBatch(requests=batch)))
        results = {r.request_id: r for r in [await worker.next("write_result") for _ in batch]}
        assert [results[i].applied for i in (101, 102, 103)] == [True, True, True]
        assert (results[104].applied, results[104].reason) == (False, "STALE_EPOCH")

        log = await events(stub, ref)
        tail = log[-4:]
        assert [e.type for e in tail] == ["first", "second", "state", "signal"]
        state, settled = tail[2], tail[3]
        assert (state.state.state, state.state.cause) == (pb.STATE_IDLE, "idle_timeout")
        assert (settled.key, settled.headers.operation) == (usr.key, pb.OPERATION_UPDATE)
        assert settled.signal.outcome == pb.SIGNAL_OUTCOME_IGNORED
        assert "lease ended first (released" in settled.signal.detail
        assert settled.headers.txid == state.headers.txid  # one commit

        await stub.SendMessage(api.SendMessageRequest(ref=ref, text="wake up"))
        again = await worker.next("lease_granted")
        assert again.lease.epoch == lease.epoch + 2  # + 1 for the release, + 1 for the new grant
        assert again.entity.state == pb.STATE_IDLE
        worker.close()


async def test_batches_reach_only_a_worker_that_accepts_them(start_server: StartServer) -> None:
    """One SignalEntities to 200 leased entities commits together, so 200 deliveries are queued at
    once: a worker that set `accepts_batches` gets them coalesced (RawWorker unpacks them).
    `RawWorker.next` fails any test whose worker did not set it and got a batch.

    Its own server, with a lease TTL of 10 s: 200 spawns at once can keep a loaded CI machine's
    loop from reading a heartbeat for longer than the other tests' 400 ms, and this test is about
    batching, not about expiry (test_missed_heartbeats_expire_the_lease owns that)."""
    server = await start_server(lease_ttl_ms=10_000, heartbeat_interval_ms=50)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w-batches", ["agent"], accepts_batches=True)
        await worker.next("welcome")
        refs = [pb.EntityRef(type="agent", id=f"b{i:03}") for i in range(200)]
        await asyncio.gather(*(stub.SpawnEntity(api.SpawnEntityRequest(ref=r)) for r in refs))
        granted = [await worker.next("lease_granted") for _ in refs]
        assert sorted(g.lease.ref.id for g in granted) == sorted(r.id for r in refs)
        before = worker.batches_seen
        selector = api.EntitySelector(type="agent")
        await stub.SignalEntities(api.SignalEntitiesRequest(selector=selector, signal=pb.SIGNAL_SIGUSR))
        delivered = [await worker.next("delivery") for _ in refs]
        assert sorted(d.lease.ref.id for d in delivered) == sorted(r.id for r in refs)
        assert {d.event.signal.signal for d in delivered} == {pb.SIGNAL_SIGUSR}
        assert worker.batches_seen > before
        worker.close()


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (
            rt.ConnectRequest(batch=rt.RequestBatch(requests=[rt.ConnectRequest(hello=rt.Hello())])),
            "UNEXPECTED_REQUEST",
        ),
        (
            rt.ConnectRequest(hello=rt.Hello(worker_id="again", types=[rt.HostedType(type="agent")])),
            "UNEXPECTED_REQUEST",
        ),
        (
            rt.ConnectRequest(release=rt.Release(ref=pb.EntityRef(type="agent", id="no/slash"), epoch=1)),
            "INVALID_NAME",
        ),
        (rt.ConnectRequest(announce=rt.Announce(code_version="v2")), "NO_TYPES"),
        (
            rt.ConnectRequest(
                announce=rt.Announce(
                    types=[rt.HostedType(type="agent"), rt.HostedType(type="a/b")], code_version="v2"
                )
            ),
            "INVALID_NAME",
        ),
    ],
    ids=[
        "hello-in-a-batch",
        "second-hello",
        "malformed-release-ref",
        "announce-no-types",
        "announce-bad-type",
    ],
)
async def test_a_bad_request_ends_the_session_with_its_status(
    runtime_server: ElectricServer, bad: rt.ConnectRequest, reason: str
) -> None:
    """A request the protocol does not allow ends the worker's session with INVALID_ARGUMENT and
    the reason (not a silent hang-up), and writes nothing; its leases are given up."""
    async with grpc.aio.insecure_channel(runtime_server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        worker = RawWorker(channel, "w-bad", ["agent"])
        ref, _ = await running(stub, worker, "bad")
        before = await events(stub, ref)
        # Nothing is sent after the bad request: a heartbeat that grpc was still writing when the
        # server ended the call failed there, and grpc.aio then ended the call INTERNAL instead.
        worker.stop_heartbeats()
        worker.requests.put_nowait(bad)
        with anyio.fail_after(10), pytest.raises(grpc.aio.AioRpcError) as caught:
            await read_to_end(worker.call)
        worker.requests.put_nowait(None)  # the request stream ends too (see RawWorker.close)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(caught.value).reason == reason
        after = await events(stub, ref)
        assert after[: len(before)] == before
        # Only the session's end is written: the running entity went idle, its runtime lost.
        assert [(e.type, e.state.cause) for e in after[len(before) :]] == [("state", "runtime_lost")]


@pytest.mark.both_stores
async def test_a_retried_runtime_write_is_appended_once(start_server: StartServer) -> None:
    """A runtime write's request id is kept like an idempotency key: the same write sent again, in
    its session or (its answer lost with the connection) from the worker's next session, gets the
    first answer, and the stream holds it once."""
    server = await start_server(lease_ttl_ms=60_000, heartbeat_interval_ms=50)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        first = RawWorker(channel, "w-retry", ["agent"])
        ref, lease = await running(stub, first, "retry")
        write = rt.RuntimeWrite(
            request_id=41,
            ref=ref,
            epoch=lease.epoch,
            expect_state=pb.STATE_RUNNING,
            custom=rt.CustomEvent(type="note"),
        )
        first.requests.put_nowait(rt.ConnectRequest(write=write))
        answer = await first.next("write_result")
        assert answer.applied, answer
        first.requests.put_nowait(rt.ConnectRequest(write=write))
        again = await first.next("write_result")
        first.close()
        second = RawWorker(channel, "w-retry", ["agent"])
        second.requests.put_nowait(rt.ConnectRequest(write=write))
        replayed = await second.next("write_result")
        other = rt.RuntimeWrite()
        other.CopyFrom(write)
        other.custom.type = "other"  # the same id with another body: not that write's answer
        second.requests.put_nowait(rt.ConnectRequest(write=other))
        refused = await second.next("write_result")
        second.close()
        notes = [e for e in await events(stub, ref) if e.type == "note"]
    assert [(r.applied, r.txid, r.request_id) for r in (again, replayed)] == [(True, answer.txid, 41)] * 2
    assert refused.reason == "STALE_EPOCH"
    assert [e.headers.txid for e in notes] == [answer.txid]


async def test_an_announce_moves_the_session_to_its_new_version(runtime_server: ElectricServer) -> None:
    """A worker whose code changed while connected announces it: the session keeps its leases,
    `ListWorkers` shows the new version, and a SIGHUP'd entity's next wake goes to the newest
    announcement, though another worker said hello later and holds fewer leases."""
    async with grpc.aio.insecure_channel(runtime_server.address) as channel:
        stub = api_grpc.EntityServiceStub(channel)
        first = RawWorker(channel, "w-first", ["agent"], version="v1")
        await first.next("welcome")
        ref, lease = await running(stub, first, "announced")
        await running(stub, first, "busy")  # first holds more leases: without the announce, second wins
        second = RawWorker(channel, "w-second", ["agent"], version="v1")
        await second.next("welcome")
        first.requests.put_nowait(
            rt.ConnectRequest(announce=rt.Announce(types=[rt.HostedType(type="agent")], code_version="v2"))
        )
        with anyio.fail_after(10):
            while True:
                listed = await stub.ListWorkers(api.ListWorkersRequest())
                versions = {w.worker_id: (w.code_version, w.leases_held) for w in listed.workers}
                if versions.get("w-first", ("",))[0] == "v2":
                    break
                await asyncio.sleep(0.01)  # a bounded wait: an announce has no answer
        assert versions == {"w-first": ("v2", 2), "w-second": ("v1", 0)}
        await reload_and_wake(stub, first, ref, lease)
        granted = await first.next("lease_granted")  # v2, the newest announced, gets the wake
        assert granted.lease.ref == ref
        first.close()
        second.close()
