"""The A2A face (issue 49, item 1; docs/a2a.md) driven by the official Python client, a2a-sdk.

A real server with ``--a2a`` on its HTTP door, on either store; a worker on the test's loop.
Every wait is on a stream (A2A's or the entity's), never a sleep.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import grpc
import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.client.card_resolver import A2ACardResolver
from a2a.client.errors import A2AClientError, AgentCardResolutionError
from a2a.types import a2a_pb2 as a2a
from a2a.utils.errors import (
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from electric_sdk import AsyncClient
from electric_sdk.runtime import App, Context, Message
from electric_sdk.testing import TestServer

from .rt_support import running_worker, until

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]

TOKENS = """
[[tokens]]
token = "all-scopes"
principal = "a2a-caller"
scopes = ["admin"]

[[tokens]]
token = "read-only"
principal = "reader"
scopes = ["read"]

[[tokens]]
token = "other-type"
principal = "other"
scopes = ["admin"]
types = ["other"]
"""
AGENT = "/_electric/a2a/types/agent"
ALL = "all-scopes"


def _app() -> App:
    app = App(code_version="a2a")

    @app.entity("agent", grace_period="20s", idle_timeout="1h")
    class Agent:
        async def on_message(self, ctx: Context, message: Message) -> None:
            if message.text == "hold":
                ctx.output.write("thinking")
                await ctx.emit("in_step", None)
                await ctx.step("model", anyio.sleep, 3600)
            if message.text == "ask":
                name = await ctx.ask("your name?")
                ctx.output.write(f"hello {name}")
                return
            ctx.output.write(f"echo: {message.text}")

    return app


@pytest.fixture
def a2a_server(tmp_path: Path, database_url: str | None) -> Iterator[TestServer]:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    with TestServer(
        tmp_path / "electric", http="127.0.0.1:0", a2a=True, tokens_file=tokens, database_url=database_url
    ) as server:
        yield server


@pytest.fixture
async def native(a2a_server: TestServer) -> AsyncIterator[AsyncClient]:
    async with a2a_server.async_client(token=ALL) as c:
        yield c


@asynccontextmanager
async def _client(
    server: TestServer, token: str = ALL, streaming: bool = True, binding: str = "JSONRPC"
) -> AsyncIterator[Any]:
    """The official client of the type's agent, found by its card, with ``token`` (on the gRPC
    binding too: as each call's metadata)."""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        config = ClientConfig(
            streaming=streaming,
            httpx_client=http,
            supported_protocol_bindings=[binding],
            grpc_channel_factory=lambda url: grpc.aio.insecure_channel(url, interceptors=_bearer(token)),
        )
        async with await create_client(server.http_address + AGENT, client_config=config) as client:
            yield client


def _bearer(token: str) -> list[Any]:
    """grpc.aio client interceptors that add ``authorization: Bearer token`` to each call."""

    def with_token(details: Any) -> Any:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), ("authorization", f"Bearer {token}"))
        return details._replace(metadata=metadata)

    class Unary(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            return await continuation(with_token(details), request)

    class Stream(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
            return await continuation(with_token(details), request)

    return [Unary(), Stream()]


def _message(text: str, context_id: str = "", task_id: str = "") -> a2a.SendMessageRequest:
    message = a2a.Message(
        message_id=uuid.uuid4().hex,
        role=a2a.ROLE_USER,
        parts=[a2a.Part(text=text)],
        context_id=context_id,
        task_id=task_id,
    )
    return a2a.SendMessageRequest(message=message)


async def _last_task(stream: AsyncIterator[a2a.StreamResponse]) -> tuple[a2a.Task, list[int]]:
    """The task the stream started, its state after every event, and those states."""
    task: a2a.Task | None = None
    states: list[int] = []
    async for response in stream:
        if response.HasField("task"):
            task = response.task
        elif response.HasField("status_update"):
            assert task is not None
            task.status.CopyFrom(response.status_update.status)
        elif response.HasField("artifact_update"):
            assert task is not None
            task.artifacts.append(response.artifact_update.artifact)
        assert task is not None
        states.append(task.status.state)
    assert task is not None
    return task, states


async def test_cards_name_the_agents_and_what_is_not_served(a2a_server: TestServer) -> None:
    async with (
        running_worker(_app(), a2a_server.address, token=ALL),
        httpx.AsyncClient(headers={"Authorization": f"Bearer {ALL}"}) as http,
    ):
        root = await A2ACardResolver(http, a2a_server.http_address).get_agent_card()
        card = await A2ACardResolver(http, a2a_server.http_address + AGENT).get_agent_card()
    assert [s.id for s in root.skills] == ["agent"]
    assert root.supported_interfaces[0].url == a2a_server.http_address + "/_electric/a2a"
    assert {i.protocol_binding for i in card.supported_interfaces} == {"JSONRPC", "HTTP+JSON", "GRPC"}
    assert card.supported_interfaces[0].url == a2a_server.http_address + AGENT
    # gRPC: the door's own port, the type's agent named as the requests' tenant.
    (over_grpc,) = [i for i in card.supported_interfaces if i.protocol_binding == "GRPC"]
    assert (over_grpc.url, over_grpc.tenant) == (a2a_server.address, "agent")
    assert [i.tenant for i in root.supported_interfaces if i.protocol_binding == "GRPC"] == [""]
    assert card.capabilities.streaming
    assert not card.capabilities.push_notifications
    assert "push notifications" in card.description
    assert "bearer" in card.security_schemes


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON", "GRPC"])
async def test_send_and_stream_a_message_to_an_entity(
    a2a_server: TestServer, native: AsyncClient, binding: str
) -> None:
    async with running_worker(_app(), a2a_server.address, token=ALL):
        async with _client(a2a_server, binding=binding) as client:
            # No context: A2A's server makes one, here a new entity.
            task, states = await _last_task(client.send_message(_message("hi")))
            assert states[0] == a2a.TASK_STATE_SUBMITTED
            assert states[-1] == a2a.TASK_STATE_COMPLETED
            assert task.artifacts[0].parts[0].text == "echo: hi"
            entity = f"agent/{task.context_id}"
            # The second message goes to the same entity: its own task, the same context.
            again, _ = await _last_task(client.send_message(_message("again", task.context_id)))
            assert again.context_id == task.context_id
            assert again.id != task.id
            got = await client.get_task(a2a.GetTaskRequest(id=task.id))
            assert got.status.state == a2a.TASK_STATE_COMPLETED
            assert got.history[0].parts[0].text == "hi"
            listed = await client.list_tasks(a2a.ListTasksRequest(context_id=task.context_id))
            assert [t.id for t in listed.tasks] == [task.id, again.id]
        messages = [e for e in (await native.events(entity, 0, 100)).events if e.type == "message"]
        assert [m.value["sender"] for m in messages] == ["a2a-caller", "a2a-caller"]


@pytest.mark.parametrize("binding", ["JSONRPC", "GRPC"])
async def test_cancel_mid_step_is_a_sigint_answered_once_unwound(
    a2a_server: TestServer, native: AsyncClient, binding: str
) -> None:
    async with (
        running_worker(_app(), a2a_server.address, token=ALL),
        _client(a2a_server, streaming=False, binding=binding) as client,
    ):
        request = _message("hold", "c1")
        request.configuration.return_immediately = True
        (sent,) = [r async for r in client.send_message(request)]
        await until(native, "agent/c1", lambda e: e.type == "in_step")
        canceled = await client.cancel_task(a2a.CancelTaskRequest(id=sent.task.id))
        assert canceled.status.state == a2a.TASK_STATE_CANCELED
        events = (await native.events("agent/c1", 0, 100)).events
        sigints = [e for e in events if e.type == "signal" and e.operation == "insert"]
        assert len(sigints) == 1, [(e.type, e.value) for e in events]
        sigint = sigints[0]
        assert sigint.value["signal"] == "SIGINT"
        assert sigint.value["sender"] == "a2a-caller"
        assert sigint.value["message_key"] == canceled.history[0].message_id
        ended = [e for e in events if e.type == "run" and e.value["status"] == "aborted"]
        assert ended
        assert ended[-1].offset > sigint.offset
        # An ended task is not cancelable, and nothing more is written.
        with pytest.raises(TaskNotCancelableError):
            await client.cancel_task(a2a.CancelTaskRequest(id=sent.task.id))
        assert len((await native.events("agent/c1", 0, 100)).events) == len(events)


async def test_subscribe_follows_a_task_across_a_restart(a2a_server: TestServer, native: AsyncClient) -> None:
    async with (
        running_worker(_app(), a2a_server.address, token=ALL),
        _client(a2a_server, streaming=False) as client,
    ):
        request = _message("hold", "s1")
        request.configuration.return_immediately = True
        (sent,) = [r async for r in client.send_message(request)]
        await until(native, "agent/s1", lambda e: e.type == "in_step")
    # The server restarts on its data (its port changes): the task is read from the stream.
    a2a_server.stop()
    a2a_server.start()
    async with a2a_server.async_client(token=ALL) as again, _client(a2a_server) as client:
        seen: list[int] = []
        subscribed = anyio.Event()

        async def subscribe() -> None:
            async for response in client.subscribe(a2a.SubscribeToTaskRequest(id=sent.task.id)):
                state = (
                    response.task.status.state
                    if response.HasField("task")
                    else response.status_update.status.state
                )
                seen.append(state)
                subscribed.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(subscribe)
            await subscribed.wait()
            await again.interrupt("agent/s1")
        assert seen[-1] == a2a.TASK_STATE_CANCELED
        # An ended task has nothing more to follow (GetTask reads it), as the SDK's own handler says.
        with pytest.raises(UnsupportedOperationError):
            _ = [r async for r in client.subscribe(a2a.SubscribeToTaskRequest(id=sent.task.id))]


async def test_a_token_without_its_scope_is_refused_nothing_written(
    a2a_server: TestServer, native: AsyncClient
) -> None:
    # An unknown token gets not even the card; a token without `send` gets the card, not a send.
    with pytest.raises(AgentCardResolutionError, match="401"):
        async with _client(a2a_server, token="not-a-token"):
            pass
    async with _client(a2a_server, token="read-only", streaming=False) as client:
        with pytest.raises(A2AClientError, match="403"):
            _ = [r async for r in client.send_message(_message("hi", "a1"))]
    async with httpx.AsyncClient() as http:
        answer = await http.post(
            a2a_server.http_address + AGENT,
            json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}},
            headers={"Authorization": "Bearer read-only"},
        )
        assert answer.status_code == 403
        assert answer.json()["error"]["code"] == "MISSING_SCOPE"
    # A token limited to other types: not this type's agent, not the root agent.
    async with httpx.AsyncClient(headers={"Authorization": "Bearer other-type"}) as http:
        for path in (AGENT, "/_electric/a2a"):
            answer = await http.post(
                a2a_server.http_address + path,
                json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "agent~a1~1"}},
            )
            assert answer.status_code == 403
            assert answer.json()["error"]["code"] == "TYPE_NOT_ALLOWED"
    # The gRPC binding: the same tokens, scopes and types, by the gRPC door's interceptor.
    async with _client(a2a_server, token="read-only", streaming=False, binding="GRPC") as client:
        with pytest.raises(A2AClientError, match="PERMISSION_DENIED"):
            _ = [r async for r in client.send_message(_message("hi", "a1"))]
    async with _client(a2a_server, token="other-type", streaming=False, binding="GRPC") as client:
        with pytest.raises(A2AClientError, match="PERMISSION_DENIED"):  # the card's tenant: agent
            await client.get_task(a2a.GetTaskRequest(id="agent~a1~1"))
        with pytest.raises(TaskNotFoundError):  # its own type's agent has no task of another's
            await client.get_task(a2a.GetTaskRequest(id="agent~a1~1", tenant="other"))
    async with grpc.aio.insecure_channel(a2a_server.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await channel.unary_unary("/lf.a2a.v1.A2AService/GetTask")(b"")
        assert unknown.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Reflection (no token needed) lists and describes it, as tools find it.
        call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo()
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        await call.write(
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="lf.a2a.v1.A2AService")
        )
        listed, described = await call.read(), await call.read()
        await call.done_writing()
        assert "lf.a2a.v1.A2AService" in [s.name for s in listed.list_services_response.service]
        assert described.file_descriptor_response.file_descriptor_proto
    assert await native.list() == []


@pytest.mark.parametrize("binding", ["JSONRPC", "GRPC"])
async def test_list_tasks_without_a_context_goes_through_every_entity(
    a2a_server: TestServer, native: AsyncClient, binding: str
) -> None:
    """ListTasks without a contextId: every entity of the agent's type, a page at a time, the
    token going on where the last page stopped; the root agent's lists every type's."""
    await native.spawn("other/o1")  # another type's entity: not the type agent's to list
    async with (
        running_worker(_app(), a2a_server.address, token=ALL),
        _client(a2a_server, streaming=False, binding=binding) as client,
    ):
        sent = []
        for context, text in (("l1", "one"), ("l2", "two"), ("l1", "three")):
            (reply,) = [r async for r in client.send_message(_message(text, context))]
            sent.append(reply.task.id)
        listed: list[a2a.Task] = []
        token = ""
        pages = 0
        while True:
            page = await client.list_tasks(a2a.ListTasksRequest(page_size=2, page_token=token))
            listed += page.tasks
            pages += 1
            token = page.next_page_token
            if not token:
                break
        assert sorted(t.id for t in listed) == sorted(sent)
        assert pages >= 2
        assert {t.context_id for t in listed} == {"l1", "l2"}
        done = await client.list_tasks(a2a.ListTasksRequest(status=a2a.TASK_STATE_COMPLETED))
        assert len(done.tasks) == 3
        with pytest.raises(InvalidParamsError, match="pageToken"):
            await client.list_tasks(a2a.ListTasksRequest(page_token="not-a-token"))
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ALL}"}, timeout=30) as http:
        config = ClientConfig(streaming=False, httpx_client=http)
        async with await create_client(a2a_server.http_address, client_config=config) as root:
            everything = await root.list_tasks(a2a.ListTasksRequest())
    assert {t.context_id for t in everything.tasks} == {"agent/l1", "agent/l2"}


async def test_the_root_agent_takes_type_and_id_and_serves_no_push(
    a2a_server: TestServer, native: AsyncClient
) -> None:
    async with (
        running_worker(_app(), a2a_server.address, token=ALL),
        httpx.AsyncClient(headers={"Authorization": f"Bearer {ALL}"}, timeout=30) as http,
    ):
        config = ClientConfig(streaming=False, httpx_client=http)
        async with await create_client(a2a_server.http_address, client_config=config) as client:
            (sent,) = [r async for r in client.send_message(_message("root", "agent/r1"))]
            assert sent.task.context_id == "agent/r1"
            assert sent.task.status.state == a2a.TASK_STATE_COMPLETED
            with pytest.raises(InvalidParamsError, match="contextId must be TYPE/ID"):
                _ = [r async for r in client.send_message(_message("no type", "r2"))]
            with pytest.raises(PushNotificationNotSupportedError):
                await client.create_task_push_notification_config(
                    a2a.TaskPushNotificationConfig(task_id=sent.task.id, url="http://127.0.0.1:9/hook")
                )
    assert [(e.ref.type, e.ref.id) for e in await native.list()] == [("agent", "r1")]


async def test_cancel_of_a_queued_task_skips_its_message(a2a_server: TestServer, native: AsyncClient) -> None:
    async with (
        running_worker(_app(), a2a_server.address, token=ALL),
        _client(a2a_server, streaming=False) as client,
    ):
        hold, queued = _message("hold", "q1"), _message("queued", "q1")
        hold.configuration.return_immediately = queued.configuration.return_immediately = True
        (first,) = [r async for r in client.send_message(hold)]
        await until(native, "agent/q1", lambda e: e.type == "in_step")
        (second,) = [r async for r in client.send_message(queued)]
        canceled = await client.cancel_task(a2a.CancelTaskRequest(id=second.task.id))
        assert canceled.status.state == a2a.TASK_STATE_CANCELED
        # The run in progress is not the canceled task's: it goes on.
        running = await client.get_task(a2a.GetTaskRequest(id=first.task.id))
        assert running.status.state == a2a.TASK_STATE_WORKING


async def test_a_page_of_an_allowed_origin_reaches_the_agents(tmp_path: Path) -> None:
    """--cors-origin reaches the A2A paths: the preflight of a JSON-RPC call is answered, and the
    card and the call's answer carry the allow header; another origin's preflight is refused."""
    page = "http://app.example"
    with TestServer(tmp_path / "electric", http="127.0.0.1:0", a2a=True, cors_origins=(page,)) as server:
        async with httpx.AsyncClient(base_url=server.http_address, timeout=30) as http:
            preflight = await http.options(
                AGENT,
                headers={
                    "Origin": page,
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "content-type, a2a-version",
                },
            )
            assert preflight.status_code == 200, preflight.text
            assert preflight.headers["access-control-allow-origin"] == page
            card = await http.get(AGENT + "/.well-known/agent-card.json", headers={"Origin": page})
            assert card.status_code == 200
            assert card.headers["access-control-allow-origin"] == page
            call = await http.post(
                AGENT,
                json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "agent~a1~1"}},
                headers={"Origin": page, "A2A-Version": "1.0"},
            )
            assert call.headers["access-control-allow-origin"] == page
            assert "error" in call.json()  # no such task: the agent answered it
            elsewhere = await http.options(
                AGENT, headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
            )
            assert elsewhere.status_code == 400


def test_a2a_needs_the_http_door(tmp_path: Path) -> None:
    from electric_server import ElectricServer, ServerConfig
    from electric_server.config_error import ConfigError

    with pytest.raises(ConfigError, match="--a2a needs --http"):
        ElectricServer(ServerConfig(data_dir=tmp_path, a2a=True))


async def test_a_busy_entitys_reject_policy_answers_a_rejected_task(
    a2a_server: TestServer, native: AsyncClient
) -> None:
    async with (
        running_worker(_app(), a2a_server.address, token=ALL),
        _client(a2a_server, streaming=False) as client,
    ):
        request = _message("hold", "r1")
        request.configuration.return_immediately = True
        (busy,) = [r async for r in client.send_message(request)]
        await until(native, "agent/r1", lambda e: e.type == "in_step")
        before = len((await native.events("agent/r1", 0, 100)).events)
        second = _message("me too", "r1")
        second.message.metadata.update({"policy": "reject"})
        (answer,) = [r async for r in client.send_message(second)]
        assert answer.task.status.state == a2a.TASK_STATE_REJECTED
        assert "busy" in answer.task.status.message.parts[0].text, answer.task.status
        assert answer.task.id != busy.task.id
        # Nothing was written, and no task of that id is found.
        assert len((await native.events("agent/r1", 0, 100)).events) == before
        with pytest.raises(TaskNotFoundError):
            await client.get_task(a2a.GetTaskRequest(id=answer.task.id))
        await client.cancel_task(a2a.CancelTaskRequest(id=busy.task.id))


async def test_input_required_and_its_reply_carry_one_task_on(
    a2a_server: TestServer, native: AsyncClient
) -> None:
    async with running_worker(_app(), a2a_server.address, token=ALL), _client(a2a_server) as client:
        task, states = await _last_task(client.send_message(_message("ask", "q1")))
        # The stream ends where the run asked: the task waits, its question the status message.
        assert states[-1] == a2a.TASK_STATE_INPUT_REQUIRED
        assert task.status.message.parts[0].text == "your name?"
        got = await client.get_task(a2a.GetTaskRequest(id=task.id))
        assert got.status.state == a2a.TASK_STATE_INPUT_REQUIRED
        # The reply names the task: the same task goes on to its end.
        replied, states = await _last_task(client.send_message(_message("Ada", "q1", task.id)))
        assert replied.id == task.id
        assert states[-1] == a2a.TASK_STATE_COMPLETED
        assert replied.artifacts[0].parts[0].text == "hello Ada"
        got = await client.get_task(a2a.GetTaskRequest(id=task.id))
        assert got.status.state == a2a.TASK_STATE_COMPLETED
        # A task that does not wait for input takes no reply, and nothing is written.
        before = len((await native.events("agent/q1", 0, 100)).events)
        with pytest.raises(InvalidParamsError, match="not input-required"):
            await _last_task(client.send_message(_message("again", "q1", task.id)))
        assert len((await native.events("agent/q1", 0, 100)).events) == before
