"""A2A's operations answered by the entity service: the SDK's ``RequestHandler``.

Every answer is read from the entity's stream (``tasks.py``), so any replica answers it and a
subscription resumes after a restart; nothing is kept in the SDK's task stores. The caller is
``current_principal`` (set by ``face.py`` from the bearer token), recorded as the message's and
the SIGINT's sender as for any other door. What each operation does is docs/a2a.md's.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import AsyncGenerator
from typing import Any

import anyio
import grpc
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import a2a_pb2 as a2a
from a2a.utils.errors import (
    A2AError,
    ContentTypeNotSupportedError,
    ExtendedAgentCardNotConfiguredError,
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.times import duration_from_ms
from electric_sdk.lifecycle import Stage

from ..core.errors import ApiError
from ..core.service import EntityService
from ..core.validation import IDEMPOTENCY_KEY_RE, NAME_RE
from .tasks import (
    TaskFold,
    TaskRef,
    door_context,
    follow,
    new_context_id,
    read_on,
    read_task,
    rejected,
    task_ref,
)

__all__ = ["AGENT_TYPE", "EntityAgents"]

# The ServerCallContext's state key for the agent's entity type ("" the root agent's: any type).
AGENT_TYPE = "electric.a2a.type"
# How long CancelTask waits for the run to unwind before it answers with the task as it is.
CANCEL_WAIT_S = 600.0


def _agent_type(call: ServerCallContext) -> str:
    """The type whose agent is called: the face's (the HTTP path's), else the request's tenant (the
    gRPC binding's; a card's interfaces name it); "" the root agent."""
    agent = str(call.state.get(AGENT_TYPE, "")) or call.tenant or ""
    if agent and not NAME_RE.fullmatch(agent):
        raise InvalidParamsError(f"tenant must name an entity type: [A-Za-z0-9_.-], got {agent[:140]!r}")
    return agent


def _refused(exc: ApiError) -> A2AError:
    """The service's refusal as A2A's error: its reason and message kept in ``data``."""
    data = {"reason": exc.reason, **exc.metadata}
    text = f"{exc.reason}: {exc.message}"
    if exc.code is grpc.StatusCode.NOT_FOUND:
        return TaskNotFoundError(text, data)
    if exc.code is grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidParamsError(text, data)
    return InvalidRequestError(text, data)


class _AllTasks:
    """The page token of ``ListTasks`` without a contextId: the entities' page it goes on in, the
    entity (``TYPE/ID``) and the offset there. Opaque to the caller."""

    @staticmethod
    def token(entities_token: str, entity: str, offset: int) -> str:
        raw = json.dumps([entities_token, entity, offset], separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @staticmethod
    def parse(token: str) -> tuple[str, str, int]:
        if not token:
            return "", "", 0
        try:
            found = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
            entities_token, entity, offset = found
            if isinstance(entities_token, str) and isinstance(entity, str) and isinstance(offset, int):
                return entities_token, entity, max(offset, 0)
        except (ValueError, TypeError):
            pass
        raise InvalidParamsError("pageToken: not one this server gave (pass next_page_token as it came)")


class EntityAgents(RequestHandler):
    """Each entity type an A2A agent; the root agent (type "") takes contexts ``TYPE/ID``."""

    def __init__(self, service: EntityService) -> None:
        self.service = service

    # -- where --------------------------------------------------------------------------------

    def _entity(self, call: ServerCallContext, context_id: str) -> tuple[str, str]:
        """The entity a context names: the agent's type and the context as its id (``TYPE/ID``
        at the root agent, or at a type's agent naming its own type)."""
        agent = _agent_type(call)
        type_, slash, id_ = context_id.partition("/")
        if not slash:
            type_, id_ = agent, context_id
        if not agent and not slash:
            raise InvalidParamsError(f"contextId must be TYPE/ID at the root agent, got {context_id[:140]!r}")
        if agent and type_ != agent:
            raise InvalidParamsError(f"contextId {context_id[:140]!r} names another type than {agent!r}")
        for name in (type_, id_):
            if not NAME_RE.fullmatch(name):
                raise InvalidParamsError(f"contextId must name an entity: [A-Za-z0-9_.-], got {name[:140]!r}")
        return type_, id_

    def _context_id(self, call: ServerCallContext, where: TaskRef) -> str:
        return where.id if _agent_type(call) else f"{where.type}/{where.id}"

    def _task(self, call: ServerCallContext, task_id: str) -> TaskRef:
        where = task_ref(task_id)
        agent = _agent_type(call)
        if agent and where.type != agent:
            raise TaskNotFoundError(f"no task {task_id[:200]!r} at the agent of {agent!r}")
        return where

    async def _read(self, call: ServerCallContext, where: TaskRef) -> TaskFold:
        try:
            return await read_task(self.service, where, self._context_id(call, where))
        except ApiError as exc:
            raise _refused(exc) from None

    # -- messages -----------------------------------------------------------------------------

    async def _send(self, params: a2a.SendMessageRequest, call: ServerCallContext) -> TaskFold:
        """The message written to its entity (spawned first if absent); the task it starts."""
        message = params.message
        asking: TaskFold | None = None
        if message.task_id:
            # A message with a taskId answers that task's question (ctx.ask): it is the reply,
            # and the task goes on. Any other task takes no more messages.
            asking = await self._read(call, self._task(call, message.task_id))
            if asking.state != "input-required":
                raise InvalidParamsError(
                    f"taskId: task {message.task_id[:200]!r} is {asking.state}, not input-required: "
                    "only a task waiting for input takes a reply; send without a taskId"
                )
            if message.context_id and message.context_id != asking.context_id:
                raise InvalidParamsError(
                    f"contextId: task {asking.where.task_id!r} is in {asking.context_id!r}"
                )
        texts: list[str] = []
        data: Any = None
        for part in message.parts:
            kind = part.WhichOneof("content")
            if kind == "text":
                texts.append(part.text)
            elif kind == "data" and data is None:
                data = part.data
            else:
                raise ContentTypeNotSupportedError(f"a {kind} part: text parts and one data part are served")
        if asking is not None:
            type_, id_ = asking.where.type, asking.where.id
        else:
            type_, id_ = self._entity(call, message.context_id or new_context_id())
        request = api.SendMessageRequest(ref=pb.EntityRef(type=type_, id=id_), text="\n".join(texts))
        # What the message does while a run is busy (docs/double-texting.md): the message's
        # metadata may choose, as electric's own send's `policy`, within what its type allows.
        policy = message.metadata.fields.get("policy")
        if policy is not None:
            request.policy = policy.string_value
        if data is not None:
            request.data.CopyFrom(data)
        # The A2A message id keys the write: a client's retry of the same message writes once.
        key = message.message_id
        request.idempotency_key = (
            key if IDEMPOTENCY_KEY_RE.fullmatch(key) else hashlib.sha256(key.encode()).hexdigest()
        )
        try:
            try:
                sent = await self.service.SendMessage(request, door_context())
            except ApiError as exc:
                if exc.reason != "ENTITY_NOT_FOUND":
                    raise
                # A2A's first message makes its context: the entity is spawned, as the type's
                # defaults have it (a spawn that lost a race to another is as good).
                with anyio.CancelScope(shield=True):
                    try:
                        await self.service.SpawnEntity(
                            api.SpawnEntityRequest(ref=request.ref), door_context()
                        )
                    except ApiError as spawned:
                        if spawned.reason != "ENTITY_EXISTS":
                            raise
                sent = await self.service.SendMessage(request, door_context())
        except ApiError as exc:
            if exc.reason == "ENTITY_BUSY" and asking is None:
                # A double-texting `reject` policy refused it (nothing written): a rejected task.
                return rejected(
                    type_, id_, self._context_id(call, TaskRef(type_, id_, 0)), message, exc.message
                )
            raise _refused(exc) from None
        if asking is not None:
            # The reply's record carries the task on (TaskFold.see): its run is the task's now.
            return await read_on(self.service, asking)
        where = TaskRef(type_, id_, sent.offset)
        fold = TaskFold(where, self._context_id(call, where), next_offset=where.offset)
        # The message's own record, as the stream has it (a replayed send's too).
        fold.key, fold.state = sent.key, "submitted"
        fold.at.CopyFrom(sent.created_at)
        fold.user = a2a.Message(
            message_id=sent.key,
            context_id=fold.context_id,
            task_id=where.task_id,
            role=a2a.ROLE_USER,
            parts=message.parts,
        )
        fold.next_offset = where.offset + 1
        return fold

    async def on_message_send(self, params: a2a.SendMessageRequest, context: ServerCallContext) -> a2a.Task:
        fold = await self._send(params, context)
        if not params.configuration.return_immediately:
            async for _ in follow(self.service, fold):
                pass
        return fold.task()

    async def on_message_send_stream(
        self, params: a2a.SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        fold = await self._send(params, context)
        yield fold.task()
        async for event in self._updates(fold):
            yield event

    async def _updates(self, fold: TaskFold) -> AsyncGenerator[Event]:
        """Each change of the task, live, until it ended: its artifact before its last status."""
        async for _event, changed in follow(self.service, fold):
            if not changed:
                continue
            if fold.ended and (artifact := fold.artifact_update()) is not None:
                yield artifact
            yield fold.update()

    # -- tasks --------------------------------------------------------------------------------

    async def on_get_task(self, params: a2a.GetTaskRequest, context: ServerCallContext) -> a2a.Task:
        fold = await self._read(context, self._task(context, params.id))
        return fold.task(params.history_length if params.HasField("history_length") else None)

    async def on_list_tasks(
        self, params: a2a.ListTasksRequest, context: ServerCallContext
    ) -> a2a.ListTasksResponse:
        size = min(params.page_size or 50, 100)
        if not params.context_id:
            folds, token = await self._all_messages(params.page_token, size, context)
        else:
            type_, id_ = self._entity(context, params.context_id)
            if params.page_token and not params.page_token.isdigit():
                raise InvalidParamsError(
                    "pageToken: not one this server gave (pass next_page_token as it came)"
                )
            start = int(params.page_token or 0)
            folds = await self._messages(type_, id_, start, size, context)
            token = str(folds[-1].where.offset + 1) if len(folds) == size else ""
        wanted = params.status if params.status else None
        tasks = [f.task(params.history_length if params.HasField("history_length") else None) for f in folds]
        tasks = [t for t in tasks if wanted is None or t.status.state == wanted]
        return a2a.ListTasksResponse(tasks=tasks, next_page_token=token, page_size=size)

    async def _all_messages(
        self, page_token: str, size: int, call: ServerCallContext
    ) -> tuple[list[TaskFold], str]:
        """Without a contextId: the tasks of every entity of the agent's type (the root agent's:
        of every type), entity by entity as ``ListEntities`` orders them, each in stream order;
        and the next page's token ("" none), which says where it goes on."""
        entities_token, resume, offset = _AllTasks.parse(page_token)
        folds: list[TaskFold] = []
        while True:
            request = api.ListEntitiesRequest(
                type=_agent_type(call), page_size=100, page_token=entities_token
            )
            try:
                page = await self.service.ListEntities(request, door_context())
            except ApiError as exc:
                raise _refused(exc) from None
            for entity in page.entities:
                name = f"{entity.ref.type}/{entity.ref.id}"
                if resume:  # the page goes on at this entity (past those listed before it)
                    if name != resume:
                        continue
                    resume = ""
                else:
                    offset = 0
                left = size - len(folds)
                found = await self._messages(entity.ref.type, entity.ref.id, offset, left, call)
                folds += found
                if len(found) == left:
                    return folds, _AllTasks.token(entities_token, name, found[-1].where.offset + 1)
            if not page.next_page_token:
                return folds, ""
            entities_token = page.next_page_token

    async def _messages(
        self, type_: str, id_: str, start: int, size: int, call: ServerCallContext
    ) -> list[TaskFold]:
        """The first ``size`` messages from ``start`` on, each task folded to the head."""
        folds: list[TaskFold] = []
        offset = start
        ref = pb.EntityRef(type=type_, id=id_)
        while True:
            try:
                page = await self.service.ReadEvents(
                    api.ReadEventsRequest(ref=ref, from_offset=offset, limit=1000), door_context()
                )
            except ApiError as exc:
                raise _refused(exc) from None
            for event in page.events:
                if event.WhichOneof("value") == "message" and len(folds) < size:
                    where = TaskRef(type_, id_, event.offset)
                    folds.append(TaskFold(where, self._context_id(call, where), next_offset=event.offset))
                for fold in folds:
                    if event.offset >= fold.where.offset:
                        fold.see(event)
            if not page.events or page.next_offset >= page.head_offset:
                return folds
            offset = page.next_offset

    async def on_cancel_task(self, params: a2a.CancelTaskRequest, context: ServerCallContext) -> a2a.Task:
        where = self._task(context, params.id)
        fold = await self._read(context, where)
        if fold.ended:
            raise TaskNotCancelableError(f"task {params.id!r} has ended: {fold.state}")
        # Answered once the run is unwound ("Stopped means stopped"): the service's own wait
        # (core/signal_answers.py), then the task read on from where its read stopped.
        request = api.SignalEntityRequest(
            ref=where.ref,
            signal=pb.SIGNAL_SIGINT,
            message_key=fold.key,
            reason="A2A CancelTask",
            wait=Stage.UNWOUND.value,
            timeout=duration_from_ms(round(CANCEL_WAIT_S * 1000)),
        )
        try:
            await self.service.SignalEntity(request, door_context())
        except ApiError as exc:
            raise _refused(exc) from None
        return (await read_on(self.service, fold)).task()

    async def on_subscribe_to_task(
        self, params: a2a.SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        fold = await self._read(context, self._task(context, params.id))
        if fold.ended:  # as the SDK's own handler answers: nothing more will come
            raise UnsupportedOperationError(f"task {params.id!r} has ended: {fold.state} (GetTask reads it)")
        yield fold.task()
        async for event in self._updates(fold):
            yield event

    # -- not served ---------------------------------------------------------------------------

    async def on_create_task_push_notification_config(
        self, params: a2a.TaskPushNotificationConfig, context: ServerCallContext
    ) -> a2a.TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError("push notifications are not served: SubscribeToTask")

    async def on_get_task_push_notification_config(
        self, params: a2a.GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> a2a.TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError("push notifications are not served: SubscribeToTask")

    async def on_list_task_push_notification_configs(
        self, params: a2a.ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> a2a.ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError("push notifications are not served: SubscribeToTask")

    async def on_delete_task_push_notification_config(
        self, params: a2a.DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError("push notifications are not served: SubscribeToTask")

    async def on_get_extended_agent_card(
        self, params: a2a.GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> a2a.AgentCard:
        raise ExtendedAgentCardNotConfiguredError("no extended agent card: the card is the public one")
