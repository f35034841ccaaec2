"""An A2A task read from the entity's stream: nothing about a task is kept anywhere else.

A task is the run of one message. Its id names the entity and the message record's offset,
``TYPE~ID~OFFSET`` (``~`` is in no name, and HTTP+JSON's ``/tasks/{id}:cancel`` keeps it whole),
so a task is found without an index, by any replica, after any restart. Its context is the
entity. ``TaskFold`` folds the records from the message's own on, as ``states.py`` says, and
renders the SDK's ``Task``; the same fold feeds a stream's updates.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

from a2a.types import a2a_pb2 as a2a
from a2a.utils.errors import TaskNotFoundError
from google.protobuf import timestamp_pb2

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.enums import PB_TO_STATE, RUN_STATUS_NAMES

from ..core.errors import ApiError, DoorContext
from ..core.service import EntityService
from ..core.validation import NAME_RE
from .states import ENDED, INTERRUPTED, refused_state, state_of

__all__ = ["TaskFold", "TaskRef", "door_context", "follow", "read_on", "read_task", "rejected", "task_ref"]

SEP = "~"
_PAGE = 1000


@dataclass(frozen=True)
class TaskRef:
    type: str
    id: str
    offset: int  # the message record's offset in the entity's stream

    @property
    def task_id(self) -> str:
        return f"{self.type}{SEP}{self.id}{SEP}{self.offset}"

    @property
    def ref(self) -> pb.EntityRef:
        return pb.EntityRef(type=self.type, id=self.id)


@dataclass(frozen=True)
class RefusedRef(TaskRef):
    """A task whose message was refused: never in the stream, so no offset names it; its id
    names the refused message instead (GetTask finds no such task: nothing was written)."""

    message_id: str = ""

    @property
    def task_id(self) -> str:
        digest = hashlib.sha256(self.message_id.encode()).hexdigest()[:16]
        return f"{self.type}{SEP}{self.id}{SEP}rejected-{digest}"


def rejected(type_: str, id_: str, context_id: str, message: a2a.Message, why: str) -> TaskFold:
    """A message a double-texting ``reject`` policy refused: a rejected task, the refusal's
    text as its status message."""
    fold = TaskFold(RefusedRef(type_, id_, 0, message.message_id), context_id)
    fold.key, fold.state, fold.detail = message.message_id, refused_state("reject"), why
    fold.at.GetCurrentTime()
    fold.user = a2a.Message()
    fold.user.CopyFrom(message)
    fold.user.task_id, fold.user.context_id = fold.where.task_id, context_id
    return fold


def task_ref(task_id: str) -> TaskRef:
    """The task an id names: TaskNotFoundError for an id no task could have."""
    type_, _, rest = task_id.partition(SEP)
    id_, _, offset = rest.partition(SEP)
    if not (NAME_RE.fullmatch(type_) and NAME_RE.fullmatch(id_) and offset.isdigit() and len(offset) < 20):
        raise TaskNotFoundError(f"no task {task_id[:200]!r}: a task id is TYPE~ID~OFFSET")
    return TaskRef(type_, id_, int(offset))


def a2a_state(name: str) -> a2a.TaskState:
    return cast(a2a.TaskState, a2a.TaskState.Value("TASK_STATE_" + name.upper().replace("-", "_")))


def _run_status(run: pb.RunValue) -> str:
    return RUN_STATUS_NAMES.get(run.status, "unspecified")


@dataclass
class TaskFold:
    """One task's state, folded from its message's record on (``see`` each record in order)."""

    where: TaskRef
    context_id: str
    key: str = ""  # the message's key ("" until its record is seen)
    state: str = ""
    detail: str = ""  # the status message's text: a step's name, an error, why it was canceled
    output: str = ""
    user: a2a.Message | None = None
    at: timestamp_pb2.Timestamp = field(default_factory=timestamp_pb2.Timestamp)
    next_offset: int = 0  # the next record to see

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def waiting(self) -> bool:
        """Ended or waiting for its client (input-required): a stream of it ends here."""
        return self.state in ENDED or self.state in INTERRUPTED

    def see(self, event: pb.Event) -> bool:
        """Fold ``event``: True when the task's state or status message changed."""
        self.next_offset = event.offset + 1
        if self.ended:
            return False
        kind = event.WhichOneof("value")
        if not self.key:
            if event.offset != self.where.offset or kind != "message":
                raise TaskNotFoundError(f"no task {self.where.task_id!r}: no message at that offset")
            self.key = event.key
            self.user = self._user_message(event.message)
            return self._to(state_of("message", ""), "", event)
        if kind == "message" and event.message.reply.ask_key == self.key and self.key:
            # The reply to the task's question: its run resumes the asking run, under its key.
            self.key = event.key
            return self._to(state_of("reply", ""), "", event)
        if kind == "run" and event.run.message_key == self.key:
            status = _run_status(event.run)
            if event.run.output:
                self.output = event.run.output
            detail = event.run.step if status == "step" else event.run.error
            if status == "input_required":
                detail = event.run.question
            elif status == "steered":
                detail = f"steered the run of {event.run.steered_into} at its step {event.run.steered_step}"
            return self._to(state_of("run", status), detail, event)
        if kind == "state":
            name = PB_TO_STATE[event.state.state].value
            return self._to(state_of("state", name), f"the entity {name} ({event.state.cause})", event)
        return False

    def _to(self, state: str | None, detail: str, event: pb.Event) -> bool:
        if state is None or (state == self.state and detail == self.detail):
            return False
        self.state, self.detail = state, detail
        self.at.CopyFrom(event.headers.timestamp)
        return True

    def _user_message(self, value: pb.MessageValue) -> a2a.Message:
        parts = [a2a.Part(text=value.text)] if value.text else []
        if value.HasField("data"):
            parts.append(a2a.Part(data=value.data))
        return a2a.Message(
            message_id=self.key,
            context_id=self.context_id,
            task_id=self.where.task_id,
            role=a2a.ROLE_USER,
            parts=parts,
        )

    def status(self) -> a2a.TaskStatus:
        status = a2a.TaskStatus(state=a2a_state(self.state or "submitted"), timestamp=self.at)
        text = self.output if self.state == "completed" else self.detail
        if text:
            status.message.CopyFrom(
                a2a.Message(
                    message_id=f"{self.key}.{self.state}",
                    context_id=self.context_id,
                    task_id=self.where.task_id,
                    role=a2a.ROLE_AGENT,
                    parts=[a2a.Part(text=text)],
                )
            )
        return status

    def artifact(self) -> a2a.Artifact | None:
        """The run's output, once it completed (partial output stays in the entity's stream)."""
        if self.state != "completed" or not self.output:
            return None
        return a2a.Artifact(artifact_id="output", name="output", parts=[a2a.Part(text=self.output)])

    def task(self, history_length: int | None = None) -> a2a.Task:
        task = a2a.Task(id=self.where.task_id, context_id=self.context_id, status=self.status())
        if self.user is not None and history_length != 0:
            task.history.append(self.user)
        if (artifact := self.artifact()) is not None:
            task.artifacts.append(artifact)
        return task

    def update(self) -> a2a.TaskStatusUpdateEvent:
        return a2a.TaskStatusUpdateEvent(
            task_id=self.where.task_id, context_id=self.context_id, status=self.status()
        )

    def artifact_update(self) -> a2a.TaskArtifactUpdateEvent | None:
        artifact = self.artifact()
        if artifact is None:
            return None
        return a2a.TaskArtifactUpdateEvent(
            task_id=self.where.task_id, context_id=self.context_id, artifact=artifact, last_chunk=True
        )


def door_context(peer: str = "a2a") -> Any:
    return cast(Any, DoorContext(peer))


async def read_task(service: EntityService, where: TaskRef, context_id: str) -> TaskFold:
    """The task as the stream has it now: read from its message on until it ended or the head."""
    fold = await read_on(service, TaskFold(where, context_id, next_offset=where.offset))
    if not fold.key:
        raise TaskNotFoundError(f"no task {where.task_id!r}: no message at that offset")
    return fold


async def read_on(service: EntityService, fold: TaskFold) -> TaskFold:
    """``fold`` brought up to the stream's head (or its end), from ``fold.next_offset``."""
    while not fold.ended:
        request = api.ReadEventsRequest(ref=fold.where.ref, from_offset=fold.next_offset, limit=_PAGE)
        try:
            page = await service.ReadEvents(request, door_context())
        except ApiError as exc:
            if exc.reason == "ENTITY_NOT_FOUND":
                raise TaskNotFoundError(f"no task {fold.where.task_id!r}: {exc.message}") from None
            raise
        for event in page.events:
            fold.see(event)
            if fold.ended:
                break
        if not page.events or page.next_offset >= page.head_offset:
            break
        fold.next_offset = page.next_offset
    return fold


async def follow(
    service: EntityService, fold: TaskFold, *, until_ended: bool = True
) -> AsyncIterator[tuple[pb.Event, bool]]:
    """The entity's records from ``fold.next_offset`` on, live, each folded before it is yielded
    with whether it changed the task; ends once the task ended or waits for its client
    (``until_ended``; input-required), or the stream closed."""
    if fold.waiting and until_ended:
        return
    request = api.WatchEventsRequest(ref=fold.where.ref, from_offset=fold.next_offset, accepts_batches=True)
    stream = cast(AsyncGenerator[Any, None], service.WatchEvents(request, door_context()))
    try:
        async for item in stream:
            message = api.WatchEventsResponse.FromString(item) if isinstance(item, bytes) else item
            kind = message.WhichOneof("item")
            if kind == "end_of_stream":
                return
            for event in message.events.events if kind == "events" else [message.event]:
                changed = fold.see(event)
                yield event, changed
                if fold.waiting and until_ended:
                    return
    finally:
        await stream.aclose()


def new_context_id() -> str:
    """An entity id for a message sent without a context: A2A's server makes the context."""
    return f"a2a-{uuid.uuid4().hex}"
