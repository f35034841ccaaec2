"""What a runtime's fenced write is answered: its checks, its result, and its request id.

A write's request id is kept like an idempotency key scoped to its entity
(``request_key``), with the answer it got (``result_bytes``): a worker that
sends a write again, its answer lost with the connection, gets that first
answer (``replayed``), in the same session or the next, and the write is never
appended twice.
"""

from __future__ import annotations

import hashlib
import logging

from electric_sdk._proto.electric.v1 import runtime_service_pb2 as rt
from electric_sdk._wire.entities import entity_to_pb
from electric_sdk._wire.times import timestamp_from_ms

from ..core import validation as v
from ..core.errors import to_api_error
from ..core.validation import REQUEST_KEY_PREFIX
from ..store.base import Commit, Idempotency, Ref, Store, WriteOutcome
from .writes import Refused

__all__ = [
    "check_write",
    "fill",
    "replayed",
    "request_key",
    "result_bytes",
]

log = logging.getLogger(__name__)


def check_write(write: rt.RuntimeWrite) -> None:
    """The limits of a runtime write's fields (validation.py); what it means is runtime/writes.py's."""
    v.int64(write.epoch, "write.epoch")
    op = write.WhichOneof("op")
    if op == "run":
        v.int64(write.run.message_offset, "write.run.message_offset")
        if write.run.message_key:  # the server's own key (msg_N), echoed: a row's key
            v.name(write.run.message_key, "write.run.message_key")
    elif op == "custom":
        v.json_data(write.custom.data, write.custom.HasField("data"), "write.custom.data")


def request_key(write: rt.RuntimeWrite) -> Idempotency | None:
    """A runtime write's request id as an idempotency key scoped to its entity: a retry of the
    write (its answer lost with the connection) never appends twice. The lease's epoch is part of
    the key: one worker holds it, and numbers its requests without repeating one."""
    if not write.request_id:
        return None
    body = write.SerializeToString(deterministic=True)
    return Idempotency(f"{REQUEST_KEY_PREFIX}{write.epoch} {write.request_id}", hashlib.sha256(body).digest())


def result_bytes(commit: Commit) -> bytes:
    """What an applied runtime write answers, stored for its retries (``_fill`` without the id)."""
    result = rt.WriteResult()
    fill(result, WriteOutcome(commit, None, False))
    return result.SerializeToString()


async def replayed(store: Store, ref: Ref, idem: Idempotency, result: rt.WriteResult) -> bool:
    stored = await store.idempotent_response(ref, idem.key)
    if stored is None or stored[0] != idem.request_hash:
        return False
    replay(result, stored[1])
    return True


def replay(result: rt.WriteResult, response: bytes) -> None:
    request_id = result.request_id
    result.ParseFromString(response)
    result.request_id = request_id


def fill(result: rt.WriteResult, outcome: WriteOutcome | BaseException) -> None:
    if isinstance(outcome, WriteOutcome) and outcome.replayed:
        assert outcome.response is not None
        replay(result, outcome.response)
    elif isinstance(outcome, Refused):
        result.reason, result.message = outcome.reason, outcome.message
        if outcome.entity is not None:
            result.entity.CopyFrom(entity_to_pb(outcome.entity))
    elif (
        isinstance(outcome, BaseException) and (error := to_api_error(outcome)) is not None
    ):  # e.g. DISK_FULL
        result.reason, result.message = error.reason, error.message
    elif isinstance(outcome, BaseException):
        log.error("a runtime write failed: %s", outcome)
        result.reason, result.message = "INTERNAL", f"the write failed: {outcome}"
    else:
        commit = outcome.commit
        assert commit is not None
        assert commit.after is not None
        result.applied = True
        result.entity.CopyFrom(entity_to_pb(commit.after))
        result.txid = commit.txid
        result.created_at.CopyFrom(timestamp_from_ms(commit.timestamp_ms))
