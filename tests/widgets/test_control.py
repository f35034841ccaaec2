"""EntityControl against a real server and worker: buttons clicked, effects seen on the server,
badge changes arriving from the watch stream."""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable
from typing import Any

import pytest

from electric_sdk import AsyncClient, Client
from electric_sdk.event_text import event_line
from electric_sdk.lifecycle import Signal, State, valid_signals
from electric_sdk.testing import TestServer
from electric_sdk.widgets import EntityControl, EntityView

from .support import ThreadedWorker, await_for, enabled, wait_for, wait_until


def control_for(opened: list[Any], client: Client, ref: str, **kw: Any) -> EntityControl:
    control = EntityControl(client, ref, **kw)
    opened.append(control)
    return control


def running_control(opened: list[Any], client: Client, ref: str, **profile: Any) -> EntityControl:
    """Spawn a probe entity and return its control once the badge shows it `running`."""
    client.spawn(ref, **profile)
    control = control_for(opened, client, ref)
    wait_for(control, "view", in_state(State.RUNNING))
    return control


def in_state(state: State, run: bool | None = None) -> Callable[[EntityView], bool]:
    def match(view: EntityView) -> bool:
        return view.state is state and (run is None or view.run_in_progress is run)

    return match


def assert_buttons_follow_the_table(control: EntityControl) -> None:
    view = control.view
    expected = set(valid_signals(view.state, view.run_in_progress)) if view.state else set()
    assert enabled(control.buttons) == expected, (view.state, view.run_in_progress)


def test_pause_and_resume_from_the_buttons(client: Client, worker: ThreadedWorker, opened: list[Any]) -> None:
    control = running_control(opened, client, "probe/p1")
    assert "data-state='running'" in control.badge.value

    control.reason.value = "maintenance window"
    control.buttons[Signal.SIGSTOP].click()
    view = wait_for(control, "view", in_state(State.PAUSED))
    assert "data-state='paused'" in control.badge.value
    assert client.get("probe/p1").state is State.PAUSED  # the effect is on the server
    signal = next(e for e in view.events if e.type == "signal")
    assert signal.value["signal"] == "SIGSTOP"
    assert signal.value["reason"] == "maintenance window"
    wait_for(control.message, "value", lambda text: "SIGSTOP" in text and "paused" in text)

    control.buttons[Signal.SIGCONT].click()
    wait_for(control, "view", in_state(State.RUNNING))
    assert client.get("probe/p1").state is State.RUNNING
    assert "SIGCONT" in control.event_log.value


def test_enabled_buttons_follow_the_lifecycle_table_through_every_state(
    client: Client, worker: ThreadedWorker, opened: list[Any]
) -> None:
    # spawning: nobody hosts this type, so it stays there
    client.spawn("unhosted/u1")
    waiting = control_for(opened, client, "unhosted/u1")
    wait_for(waiting, "view", in_state(State.SPAWNING))
    assert_buttons_follow_the_table(waiting)
    assert enabled(waiting.buttons) == {Signal.SIGKILL}

    client.spawn("probe/p1", grace_period="30s")
    control = control_for(opened, client, "probe/p1")
    seen: list[tuple[State | None, bool]] = []

    def step(state: State, run: bool) -> None:
        wait_for(control, "view", in_state(state, run))
        assert_buttons_follow_the_table(control)
        seen.append((state, run))

    step(State.RUNNING, False)

    # running with a run in progress: Interrupt is enabled, and aborts the run
    client.send("probe/p1", "hold")
    step(State.RUNNING, True)
    control.buttons[Signal.SIGINT].click()
    step(State.RUNNING, False)
    assert any(e.type == "run" and e.value["status"] == "aborted" for e in control.view.events)

    # paused while a run finishes: Interrupt and SIGUSR still reach that run
    client.send("probe/p1", "hold")
    step(State.RUNNING, True)
    control.buttons[Signal.SIGSTOP].click()
    step(State.PAUSED, True)
    worker.release()
    step(State.PAUSED, False)
    control.buttons[Signal.SIGCONT].click()
    step(State.RUNNING, False)

    # idle: SIGHUP ends the session after the (absent) run
    control.buttons[Signal.SIGHUP].click()
    step(State.IDLE, False)

    # stopping, then stopped: the cleanup is held, so `stopping` lasts until released
    client.send("probe/p1", "wake up")
    step(State.RUNNING, False)
    worker.hold_cleanups()
    control.buttons[Signal.SIGTERM].click()
    step(State.STOPPING, False)
    worker.release_cleanups()
    step(State.STOPPED, False)

    # killed, through the confirmation step
    other = running_control(opened, client, "probe/p2")
    other.buttons[Signal.SIGKILL].click()
    other.confirm_kill.confirm.click()
    wait_for(other, "view", in_state(State.KILLED))
    assert_buttons_follow_the_table(other)
    assert enabled(other.buttons) == set()

    assert {state for state, _ in seen} | {State.SPAWNING, State.KILLED} == set(State)


def test_a_bad_json_payload_shows_an_error_and_sends_nothing(
    client: Client, worker: ThreadedWorker, opened: list[Any]
) -> None:
    control = running_control(opened, client, "probe/p1")

    control.payload.value = '{"focus": '
    control.buttons[Signal.SIGUSR].click()
    assert "not valid JSON" in control.message.value
    assert "electric-error" in control.message.value

    # A good payload next: once it is on the stream, the bad one would have been before it.
    control.payload.value = '{"focus": "pricing"}'
    control.buttons[Signal.SIGUSR].click()
    view = wait_for(control, "view", lambda v: any(e.type == "signal" for e in v.events))
    signals = [e for e in client.events("probe/p1").events if e.type == "signal" and e.operation == "insert"]
    assert [(e.value["signal"], e.value.get("payload")) for e in signals] == [
        ("SIGUSR", {"focus": "pricing"})
    ]
    assert view.state is State.RUNNING


def test_kill_asks_for_confirmation_first(client: Client, worker: ThreadedWorker, opened: list[Any]) -> None:
    control = running_control(opened, client, "probe/p1")

    control.buttons[Signal.SIGKILL].click()
    assert control.confirm_kill.asking
    assert control.confirm_kill.box.layout.display == "flex"
    control.confirm_kill.cancel.click()
    assert not control.confirm_kill.asking
    assert control.confirm_kill.box.layout.display == "none"
    assert client.get("probe/p1").state is State.RUNNING  # nothing was sent

    control.buttons[Signal.SIGKILL].click()
    control.confirm_kill.confirm.click()
    view = wait_for(control, "view", lambda v: v.state is State.KILLED and v.closed)
    assert "data-state='killed'" in control.badge.value
    assert "stream closed" in control.status.value
    assert client.get("probe/p1").state is State.KILLED
    assert view.enabled() == frozenset()


def test_stop_counts_down_to_the_grace_deadline(
    client: Client, worker: ThreadedWorker, opened: list[Any]
) -> None:
    control = running_control(opened, client, "probe/p1", grace_period="30s")
    worker.hold_cleanups()

    control.buttons[Signal.SIGTERM].click()
    view = wait_for(control, "view", in_state(State.STOPPING))
    assert view.stopping_deadline == client.get("probe/p1").stopping_deadline
    first = wait_for(control.status, "value", lambda text: "grace ends in" in text)
    # The countdown moves on its own, without a new event.
    wait_for(control.status, "value", lambda text: "grace ends in" in text and text != first)
    worker.release_cleanups()
    wait_for(control, "view", in_state(State.STOPPED))
    assert "grace ends" not in control.status.value


def test_stop_and_kill_say_how_far_they_reached(
    client: Client, worker: ThreadedWorker, opened: list[Any]
) -> None:
    """A button's line waits for its signal's last stage and names each one: SIGTERM says the
    cleanup ran and the entity is stopped only once the stream shows it."""
    control = running_control(opened, client, "probe/p1", grace_period="30s")
    worker.hold_cleanups()
    control.buttons[Signal.SIGTERM].click()
    wait_for(control.message, "value", lambda text: "waiting until terminal" in text)
    worker.release_cleanups()
    line = wait_for(control.message, "value", lambda text: "terminal ✓" in text)
    assert "accepted ✓ · unwound ✓ · downstream ✓ · reaped ✓ · terminal ✓" in line
    assert client.get("probe/p1").state is State.STOPPED

    other = running_control(opened, client, "probe/p2")
    other.buttons[Signal.SIGKILL].click()
    other.confirm_kill.confirm.click()
    wait_for(other.message, "value", lambda text: "terminal ✓" in text)


def test_errors_show_in_the_widget_not_as_tracebacks(
    client: Client, worker: ThreadedWorker, opened: list[Any]
) -> None:
    missing = control_for(opened, client, "probe/nobody")
    wait_for(missing.status, "value", lambda text: "ENTITY_NOT_FOUND" in text)
    assert "electric-error" in missing.status.value
    assert enabled(missing.buttons) == set()

    # Someone else kills the entity; a click that was already on its way fails in the widget.
    control = running_control(opened, client, "probe/p1")
    client.kill("probe/p1")
    wait_for(control, "view", in_state(State.KILLED))
    control.buttons[Signal.SIGSTOP].click()  # a stale click: the button is disabled on screen by now
    text = wait_for(control.message, "value", lambda text: "INVALID_SIGNAL" in text)
    assert "Cannot signal a killed entity" in text
    assert "Traceback" not in text


def test_a_burst_of_events_is_drawn_in_a_few_refreshes(client: Client, opened: list[Any]) -> None:
    client.spawn("unhosted/u1")
    for i in range(60):  # ignored while spawning, but each one is on the stream
        client.usr("unhosted/u1", {"n": i})
    head = client.get("unhosted/u1").head_offset
    refreshes: list[EntityView] = []
    started = time.monotonic()
    control = control_for(opened, client, "unhosted/u1", log_size=100, throttle_s=0.5)
    control.observe(lambda change: refreshes.append(change["new"]), "view")
    wait_for(control, "view", lambda v: len(v.events) == head)
    elapsed = time.monotonic() - started
    # At most one refresh per interval (the first one comes at once), whatever the machine's speed.
    assert len(refreshes) <= 1 + math.ceil(elapsed / 0.5)
    assert len(refreshes) < head
    assert control.event_log.value.count("SIGUSR") == 60


def test_close_stops_the_watch_streams(electric: TestServer, client: Client, worker: ThreadedWorker) -> None:
    client.spawn("probe/p1")
    control = EntityControl(client, "probe/p1")
    wait_for(control, "view", in_state(State.RUNNING))
    watches = electric.server.watches
    # The badge can show `running` from the first get; two streams: the log's and the state's.
    wait_until(lambda: watches.active == 2)
    assert control.streaming
    control.close()
    assert control.closed
    assert not control.streaming  # close() waited for the stream to end on the client
    wait_until(lambda: watches.active == 0)  # and the server saw the call cancelled
    # Later changes do not reach a closed widget.
    before = control.badge.value
    client.pause("probe/p1")
    client.wait_for_state("probe/p1", State.PAUSED, timeout=10)
    assert control.badge.value == before


@pytest.mark.anyio
async def test_works_with_an_async_client(electric: TestServer, worker: ThreadedWorker) -> None:
    async with electric.async_client() as aclient:
        await aclient.spawn("probe/a1")
        control = EntityControl(aclient, "probe/a1")  # on this loop, where the AsyncClient belongs
        try:
            await await_for(control, "view", in_state(State.RUNNING))
            control.buttons[Signal.SIGSTOP].click()
            await await_for(control, "view", in_state(State.PAUSED))
            assert (await aclient.get("probe/a1")).state is State.PAUSED
            control.buttons[Signal.SIGCONT].click()
            await await_for(control, "view", in_state(State.RUNNING))
        finally:
            control.close()


def test_an_async_client_without_a_loop_is_refused(electric: TestServer) -> None:
    aclient = AsyncClient(electric.address)
    with pytest.raises(Exception, match="no event loop yet"):
        EntityControl(aclient, "probe/a1")


def test_the_state_panel_shows_the_durable_state_live(
    client: Client, worker: ThreadedWorker, opened: list[Any]
) -> None:
    control = running_control(opened, client, "probe/s1")
    wait_for(control, "durable_state", lambda state: state == {})
    assert "empty" in control.state_panel.value
    client.send("probe/s1", "remember pricing")
    wait_for(control, "durable_state", lambda state: state == {"notes": ["pricing"]})
    assert "notes" in control.state_panel.value
    assert "pricing" in control.state_panel.value
    client.send("probe/s1", "remember <b>bold</b>")  # drawn as text, not as markup
    wait_for(control, "durable_state", lambda state: state == {"notes": ["pricing", "<b>bold</b>"]})
    assert "&lt;b&gt;bold&lt;/b&gt;" in control.state_panel.value
    assert control.durable_state == client.state("probe/s1")  # the same rebuild as the client's


def test_the_log_stays_put_while_follow_is_off(client: Client, opened: list[Any]) -> None:
    client.spawn("unhosted/u1")
    control = control_for(opened, client, "unhosted/u1")
    wait_for(control, "view", in_state(State.SPAWNING))
    client.usr("unhosted/u1", {"n": 1})
    wait_for(control.event_log, "value", lambda text: "{&quot;n&quot;:1}" in text)

    control.follow.value = False
    frozen = control.event_log.value
    client.usr("unhosted/u1", {"n": 2})
    wait_for(control, "view", lambda view: any(e.value.get("payload") == {"n": 2} for e in view.events))
    assert control.event_log.value == frozen  # the event arrived; the log a person reads did not move

    control.follow.value = True  # and it catches up at once
    assert "{&quot;n&quot;:2}" in control.event_log.value


def test_the_log_shows_lines_as_electric_events_prints_them(client: Client, opened: list[Any]) -> None:
    client.spawn("unhosted/u1")
    control = control_for(opened, client, "unhosted/u1")
    view = wait_for(control, "view", lambda view: len(view.events) == 1)
    assert html.escape(event_line(view.events[0])) in control.event_log.value
