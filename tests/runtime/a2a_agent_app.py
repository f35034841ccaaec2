"""A real A2A agent (the official a2a-sdk server, JSON-RPC over HTTP) for
tests/runtime/test_a2a_calls.py.

``python a2a_agent_app.py PORT REPORT_PORT``. A message ``echo <text>`` is answered at once (an
artifact, then ``completed``); ``hold <tag>`` works until its task is cancelled; ``stubborn <tag>``
too, but its ``cancel`` never answers; ``fail <tag>`` ends ``failed``. Each sighting is one line
to the test's listener on loopback ``REPORT_PORT`` (mcp_support.Sightings): ``- listening``,
``<tag> started``, ``<tag> cancel <time_ns>`` when the agent was asked to cancel, and ``<tag>
reason <reason>`` (the CancelTask's metadata, spaces as ``_``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from collections.abc import AsyncIterator

import uvicorn
from a2a.helpers.proto_helpers import get_message_text, new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events.event_queue_v2 import EventQueue
from a2a.server.request_handlers import DefaultRequestHandlerV2
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types.a2a_pb2 import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part
from starlette.applications import Starlette

PORT, REPORT_PORT = int(sys.argv[1]), int(sys.argv[2])
TAGS: dict[str, str] = {}  # task id -> tag


def _report(line: str) -> None:
    with socket.create_connection(("127.0.0.1", REPORT_PORT)) as conn:
        conn.sendall(line.encode() + b"\n")


class Agent(AgentExecutor):
    async def execute(self, context: RequestContext, queue: EventQueue) -> None:
        verb, _, tag = get_message_text(context.message).partition(" ")
        task = context.current_task or new_task_from_user_message(context.message)
        await queue.enqueue_event(task)
        TAGS[task.id] = tag
        updater = TaskUpdater(queue, task.id, task.context_id)
        await updater.start_work()
        if verb in ("hold", "stubborn"):
            _report(f"{tag} started")
            await asyncio.sleep(3600)  # until cancelled
        if verb == "fail":
            await updater.failed()
            return
        await updater.add_artifact([Part(text=f"echo {tag}")])
        await updater.complete()

    async def cancel(self, context: RequestContext, queue: EventQueue) -> None:
        tag = TAGS.get(context.task_id or "", "?")
        _report(f"{tag} cancel {time.time_ns()}")
        reason = context.metadata.get("reason", "") if context.metadata else ""
        _report(f"{tag} reason_{str(reason).replace(' ', '_')}")
        if tag.startswith("stubborn"):
            await asyncio.sleep(3600)  # never answers
        await TaskUpdater(queue, context.task_id or "", context.context_id or "").cancel()


card = AgentCard(
    name="electric-test",
    description="an agent for electric's tests",
    version="1",
    supported_interfaces=[
        AgentInterface(url=f"http://127.0.0.1:{PORT}/", protocol_binding="JSONRPC", protocol_version="1.0")
    ],
    capabilities=AgentCapabilities(streaming=True),
    default_input_modes=["text/plain"],
    default_output_modes=["text/plain"],
    skills=[AgentSkill(id="echo", name="echo", description="echoes", tags=["test"])],
)
handler = DefaultRequestHandlerV2(agent_executor=Agent(), task_store=InMemoryTaskStore(), agent_card=card)


@contextlib.asynccontextmanager
async def lifespan(_app: Starlette) -> AsyncIterator[None]:
    _report("- listening")
    yield


app = Starlette(
    routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")], lifespan=lifespan
)
uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")
