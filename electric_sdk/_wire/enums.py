"""The lifecycle's enums and the wire's other enums, to and from their wire values.

Lookup tables, built once: they run for every signal the server judges and for
every event a watch delivers. A wire value the table does not know (zero, the
``UNSPECIFIED`` of every wire enum, or one from a newer peer) reads as None, or
as ``"unspecified"`` for the enums the RFC's JSON names by text.
"""

from __future__ import annotations

from collections.abc import Iterable

from .._proto.electric.v1 import types_pb2 as pb
from ..lifecycle import Outcome, Signal, State

__all__ = [
    "EXEC_ACTION_BY_NAME",
    "EXEC_ACTION_NAMES",
    "EXEC_DISPOSITION_BY_NAME",
    "EXEC_DISPOSITION_NAMES",
    "OPERATION_NAMES",
    "OUTCOME_TO_PB",
    "PB_TO_OUTCOME",
    "PB_TO_SIGNAL",
    "PB_TO_STATE",
    "RUN_STATUS_NAMES",
    "SIGNAL_TO_PB",
    "STATE_TO_PB",
    "outcome_from_pb",
    "outcome_to_pb",
    "signal_from_pb",
    "signal_to_pb",
    "state_from_pb",
    "state_to_pb",
]

STATE_TO_PB: dict[State, pb.State.ValueType] = {s: pb.State.Value(f"STATE_{s.name}") for s in State}
PB_TO_STATE: dict[int, State] = {v: k for k, v in STATE_TO_PB.items()}
SIGNAL_TO_PB: dict[Signal, pb.Signal.ValueType] = {s: pb.Signal.Value(f"SIGNAL_{s.name}") for s in Signal}
PB_TO_SIGNAL: dict[int, Signal] = {v: k for k, v in SIGNAL_TO_PB.items()}
OUTCOME_TO_PB: dict[Outcome, pb.SignalOutcome.ValueType] = {
    o: pb.SignalOutcome.Value(f"SIGNAL_OUTCOME_{o.name}") for o in Outcome
}
PB_TO_OUTCOME: dict[int, Outcome] = {v: k for k, v in OUTCOME_TO_PB.items()}


def state_from_pb(value: int) -> State | None:
    return PB_TO_STATE.get(value)


def state_to_pb(state: State) -> pb.State.ValueType:
    return STATE_TO_PB[state]


def signal_from_pb(value: int) -> Signal:
    """KeyError for a value that is no signal: the server sets one on every signal it records."""
    return PB_TO_SIGNAL[value]


def signal_to_pb(signal: Signal) -> pb.Signal.ValueType:
    return SIGNAL_TO_PB[signal]


def outcome_from_pb(value: int) -> Outcome | None:
    return PB_TO_OUTCOME.get(value)


def outcome_to_pb(outcome: Outcome) -> pb.SignalOutcome.ValueType:
    return OUTCOME_TO_PB[outcome]


def _names(items: Iterable[tuple[str, int]], prefix: str) -> dict[int, str]:
    """Wire value → the RFC's lower-case name (``OPERATION_INSERT`` → ``insert``); zero left out."""
    return {value: name.removeprefix(prefix).lower() for name, value in items if value}


OPERATION_NAMES = _names(pb.Operation.items(), "OPERATION_")
RUN_STATUS_NAMES = _names(pb.RunStatus.items(), "RUN_STATUS_")
EXEC_ACTION_NAMES = _names(pb.ExecAction.items(), "EXEC_ACTION_")
EXEC_DISPOSITION_NAMES = _names(pb.ExecDisposition.items(), "EXEC_DISPOSITION_")
EXEC_ACTION_BY_NAME: dict[str, pb.ExecAction.ValueType] = {
    name: pb.ExecAction.ValueType(value) for value, name in EXEC_ACTION_NAMES.items()
}
EXEC_DISPOSITION_BY_NAME: dict[str, pb.ExecDisposition.ValueType] = {
    name: pb.ExecDisposition.ValueType(value) for value, name in EXEC_DISPOSITION_NAMES.items()
}
