"""Calls to other A2A agents as recorded steps: ``await ctx.call_agent(agent, text, timeout=...)``.

An agent is declared once per app (``app.a2a_agent(name, url=...)``) and reached through the
official ``a2a-sdk`` client (the ``[a2a]`` extra), which reads the agent's card and picks the
binding it offers. A call is the recorded step ``a2a:<agent>``: it sends one message (its
``message_id`` is the step's key, the same on a retry), follows the task's stream to its end, and
its result is JSON — ``{"task", "context", "state", "text", "artifacts"}`` — so a replay answers it
from the record. A task that ends ``failed``, ``rejected`` or ``canceled`` by the agent fails the
step; ``input-required`` and ``auth-required`` are answered as they are, for the code to decide.

Around the call the runtime writes ``electric.a2a`` records that the stop fold reads
(``_wire/stop_stages.py``, ``downstream``), as MCP calls write ``electric.mcp``::

    {"run": message key, "call": id, "agent": name, "task": id, "phase": started | ended |
     cancelled | bound_passed, "reason": ...}

A signal that ends the run (SIGINT, an interrupting SIGTERM, SIGKILL, the grace deadline) cuts
the call: the runtime sends the agent ``CancelTask`` for its task, its metadata naming the
signal, and records ``cancelled`` with the state the agent answered — or ``bound_passed`` when no
answer came within the agent's ``cancel_bound`` (never claimed acknowledged). A call cut before the agent
named its task has nothing to cancel: its stream is closed, and the record says so.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from .._proto.electric.v1 import runtime_service_pb2 as rt
from .._wire.json_values import json_to_value
from .mcp import RECORD_BOUND_S, sessions_of, why_cut

if TYPE_CHECKING:
    from .context import Context

__all__ = ["A2A_EVENT", "A2AAgent", "A2AClients", "call_agent"]

A2A_EVENT = "electric.a2a"
# Task states (a2a-sdk's enum names, less TASK_STATE_) that fail the step.
_FAILS = ("failed", "rejected", "canceled")
# What a StreamResponse carries: one of these.
_PAYLOADS = ("task", "message", "status_update", "artifact_update")


@dataclass(frozen=True)
class A2AAgent:
    """An A2A agent at ``url`` (its card is read from there), with an optional bearer token."""

    name: str
    url: str
    token: str = ""
    # How long the agent has to answer a cut call's CancelTask (``bound_passed`` after).
    cancel_bound_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"A2A agent name {self.name!r}: non-empty, no '/'")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"A2A agent {self.name!r}: url must be http:// or https://, not {self.url!r}")


def _import_client() -> None:
    import a2a.client  # noqa: F401


class A2AClients:
    """A host's A2A clients, one per agent, made at their first call; closed at the host's end."""

    def __init__(self) -> None:
        self._open: dict[A2AAgent, Any] = {}
        self._http: list[Any] = []

    async def client(self, agent: A2AAgent) -> Any:
        held = self._open.get(agent)
        if held is not None:
            return held
        # The SDK is imported at the first call, in a thread: a second of import on the loop would
        # miss the worker's heartbeats.
        try:
            await anyio.to_thread.run_sync(_import_client)
        except ImportError as exc:
            raise RuntimeError("A2A calls need the a2a extra: pip install 'electric-sdk[a2a]'") from exc
        import httpx
        from a2a.client import ClientConfig, create_client

        headers = {"authorization": f"Bearer {agent.token}"} if agent.token else {}
        http = httpx.AsyncClient(headers=headers, timeout=None)
        try:
            made = await create_client(agent.url, ClientConfig(httpx_client=http, streaming=True))
        except BaseException:
            await http.aclose()
            raise
        self._open[agent] = made
        self._http.append(http)  # the SDK's client leaves a given HTTP client open
        return made

    async def aclose(self) -> None:
        held, self._open = list(self._open.values()), {}
        http, self._http = self._http, []
        with anyio.move_on_after(RECORD_BOUND_S):
            for one in [*held, *http]:
                with contextlib.suppress(Exception):
                    await (one.aclose() if hasattr(one, "aclose") else one.close())


def clients_of(host: Any) -> A2AClients:
    clients = getattr(host, "a2a", None)
    if clients is None:
        clients = A2AClients()
        host.a2a = clients
    assert isinstance(clients, A2AClients)
    return clients


async def record(host: Any, data: dict[str, Any]) -> None:
    """An ``electric.a2a`` record, straight through the lease (as mcp.py's: the run's end waits
    for these, and a cleanup's handler writes wait for the run's end)."""
    fenced = getattr(host, "_fenced", None)
    if fenced is not None:  # the test harness keeps no stream
        with contextlib.suppress(Exception):
            await fenced.write(retry=True, custom=rt.CustomEvent(type=A2A_EVENT, data=json_to_value(data)))


def _state_name(value: int) -> str:
    from a2a.types.a2a_pb2 import TaskState

    return TaskState.Name(value).removeprefix("TASK_STATE_").lower().replace("_", "-")


class _Follow:
    """What the task's stream said so far: its ids, its state, its text and artifacts."""

    def __init__(self) -> None:
        self.task = ""
        self.context = ""
        self.state = ""
        self.texts: list[str] = []
        self.artifacts: list[Any] = []

    def see(self, response: Any) -> None:
        from google.protobuf.json_format import MessageToDict

        kind = next((f for f in _PAYLOADS if response.HasField(f)), "")
        if kind == "task":
            self.task, self.context = response.task.id, response.task.context_id
            self.state = _state_name(response.task.status.state)
        elif kind == "status_update":
            self.task = self.task or response.status_update.task_id
            self.state = _state_name(response.status_update.status.state)
            if response.status_update.status.HasField("message"):
                self.texts += [p.text for p in response.status_update.status.message.parts if p.text]
        elif kind == "artifact_update":
            artifact = response.artifact_update.artifact
            self.artifacts.append(MessageToDict(artifact))
            self.texts += [p.text for p in artifact.parts if p.text]
        elif kind == "message":  # an answer without a task
            self.state = "completed"
            self.texts += [p.text for p in response.message.parts if p.text]

    def result(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "context": self.context,
            "state": self.state,
            "text": "\n".join(self.texts),
            "artifacts": self.artifacts,
        }


class _Stream:
    """The task's stream, read in a task of its own under a shield: a signal that cuts the call
    does not end the reading at once, so a task the agent is naming as the cut lands can still be
    cancelled by name (``named``); the cut ends it (``scope``) once ``CancelTask`` is sent."""

    def __init__(self, client: Any, request: Any, follow: _Follow) -> None:
        self._client, self._request, self._follow = client, request, follow
        self.scope = anyio.CancelScope(shield=True)
        self.named = anyio.Event()
        self.finished = anyio.Event()
        self.error: BaseException | None = None

    async def read(self) -> None:
        with self.scope:
            try:
                async for response in self._client.send_message(self._request):
                    self._follow.see(response)
                    if self._follow.task:
                        self.named.set()
            except Exception as exc:  # the call's own failure, raised by the step
                self.error = exc
            finally:
                self.named.set()
                self.finished.set()


async def _cancel(client: Any, agent: A2AAgent, follow: _Follow, why: str) -> tuple[str, str]:
    """The cut call's CancelTask: (phase, reason) for its record."""
    if not follow.task:
        return "cancelled", f"{why}; cut before the agent named its task (its stream closed)"
    from a2a.types.a2a_pb2 import CancelTaskRequest

    request = CancelTaskRequest(id=follow.task)
    request.metadata.update({"reason": why, "sender": "electric"})
    with anyio.move_on_after(agent.cancel_bound_s):
        try:
            task = await client.cancel_task(request)
        except Exception as exc:  # e.g. TaskNotCancelable: it had ended
            return "ended", f"{why}; CancelTask refused: {type(exc).__name__}: {exc}"
        return "cancelled", f"{why}; the agent answered {_state_name(task.status.state)}"
    return "bound_passed", f"{why}; no answer to CancelTask within {agent.cancel_bound_s:g}s"


async def call_agent(
    ctx: Context, agent: A2AAgent, text: str, data: Any, timeout_s: float | None
) -> dict[str, Any]:
    """The call itself (inside its recorded step): its records around it, and its result."""

    host = ctx._host
    run = getattr(host, "_run", None)
    client = await clients_of(host).client(agent)
    from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest

    parts = [Part(text=text)]
    if data is not None:
        part = Part()
        part.data.CopyFrom(json_to_value(data))
        parts.append(part)
    message = Message(role=Role.ROLE_USER, message_id=ctx.step_key, parts=parts)
    call = uuid.uuid4().hex[:12]
    follow = _Follow()

    def base() -> dict[str, Any]:
        return {"run": ctx.message_key, "call": call, "agent": agent.name, "task": follow.task}

    # The stop fold waits for this call's record before the run's end is judged (mcp.settle).
    done = anyio.Event()
    sessions_of(host).in_flight[call] = (done, agent.cancel_bound_s)  # mcp.settle waits up to the bound
    stream = _Stream(client, SendMessageRequest(message=message), follow)
    try:
        await record(host, {**base(), "phase": "started", "reason": ""})
        async with anyio.create_task_group() as tg:
            tg.start_soon(stream.read)
            try:
                with anyio.fail_after(timeout_s):
                    await stream.finished.wait()
            except BaseException as exc:
                why = f"timeout after {timeout_s:g}s" if isinstance(exc, TimeoutError) else why_cut(host, run)
                with anyio.CancelScope(shield=True):
                    # Cut before the agent named its task: its name may be on the way (bounded).
                    with anyio.move_on_after(agent.cancel_bound_s):
                        await stream.named.wait()
                    phase, reason = await _cancel(client, agent, follow, why)
                    stream.scope.cancel()
                    with anyio.move_on_after(RECORD_BOUND_S):
                        await record(host, {**base(), "phase": phase, "reason": reason})
                raise
        if stream.error is not None:
            raise stream.error
    except anyio.get_cancelled_exc_class():
        raise
    except BaseException as exc:
        if not isinstance(exc, TimeoutError):  # a timeout's record is written above
            with anyio.CancelScope(shield=True), anyio.move_on_after(RECORD_BOUND_S):
                reason = f"{type(exc).__name__}: {exc}"
                await record(host, {**base(), "phase": "ended", "reason": reason})
        raise
    else:
        await record(host, {**base(), "phase": "ended", "reason": follow.state})
    finally:
        done.set()
        sessions_of(host).in_flight.pop(call, None)
    if follow.state in _FAILS:
        raise RuntimeError(
            f"A2A agent {agent.name}: task {follow.task} {follow.state}: {' '.join(follow.texts)}"
        )
    return follow.result()
