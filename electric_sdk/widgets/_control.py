"""EntityControl: one entity's state, its signal buttons, its live event log and its durable state."""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import ipywidgets as widgets
import traitlets

from ..arguments import RefLike, parse_ref
from ..client import AsyncClient, Client
from ..lifecycle import Signal
from ..models import SignalResult
from ._advice import advice
from ._base import LiveWidget
from ._parts import Confirm, signal_button
from ._presence import HostingNotice
from ._view import SIGNAL_BUTTONS, EntityView, alert_html, badge_html, error_html, note_html, parse_payload

# How far back the log starts: enough to find the run in progress, without replaying a long history.
CATCH_UP_EVENTS = 500


class EntityControl(LiveWidget):
    """A control panel for one entity, live.

    >>> EntityControl(client, "research/r1")  # the last expression of a notebook cell shows it

    The badge shows the state; the buttons send SIGINT (Interrupt), SIGSTOP
    (Pause), SIGCONT (Resume), SIGHUP (Reload), SIGTERM (Stop, then a countdown
    to the grace deadline) and SIGKILL (Kill, after a confirmation), each with
    the reason typed in the reason box. SIGUSR sends the JSON in the payload
    box, which is checked first. Only the signals that have an effect now are
    enabled: ``lifecycle.valid_signals`` for the state and whether a run is in
    progress, as the entity's stream tells. Errors show in the widget.

    ``client`` is a ``Client`` or an ``AsyncClient`` (create the widget on the
    AsyncClient's loop, e.g. in a notebook cell). ``close()`` stops the streams.
    The state panel (``state_panel``) shows the entity's durable state (``ctx.state``'s
    collections, read-only), live through ``watch_state``; ``durable_state`` is what it shows.
    ``view`` (an ``EntityView``) is what the widget shows; observe it
    (``control.observe(callback, "view")``) to act after each update.
    """

    view = traitlets.Any()
    # The entity's durable state as last drawn (None until read): observe it like ``view``.
    durable_state = traitlets.Any(None)

    def __init__(
        self, client: Client | AsyncClient, ref: RefLike, *, log_size: int = 20, throttle_s: float = 0.1
    ) -> None:
        super().__init__(client, throttle_s=throttle_s)
        self.ref = parse_ref(ref)
        # The facts, written on the client's loop; `view` is what the widgets show now.
        self._facts = EntityView(self.ref, log_size)
        self.view = self._facts

        own = self._own
        self.badge = own(widgets.HTML(badge_html(None)))
        self.status = own(widgets.HTML(layout=widgets.Layout(max_width="600px")))  # errors wrap
        self.buttons: dict[Signal, Any] = {signal: own(signal_button(signal)) for signal in SIGNAL_BUTTONS}
        self.buttons[Signal.SIGUSR] = usr = own(
            widgets.Button(
                description="Send SIGUSR",
                tooltip="SIGUSR: call the entity's on_signal with the payload",
                disabled=True,
            )
        )
        usr.add_class("electric-sigusr")
        self.reason = own(widgets.Text(placeholder="reason (optional)", layout=widgets.Layout(width="420px")))
        self.payload = own(
            widgets.Textarea(
                placeholder='SIGUSR payload, JSON: {"focus": "pricing"}',
                layout=widgets.Layout(width="420px", height="3.2em"),
            )
        )
        self.confirm_kill = Confirm(self._ui, "Kill now")
        self.event_log = own(widgets.HTML(self._facts.log_html()))
        # Off: the log stays as it is, to read it while events keep coming; on again, it catches up.
        self.follow = own(widgets.Checkbox(value=True, description="follow", indent=False))
        self.follow.add_class("electric-follow")
        self.follow.observe(self._ui.handler(self._follow_toggled), "value")
        self.final = own(widgets.HTML())
        self.final.add_class("electric-final")
        self._state: dict[str, Any] | None = None  # written on the client's loop
        self.state_panel = own(widgets.HTML(state_html(None)))
        self.hosting = HostingNotice()
        own(self.hosting.html)
        for widget in self.confirm_kill.widgets:
            own(widget)

        handler = self._ui.handler
        for signal in SIGNAL_BUTTONS:
            if signal is not Signal.SIGKILL:
                self.buttons[signal].on_click(handler(self._sender(signal)))
        self.buttons[Signal.SIGKILL].on_click(handler(self._ask_kill))
        usr.on_click(handler(self._send_usr))

        wrap = widgets.Layout(flex_flow="row wrap")
        self.children = [
            own(widgets.HBox([own(widgets.HTML(f"<b>{self.ref.url}</b>")), self.badge, self.status])),
            self.final,
            own(widgets.HBox([self.buttons[s] for s in SIGNAL_BUTTONS], layout=wrap)),
            self.confirm_kill.box,
            self.reason,
            own(widgets.HBox([self.payload, usr], layout=wrap)),
            self.hosting.html,
            self.message,
            own(widgets.HBox([own(widgets.HTML("<b>events</b>")), self.follow])),
            self.event_log,
            self.state_panel,
        ]
        self.add_class("electric-entity-control")
        self._start(self._follow, self._follow_state, ticking=lambda: self._facts.grace_left_s() is not None)

    # -- the stream, on the client's loop ------------------------------------------------------

    async def _follow(self) -> None:
        aio = self._client.aio
        entity = await aio.get(self.ref)
        self._facts = self._facts.with_entity(entity)
        await self.hosting.check(aio, self.ref, self._facts.state)
        self._feed_changed()
        async for event in aio.watch(self.ref, max(0, entity.head_offset - CATCH_UP_EVENTS)):
            self._facts = self._facts.apply(event)
            await self.hosting.check(aio, self.ref, self._facts.state)
            self._feed_changed()
        self._facts = replace(self._facts, closed=True)

    async def _follow_state(self) -> None:
        async for state in self._client.aio.watch_state(self.ref):
            self._state = state
            self._feed_changed()

    def _feed_changed(self) -> None:
        assert self._feed is not None
        self._feed.changed()

    def _stream_failed(self, exc: BaseException) -> None:
        self._facts = replace(
            self._facts, error=f"live updates stopped: {advice(exc, self._client.aio, self.ref)}"
        )

    def _refresh(self) -> Callable[[], None]:
        view, state = self._facts, self._state
        return lambda: self._render(view, state)

    # -- the widgets, on their own thread ----------------------------------------------------------

    def _render(self, view: EntityView, state: dict[str, Any] | None) -> None:
        if self._closed:
            return
        self.badge.value = badge_html(view.state)
        self.status.value = alert_html(view.error) if view.error else note_html(view.status_text())
        enabled = view.enabled()
        for signal, button in self.buttons.items():
            button.disabled = signal not in enabled
        if Signal.SIGKILL not in enabled:
            self.confirm_kill.dismiss()
        if self.follow.value:
            self.event_log.value = view.log_html()
        self.final.value = final_html(view)
        if state is not None and state != self.durable_state:
            self.state_panel.value = state_html(state)
            self.durable_state = state
        self.hosting.show()
        self.view = view  # last, so its observers see the widgets updated

    def _follow_toggled(self) -> None:
        if self.follow.value:
            self.event_log.value = self.view.log_html()

    def _sender(self, signal: Signal, payload: Any = None) -> Callable[[], None]:
        def send() -> None:
            aio, ref, reason = self._client.aio, self.ref, self.reason.value.strip()

            async def call() -> SignalResult:
                return await aio.signal(ref, signal, reason=reason, payload=payload)

            self._send_signal(signal, call)

        return send

    def _send_usr(self) -> None:
        try:
            payload = parse_payload(self.payload.value)
        except ValueError as exc:
            self._say(error_html(f"SIGUSR not sent: {exc}"))
            return
        self._sender(Signal.SIGUSR, payload)()

    def _ask_kill(self) -> None:
        self.confirm_kill.ask(
            f"Kill {self.ref.url} now? No handler runs; a run in progress is aborted.",
            self._sender(Signal.SIGKILL),
        )


def final_html(view: EntityView) -> str:
    """For a stopped or killed entity: it is final, and what that means."""
    if view.state is None or not view.state.terminal:
        return ""
    return (
        "<div style='background:#f1f3f5;border-left:4px solid #495057;padding:4px 8px;margin:2px 0'>"
        f"<b>final</b>: {html.escape(view.ref.url)} is {view.state.value}. It takes no more signals "
        "or messages; its record stays readable below.</div>"
    )


def state_html(state: dict[str, Any] | None) -> str:
    """The state panel: each collection of ``ctx.state`` as JSON, read-only."""
    if state is None:
        return "<div class='electric-state'><i>durable state: reading…</i></div>"
    if not state:
        return "<div class='electric-state'><i>durable state: empty</i></div>"
    rows = "".join(
        f"<dt><b>{html.escape(name)}</b></dt>"
        f"<dd><pre>{html.escape(json.dumps(value, indent=1, sort_keys=True, default=str))}</pre></dd>"
        for name, value in sorted(state.items())
    )
    return f"<div class='electric-state'><b>durable state</b><dl>{rows}</dl></div>"
