"""EntityView, the pure fold behind EntityControl, on wire events: the cases a live test cannot
stage on demand (a worker lost mid-run, a log that starts mid-run)."""

from __future__ import annotations

import pytest

from electric_sdk import Event
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.enums import state_to_pb
from electric_sdk.lifecycle import Signal, State, valid_signals
from electric_sdk.models import EntityRef
from electric_sdk.widgets import EntityView
from electric_sdk.widgets._view import parse_payload

REF = EntityRef("probe", "p1")


def run(offset: int, status: int) -> Event:
    return Event.from_pb(pb.Event(offset=offset, type="run", key="msg_1", run=pb.RunValue(status=status)))


def state(offset: int, new: State, previous: State, cause: str) -> Event:
    value = pb.StateValue(state=state_to_pb(new), previous_state=state_to_pb(previous), cause=cause)
    return Event.from_pb(pb.Event(offset=offset, type="state", key=f"state_{offset}", state=value))


def test_a_run_opens_and_closes() -> None:
    view = EntityView(REF, state=State.RUNNING).apply(run(1, pb.RUN_STATUS_STARTED))
    assert view.run_in_progress
    assert Signal.SIGINT in view.enabled()
    view = view.apply(run(2, pb.RUN_STATUS_COMPLETED))
    assert not view.run_in_progress
    assert view.enabled() == frozenset(valid_signals(State.RUNNING, False))


def test_a_log_that_starts_mid_run_sees_the_run_from_a_step() -> None:
    assert EntityView(REF, state=State.RUNNING).apply(run(7, pb.RUN_STATUS_STEP)).run_in_progress


def test_a_worker_lost_mid_run_leaves_no_run_in_progress() -> None:
    view = EntityView(REF, state=State.RUNNING).apply(run(1, pb.RUN_STATUS_STARTED))
    view = view.apply(state(2, State.IDLE, State.RUNNING, "runtime_lost"))
    assert view.state is State.IDLE
    assert not view.run_in_progress  # the run never ended on the stream, but no run can go on in idle
    assert view.enabled() == frozenset(valid_signals(State.IDLE))


def test_the_log_keeps_the_last_events() -> None:
    view = EntityView(REF, log_size=2, state=State.RUNNING)
    for offset in range(5):
        view = view.apply(run(offset, pb.RUN_STATUS_STEP))
    assert [e.offset for e in view.events] == [3, 4]


def test_an_empty_payload_box_is_no_payload() -> None:
    assert parse_payload("  ") is None
    assert parse_payload('{"focus": "pricing"}') == {"focus": "pricing"}


@pytest.mark.parametrize("bad", ["{", "{'single': 'quotes'}", "focus"])
def test_a_bad_payload_says_why(bad: str) -> None:
    with pytest.raises(ValueError, match="payload is not valid JSON"):
        parse_payload(bad)
