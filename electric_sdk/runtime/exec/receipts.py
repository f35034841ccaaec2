"""Exec receipts: building the ``exec`` events a host writes, writing them in the order of its
acts (``ReceiptLog``), and reading back from an entity's stream which generation it last started
and whether that generation's end was recorded."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import anyio

from ..._proto.electric.v1 import types_pb2 as pb
from ..._wire.enums import EXEC_ACTION_BY_NAME, EXEC_DISPOSITION_BY_NAME
from ..._wire.exec_receipts import generation_running
from ..._wire.times import timestamp_from_datetime
from ...models import Event
from ..fenced import FINAL_WRITE_TIMEOUT_S, Fenced
from .evidence import Evidence

__all__ = ["ReceiptLog", "Stored", "build", "stored_generation"]

log = logging.getLogger("electric.runtime.exec")


def build(
    task_id: str,
    backend: str,
    action: str,
    disposition: str,
    *,
    evidence: Evidence | None = None,
    name: str = "",
    reason: str = "",
    signal_key: str = "",
    issued_at: datetime | None = None,
    deadline: datetime | None = None,
    policy_timeout: timedelta | None = None,
    escalated: bool = False,
    group: bool = False,
    exit_status: int | None = None,
    tags: list[str] | None = None,
) -> pb.ExecReceipt:
    receipt = pb.ExecReceipt(
        task_id=task_id,
        action=EXEC_ACTION_BY_NAME[action],
        action_name=name,
        disposition=EXEC_DISPOSITION_BY_NAME[disposition],
        escalated=escalated,
        reason=reason,
        backend=backend,
        signal_key=signal_key,
        group=group,
        tags=tags or [],
    )
    if evidence is not None:
        receipt.generation.CopyFrom(evidence.to_pb())
    if issued_at is not None:
        receipt.issued_at.CopyFrom(timestamp_from_datetime(issued_at))
    if deadline is not None:
        receipt.deadline.CopyFrom(timestamp_from_datetime(deadline))
    if policy_timeout is not None:
        receipt.timeout.FromTimedelta(policy_timeout)
    if exit_status is not None:
        receipt.exit_status = exit_status
    return receipt


class ReceiptLog:
    """One exec host's receipts, written in the order of its acts, even while cancelled."""

    __slots__ = ("_backend", "_fenced", "_order", "_task_id")

    def __init__(self, task_id: str, backend: str, fenced: Fenced) -> None:
        self._task_id, self._backend, self._fenced = task_id, backend, fenced
        self._order = anyio.Lock()

    async def write(self, action: str, disposition: str, **fields: Any) -> None:
        """Write an ``exec`` receipt (``build`` names the fields), even while cancelled."""
        receipt = build(self._task_id, self._backend, action, disposition, **fields)
        name, reason = fields.get("name", ""), fields.get("reason", "")
        log.info("%s: exec %s %s %s %s", self._task_id, action, name, disposition, reason)
        # One at a time, so they land in the order of the acts: a receipt refused because the state
        # moved (a SIGKILL during a SIGTERM's) is retried, and must not land after the receipt of an
        # act that came after its own. Each write keeps its own bound; the wait for the lock is
        # bounded by the writes before it.
        with anyio.CancelScope(shield=True):
            async with self._order:
                with anyio.move_on_after(FINAL_WRITE_TIMEOUT_S):
                    await self._fenced.write(retry=True, exec=receipt)


@dataclass(frozen=True)
class Stored:
    """What an entity's stream says of its newest generation."""

    newest: int  # the highest generation number started (0: none)
    started: Evidence | None  # the newest generation's evidence
    ended: bool  # its end was recorded: an exit, or a recovery that found it gone
    exit_status: int | None
    # The last graceful action issued to it, as (its name, its deadline): a worker that takes it
    # over does not send it again (shutdown.py).
    graceful: tuple[str, datetime] | None = None


def stored_generation(history: list[Event]) -> Stored:
    newest, started, ended, status = 0, None, False, None
    graceful: tuple[str, datetime] | None = None
    for event in history:
        if event.type != "exec":
            continue
        value = event.value
        running = generation_running(value.get("action", ""), value.get("disposition", ""))
        mine = started is not None and (value.get("generation") or {}).get("generation") == started.generation
        if value.get("action") == "start" and running and value.get("generation"):
            started, ended, status, graceful = Evidence.from_json(value["generation"]), False, None, None
            newest = max(newest, started.generation)
        elif running is False and mine:
            ended, status = True, value.get("exit_status")
        elif (
            mine
            and (value.get("action"), value.get("disposition")) == ("graceful", "issued")
            and value.get("deadline")
        ):
            graceful = (str(value.get("action_name", "")), datetime.fromisoformat(value["deadline"]))
    return Stored(newest, started, ended, status, graceful)
