"""What an exec receipt says of its generation: the one reading the worker (which generation it
must re-observe after a restart), the server (whether a stopping entity's process is still
exiting) and ``electric get`` (the process: running, exiting, ended) share."""

from __future__ import annotations

from .._proto.electric.v1 import types_pb2 as pb
from .enums import EXEC_ACTION_NAMES, EXEC_DISPOSITION_NAMES

__all__ = ["generation_running", "receipt_says_running"]


def generation_running(action: str, disposition: str) -> bool | None:
    """True: the receipt's generation runs from here on (it was started, or found running and taken
    over); False: it has ended (its exit, or a recovery that found it gone); None: the receipt says
    nothing new of it (an act on it, a refused start, a recovery that could not prove it either way)."""
    if action == "start":
        return True if disposition == "observed" else None
    if action == "exit":
        return False
    if action == "recover":
        return {"issued": True, "observed": False}.get(disposition)
    return None


def receipt_says_running(receipt: pb.ExecReceipt) -> bool | None:
    """``generation_running`` of a receipt on the wire."""
    return generation_running(
        EXEC_ACTION_NAMES.get(receipt.action, ""), EXEC_DISPOSITION_NAMES.get(receipt.disposition, "")
    )
