"""electric_sdk/busy.py: every (type policy, message choice, busy or not) cell of the rule."""

from __future__ import annotations

import itertools

import pytest

from electric_sdk import busy
from electric_sdk.busy import ALWAYS_CHOOSABLE, DEFAULT_POLICY, BusyPolicy, PolicyNotAllowed, applied


@pytest.mark.parametrize(
    ("own", "requested", "extra", "running"),
    list(
        itertools.product(
            [*BusyPolicy, None],
            [*BusyPolicy, None],
            [frozenset(), frozenset({BusyPolicy.INTERRUPT, BusyPolicy.STEER})],
            [True, False],
        )
    ),
)
def test_every_cell(
    own: BusyPolicy | None, requested: BusyPolicy | None, extra: frozenset[BusyPolicy], running: bool
) -> None:
    type_policy = own.value if own is not None else ""
    effective_own = own or DEFAULT_POLICY
    allowed = requested is None or requested in {*ALWAYS_CHOOSABLE, effective_own, *extra}
    if not allowed:
        with pytest.raises(PolicyNotAllowed, match="does not let a message choose"):
            applied(type_policy, busy.choices_text(extra), requested, running)
        return
    got = applied(type_policy, busy.choices_text(extra), requested, running)
    if not running:
        assert got is BusyPolicy.ENQUEUE  # no run in progress: every policy enqueues
    else:
        assert got is (requested or effective_own)


def test_names_are_checked() -> None:
    assert busy.parse("") is None
    assert busy.parse("steer") is BusyPolicy.STEER
    with pytest.raises(ValueError, match="unknown busy policy 'shout'"):
        busy.parse("shout")
    with pytest.raises(ValueError, match="empty"):
        busy.parse_choices(["interrupt", ""])
    assert busy.choices_text([BusyPolicy.STEER, "interrupt", "steer"]) == "interrupt,steer"


def test_a_rollback_sigint_is_told_from_any_other() -> None:
    assert busy.rollback_requested({"on_busy": "rollback", "message": "msg_1"})
    assert not busy.rollback_requested({"on_busy": "interrupt"})
    assert not busy.rollback_requested(None)
    assert (
        busy.signal_reason(BusyPolicy.INTERRUPT, "msg_9")
        == "on_busy=interrupt: message msg_9 arrived while it ran"
    )


def test_every_policy_has_its_docs_row() -> None:
    assert set(busy.POLICIES) == set(BusyPolicy)
