"""The stop-stage fold (``_wire/stop_stages.py``) on streams as the server writes them: each
stage at the record that shows it, in every order those records come in."""

from __future__ import annotations

import pytest

from electric_sdk._wire.stop_stages import StageFollow, parse_stage
from electric_sdk.lifecycle import (
    STAGES,
    Outcome,
    Signal,
    Stage,
    StageUnavailable,
    State,
    check_stage,
    stages_of,
)

AT = "2026-12-06T00:00:00.000Z"


def test_every_signal_has_accepted_and_the_stops_have_unwound() -> None:
    for signal in Signal:
        assert stages_of(signal)[0] is Stage.ACCEPTED
    assert {s for s in Signal if Stage.UNWOUND in stages_of(s)} == {
        Signal.SIGINT,
        Signal.SIGTERM,
        Signal.SIGKILL,
    }
    assert list(STAGES) == list(Stage)  # the table's order is the order stages are reached
    with pytest.raises(
        StageUnavailable, match="SIGUSR has no stage 'unwound'; its stages: accepted, handled"
    ):
        check_stage(Signal.SIGUSR, Stage.UNWOUND)
    with pytest.raises(ValueError, match="unknown stage 'soon'"):
        parse_stage(Signal.SIGTERM, "soon")


def test_sigterm_whose_grace_ran_out_is_unwound_at_the_later_of_stopped_and_the_run_end() -> None:
    follow = StageFollow(Signal.SIGTERM, "sig_5", 5, AT, Stage.TERMINAL, run_message_key="msg_1")
    follow.see("state", "st_6", {"state": "stopping"}, 6, AT)
    follow.see("state", "st_7", {"state": "stopped", "cause": "grace_expired"}, 7, AT)
    assert follow.reports[Stage.TERMINAL].offset == 7
    assert not follow.reports[Stage.UNWOUND].reached  # the run's end is still to come
    assert not follow.done
    follow.see("run", "run_8", {"message_key": "msg_1", "status": "aborted"}, 8, AT)
    assert follow.reports[Stage.UNWOUND].offset == 8
    assert follow.done
    assert "cancelled unrecorded" in follow.reports[Stage.DOWNSTREAM].detail  # cut by the deadline


def test_a_scoped_sigint_to_a_queued_message_is_unwound_at_once() -> None:
    follow = StageFollow(
        Signal.SIGINT, "sig_9", 9, AT, Stage.UNWOUND, run_message_key="msg_1", message_key="msg_4"
    )
    assert follow.done
    assert follow.reports[Stage.UNWOUND].offset == 9
    assert follow.reports[Stage.UNWOUND].detail == "message msg_4 was not the run in progress"


def test_a_signal_that_found_no_run_says_so_where_it_is_unwound() -> None:
    idle = StageFollow(Signal.SIGINT, "sig_3", 3, AT, Stage.UNWOUND)
    assert idle.done
    assert (idle.reports[Stage.UNWOUND].offset, idle.reports[Stage.UNWOUND].detail) == (
        3,
        "no run was in progress",
    )
    scoped = StageFollow(Signal.SIGINT, "sig_4", 4, AT, Stage.UNWOUND, message_key="msg_2")
    assert scoped.reports[Stage.UNWOUND].detail == "message msg_2 was not running"
    # SIGTERM with no run: unwound once the cleanup ended (stopped), still saying no run ran.
    term = StageFollow(Signal.SIGTERM, "sig_5", 5, AT, Stage.UNWOUND)
    assert not term.done
    term.see("state", "st_6", {"state": "stopped"}, 6, AT)
    assert (term.reports[Stage.UNWOUND].offset, term.reports[Stage.UNWOUND].detail) == (
        6,
        "no run was in progress",
    )
    # A run in progress: its end record, with nothing to explain.
    running = StageFollow(Signal.SIGINT, "sig_7", 7, AT, Stage.UNWOUND, run_message_key="msg_1")
    running.see("run", "run_8", {"message_key": "msg_1", "status": "aborted"}, 8, AT)
    assert (running.reports[Stage.UNWOUND].offset, running.reports[Stage.UNWOUND].detail) == (8, "")


def test_an_undelivered_sigusr_is_never_handled_and_a_lost_worker_is_named() -> None:
    follow = StageFollow(Signal.SIGUSR, "sig_3", 3, AT, Stage.HANDLED)
    follow.see("signal", "sig_3", {"outcome": "ignored", "detail": "the entity is paused"}, 3, AT)
    assert follow.done
    assert not follow.reached
    assert follow.reports[Stage.HANDLED].detail == "not delivered (ignored): the entity is paused"
    lost = StageFollow(Signal.SIGINT, "sig_3", 3, AT, Stage.UNWOUND, run_message_key="msg_1")
    lost.see("state", "st_4", {"state": "idle", "cause": "runtime_lost"}, 4, AT)
    assert lost.done
    assert lost.reports[Stage.UNWOUND].detail == "the worker was lost"
    lost.see("run", "run_5", {"message_key": "msg_1", "status": "aborted"}, 5, AT)  # written later after all
    assert lost.reports[Stage.UNWOUND].reached


def _mcp(call: str, phase: str, run: str = "msg_1", reason: str = "") -> dict[str, object]:
    data = {"run": run, "call": call, "server": "tools", "tool": "slow", "phase": phase, "reason": reason}
    return {"data": data}


def test_downstream_waits_for_every_mcp_call_of_the_run_and_names_each() -> None:
    follow = StageFollow(Signal.SIGINT, "sig_5", 5, AT, Stage.DOWNSTREAM, run_message_key="msg_1")
    follow.see("electric.mcp", "e_6", _mcp("a", "started"), 6, AT)  # a second call, started late
    follow.see("electric.mcp", "e_7", _mcp("b", "cancelled", reason="SIGINT"), 7, AT)
    follow.see("electric.mcp", "e_8", _mcp("c", "ended", run="msg_0"), 8, AT)  # another run's
    follow.see("run", "run_9", {"message_key": "msg_1", "status": "aborted"}, 9, AT)
    assert follow.reports[Stage.UNWOUND].offset == 9
    assert not follow.reports[Stage.DOWNSTREAM].reached  # call a has not ended
    follow.see("electric.mcp", "e_10", _mcp("a", "bound_passed"), 10, AT)
    report = follow.reports[Stage.DOWNSTREAM]
    assert report.offset == 10
    assert report.detail == "MCP tools/slow bound_passed; MCP tools/slow cancelled (SIGINT)"
    assert follow.done


def test_a_killed_run_reaches_downstream_with_its_end_and_says_its_calls_are_unrecorded() -> None:
    follow = StageFollow(Signal.SIGKILL, "sig_5", 5, AT, Stage.DOWNSTREAM, run_message_key="msg_1")
    follow.see("run", "run_6", {"message_key": "msg_1", "status": "aborted"}, 6, AT)
    assert follow.reports[Stage.DOWNSTREAM].reached
    assert "cancelled unrecorded" in follow.reports[Stage.DOWNSTREAM].detail


def _child(phase: str, run: str = "msg_1", **more: object) -> dict[str, object]:
    return {"data": {"phase": phase, "run": run, **more}}


def test_a_sigints_downstream_waits_for_the_servers_told_record_of_the_runs_children() -> None:
    follow = StageFollow(Signal.SIGINT, "sig_5", 5, AT, Stage.DOWNSTREAM, run_message_key="msg_1")
    follow.see("electric.child", "e_6", _child("interrupting", run="msg_0"), 6, AT)  # another run's
    follow.see("electric.child", "e_7", _child("interrupting"), 7, AT)
    follow.see("run", "run_8", {"message_key": "msg_1", "status": "aborted"}, 8, AT)
    assert follow.reports[Stage.UNWOUND].offset == 8
    assert not follow.reports[Stage.DOWNSTREAM].reached  # its children are not told yet
    children = [
        {"child": "/helper/a", "message": "msg_3", "signal": "SIGINT", "outcome": "aborted", "detail": "x"},
        {"child": "/other/b", "message": "", "outcome": "not signalled", "detail": "not a child"},
    ]
    follow.see("electric.child", "e_9", _child("told", children=children), 9, AT)
    report = follow.reports[Stage.DOWNSTREAM]
    assert report.offset == 9
    assert report.detail == "children: /helper/a SIGINT aborted (x); /other/b not signalled (not a child)"


def test_a_sigterms_children_settle_by_their_end_or_the_parents_grace_deadline() -> None:
    told = [
        {"child": "/helper/a", "signal": "SIGTERM", "outcome": "transitioned", "state": "stopping"},
        {"child": "/helper/b", "signal": "SIGTERM", "outcome": "transitioned", "state": "stopping"},
    ]
    for cause, reached in (("cleanup_done", False), ("grace_expired", True)):
        follow = StageFollow(Signal.SIGTERM, "sig_5", 5, AT, Stage.DOWNSTREAM, run_message_key="msg_1")
        follow.see("electric.child", "e_6", _child("interrupting"), 6, AT)
        follow.see("run", "run_7", {"message_key": "msg_1", "status": "aborted"}, 7, AT)
        follow.see("electric.child", "e_8", _child("told", children=told), 8, AT)
        follow.see(
            "electric.child",
            "e_9",
            {"data": {"phase": "ended", "child": "/helper/a", "state": "stopped"}},
            9,
            AT,
        )
        assert not follow.reports[Stage.DOWNSTREAM].reached  # /helper/b is still stopping
        follow.see("state", "st_10", {"state": "stopped", "cause": cause}, 10, AT)
        assert follow.reports[Stage.DOWNSTREAM].reached is reached
        if reached:
            assert "/helper/a SIGTERM transitioned, ended stopped" in follow.reports[Stage.DOWNSTREAM].detail
            assert (
                "/helper/b SIGTERM transitioned, its bound passed" in follow.reports[Stage.DOWNSTREAM].detail
            )
        else:
            follow.see(
                "electric.child",
                "e_11",
                {"data": {"phase": "ended", "child": "/helper/b", "state": "stopped"}},
                11,
                AT,
            )
            assert follow.reports[Stage.DOWNSTREAM].offset == 11


def test_a_sigkills_children_are_said_killed_by_the_cascade_when_unrecorded() -> None:
    follow = StageFollow(Signal.SIGKILL, "sig_5", 5, AT, Stage.DOWNSTREAM, run_message_key="msg_1")
    follow.see("electric.child", "e_6", _child("interrupting"), 6, AT)
    follow.see("run", "run_7", {"message_key": "msg_1", "status": "aborted"}, 7, AT)
    assert follow.reports[Stage.DOWNSTREAM].reached
    assert "killed by the server's cascade" in follow.reports[Stage.DOWNSTREAM].detail


def test_a_signal_the_table_ignored_is_settled_at_once() -> None:
    """Its own record says `ignored`: what only it would have brought about never comes, so the
    answer says so at once instead of waiting out its bound (or, with none, forever)."""
    term = StageFollow(
        Signal.SIGTERM, "sig_1", 1, AT, Stage.TERMINAL, outcome=Outcome.IGNORED, state=State.SPAWNING
    )
    assert term.done
    assert not term.reached
    assert term.reports[Stage.TERMINAL].detail == "SIGTERM in spawning is ignored"
    assert term.reports[Stage.UNWOUND].detail == "SIGTERM in spawning is ignored"
    assert term.reports[Stage.REAPED].reached  # no process was running: that much is true
    usr = StageFollow(Signal.SIGUSR, "sig_2", 2, AT, Stage.HANDLED, outcome=Outcome.IGNORED, state=State.IDLE)
    assert usr.done
    assert not usr.reached
    assert usr.reports[Stage.HANDLED].detail == "not delivered: SIGUSR in idle is ignored (not processing)"
    # A SIGINT to a cleanup in progress is ignored: the run's end, when it comes, is not its doing.
    cleanup = StageFollow(
        Signal.SIGINT,
        "sig_3",
        3,
        AT,
        Stage.UNWOUND,
        run_message_key="msg_1",
        outcome=Outcome.IGNORED,
        state=State.STOPPING,
    )
    assert cleanup.done
    assert not cleanup.reached
    assert cleanup.reports[Stage.UNWOUND].detail == "SIGINT in stopping is ignored"
    # With no run in progress an ignored SIGINT has nothing to unwind: reached, as before.
    idle = StageFollow(
        Signal.SIGINT, "sig_4", 4, AT, Stage.DOWNSTREAM, outcome=Outcome.IGNORED, state=State.IDLE
    )
    assert idle.done
    assert idle.reached
    assert idle.reports[Stage.UNWOUND].detail == "no run was in progress"


def test_a_sigterm_to_an_entity_already_stopping_follows_the_stop_under_way() -> None:
    follow = StageFollow(
        Signal.SIGTERM,
        "sig_5",
        5,
        AT,
        Stage.TERMINAL,
        run_message_key="msg_1",
        outcome=Outcome.IGNORED,
        state=State.STOPPING,
    )
    assert not follow.done
    follow.see("run", "run_6", {"message_key": "msg_1", "status": "aborted"}, 6, AT)
    follow.see("state", "st_7", {"state": "stopped", "cause": "cleanup_done"}, 7, AT)
    assert follow.done
    assert follow.reached
    assert follow.reports[Stage.UNWOUND].offset == 7
