"""EntityView, the pure fold behind EntityControl, on wire events: the cases a live test cannot
stage on demand (a worker lost mid-run, a log that starts mid-run)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from electric_sdk import Event
from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.enums import state_to_pb
from electric_sdk.lifecycle import Signal, State, valid_signals
from electric_sdk.models import Entity, EntityRef
from electric_sdk.widgets import EntityView
from electric_sdk.widgets._table_view import row_html
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


def test_a_run_that_asks_shows_its_question_until_the_next_run() -> None:
    view = EntityView(REF, state=State.RUNNING).apply(run(1, pb.RUN_STATUS_STARTED))
    asked = pb.RunValue(status=pb.RUN_STATUS_INPUT_REQUIRED, question="which city?", ask_step=1)
    view = view.apply(Event.from_pb(pb.Event(offset=2, type="run", key="msg_1", run=asked)))
    assert not view.run_in_progress
    assert view.status_text() == "awaiting input: which city?"
    view = view.apply(run(3, pb.RUN_STATUS_STARTED))  # the reply's run
    assert view.status_text() == "run in progress"


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


def test_a_run_waiting_for_its_code_is_shown_beside_the_state() -> None:
    raw = pb.Entity(
        ref=pb.EntityRef(type="research", id="r1"), state=state_to_pb(State.IDLE), bound_code_version="1.9.0"
    )
    raw.waiting_since.GetCurrentTime()
    waiting = Entity.from_pb(raw)
    assert waiting.waiting_for_code == "1.9.0"
    assert "waiting for code 1.9.0" in row_html(waiting, frozenset({"research"}), datetime.now(UTC))
    assert EntityView(waiting.ref).with_entity(waiting).status_text() == "waiting for code 1.9.0"
    raw.ClearField("waiting_since")  # bound, but held by a worker: it does not wait
    running = Entity.from_pb(raw)
    assert running.waiting_for_code is None
    assert "waiting for code" not in row_html(running, frozenset({"research"}), datetime.now(UTC))
