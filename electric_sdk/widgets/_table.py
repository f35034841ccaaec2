"""EntityTable: entities and their states, live, with per-row controls and signals to a selection."""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable
from typing import Any

import ipywidgets as widgets
import traitlets

from .._proto.electric.v1 import entity_service_pb2 as api
from .._wire.enums import state_to_pb
from ..arguments import StateLike, parse_states
from ..client import AsyncClient, Client
from ..lifecycle import Signal, possible_signals
from ..models import Entity, EntityRef, SignalManyResult, SignalResult
from ._base import LiveWidget
from ._parts import Confirm, signal_button
from ._view import (
    SIGNAL_BUTTONS,
    badge_html,
    describe,
    error_html,
    note_html,
    parse_payload,
)


class _Row:
    """One entity's row: a selection box, its name, its badge and its buttons."""

    def __init__(self, table: EntityTable, ref: EntityRef) -> None:
        self.ref = ref
        self.select = widgets.Checkbox(value=False, indent=False, layout=widgets.Layout(width="28px"))
        self.name = widgets.HTML(f"<code>{html.escape(ref.url)}</code>", layout=widgets.Layout(width="240px"))
        self.badge = widgets.HTML(layout=widgets.Layout(width="96px"))
        self.buttons = {signal: signal_button(signal, compact=True) for signal in SIGNAL_BUTTONS}
        self.box = widgets.HBox([self.select, self.name, self.badge, *self.buttons.values()])
        self.box.add_class("electric-row")
        for signal, button in self.buttons.items():
            button.on_click(table._ui.handler(table._row_sender(ref, signal)))
        self.select.observe(table._ui.handler(table._selection_changed), "value")

    def show(self, entity: Entity) -> None:
        self.badge.value = badge_html(entity.state)
        # The table does not follow each entity's runs: a button is enabled when its
        # signal has an effect in this state with or without a run in progress.
        possible = possible_signals(entity.state)
        for signal, button in self.buttons.items():
            button.disabled = signal not in possible

    def close(self) -> None:
        for widget in (self.select, self.name, self.badge, *self.buttons.values(), self.box):
            widget.close()


class EntityTable(LiveWidget):
    """Entities and their states, live, sorted by type and id.

    >>> EntityTable(client, type="research", state=["running", "paused"])

    Each row has the state as a badge and buttons for the lifecycle signals
    that can have an effect in that state (Kill asks first). Tick rows (or
    "all"), pick a signal and press "Signal selected" to send it to all of
    them at once (one ``signal_many`` call). An entity that leaves the
    ``state`` filter leaves the table. At most ``limit`` rows are shown.
    ``entities`` is every matching entity as last shown, sorted; observe it
    (``table.observe(callback, "entities")``) to act after each update.
    """

    entities = traitlets.Any()

    def __init__(
        self,
        client: Client | AsyncClient,
        type: str | None = None,
        state: StateLike | Iterable[StateLike] | None = None,
        *,
        limit: int = 100,
        throttle_s: float = 0.25,
    ) -> None:
        super().__init__(client, throttle_s=throttle_s)
        self.type = type
        self.states = frozenset(parse_states(state))
        self.limit = limit
        # The facts, written on the client's loop.
        self._entities: dict[EntityRef, Entity] = {}
        self._error: str | None = None
        self._loaded = False
        # The rows shown, on the widgets' thread.
        self._rows: dict[EntityRef, _Row] = {}
        self._order: list[EntityRef] = []
        self.entities = ()

        own = self._own
        self.summary = own(widgets.HTML(note_html("loading…")))
        self.select_all = own(
            widgets.Checkbox(description="all", indent=False, layout=widgets.Layout(width="60px"))
        )
        self.signal_choice = own(
            widgets.Dropdown(
                options=[(s.value, s) for s in Signal],
                value=Signal.SIGTERM,
                layout=widgets.Layout(width="110px"),
            )
        )
        self.reason = own(widgets.Text(placeholder="reason (optional)", layout=widgets.Layout(width="220px")))
        self.payload = own(
            widgets.Text(
                placeholder="SIGUSR payload (JSON)",
                layout=widgets.Layout(width="220px", display="none"),
            )
        )
        self.send_selected = own(widgets.Button(description="Signal selected", disabled=True))
        self.send_selected.add_class("electric-signal-selected")
        self.confirm_kill = Confirm(self._ui, "Kill")
        for widget in self.confirm_kill.widgets:
            own(widget)
        self.rows = own(widgets.VBox())

        self.select_all.observe(self._ui.handler(self._select_all), "value")
        self.signal_choice.observe(self._ui.handler(self._choice_changed), "value")
        self.send_selected.on_click(self._ui.handler(self._signal_selection))

        self.children = [
            self.summary,
            own(
                widgets.HBox(
                    [self.select_all, self.signal_choice, self.reason, self.payload, self.send_selected]
                )
            ),
            self.confirm_kill.box,
            self.message,
            self.rows,
        ]
        self.add_class("electric-entity-table")
        self._start(self._follow)

    # -- the stream, on the client's loop ------------------------------------------------------

    async def _follow(self) -> None:
        # The raw stream rather than AsyncClient.watch_entities: the table needs to see where a
        # snapshot ends, to show an empty one, and to replace its rows with the fresh snapshot a
        # reconnect brings (an entity that left the filter meanwhile must go).
        aio = self._client.aio
        request = api.WatchEntitiesRequest(
            type=self.type or "", states=[state_to_pb(s) for s in self.states], accepts_batches=True
        )
        snapshot: dict[EntityRef, Entity] | None = {}
        async for item in aio._resumable(lambda: request, "WatchEntities"):
            kind = item.WhichOneof("item")
            if kind == "snapshot":
                if snapshot is None:  # a new snapshot: the stream reconnected
                    snapshot = {}
                for raw in item.snapshot.entities:
                    entity = Entity.from_pb(raw)
                    snapshot[entity.ref] = entity
                continue
            if kind == "snapshot_complete":
                self._entities, snapshot = snapshot or {}, None
            elif kind in ("change", "changes"):
                for change in [item.change] if kind == "change" else item.changes.changes:
                    entity = Entity.from_pb(change.entity)
                    if self.states and entity.state not in self.states:
                        self._entities.pop(entity.ref, None)  # it left the filter
                    else:
                        self._entities[entity.ref] = entity
            self._loaded = True
            assert self._feed is not None
            self._feed.changed()

    def _stream_failed(self, exc: BaseException) -> None:
        self._error = f"live updates stopped: {describe(exc)}"

    def _refresh(self) -> Callable[[], None]:
        entities = tuple(sorted(self._entities.values(), key=lambda e: (e.ref.type, e.ref.id)))
        error, loaded = self._error, self._loaded
        return lambda: self._render(entities, error, loaded)

    # -- the widgets, on their own thread ----------------------------------------------------------

    def _render(self, entities: tuple[Entity, ...], error: str | None, loaded: bool) -> None:
        if self._closed:
            return
        shown = entities[: self.limit]
        for entity in shown:
            row = self._rows.get(entity.ref)
            if row is None:
                row = self._rows[entity.ref] = _Row(self, entity.ref)
            row.show(entity)
        order = [e.ref for e in shown]
        for ref in set(self._rows) - set(order):
            self._rows.pop(ref).close()
        if order != self._order:
            self._order = order
            self.rows.children = [self._rows[ref].box for ref in order]
        count = f"{len(entities)} entit{'y' if len(entities) == 1 else 'ies'}" if loaded else "loading…"
        if len(entities) > len(shown):
            count += f", showing the first {len(shown)}"
        self.summary.value = error_html(f"{count}; {error}") if error else note_html(count)
        self._selection_changed()
        self.entities = entities  # last, so its observers see the widgets updated

    @property
    def selected(self) -> list[EntityRef]:
        """The ticked rows, in table order."""
        return [ref for ref in self._order if self._rows[ref].select.value]

    def _selection_changed(self) -> None:
        count = len(self.selected)
        self.send_selected.disabled = count == 0
        self.send_selected.description = f"Signal {count} selected" if count else "Signal selected"

    def _select_all(self) -> None:
        for ref in self._order:
            self._rows[ref].select.value = self.select_all.value

    def _choice_changed(self) -> None:
        self.payload.layout.display = "" if self.signal_choice.value is Signal.SIGUSR else "none"

    def _row_sender(self, ref: EntityRef, signal: Signal) -> Callable[[], None]:
        def send() -> None:
            aio, reason = self._client.aio, self.reason.value.strip()

            async def call() -> SignalResult:
                return await aio.signal(ref, signal, reason=reason)

            if signal is Signal.SIGKILL:
                self.confirm_kill.ask(
                    f"Kill {ref.url} now? No handler runs.", lambda: self._send_signal(signal, call)
                )
            else:
                self._send_signal(signal, call)

        return send

    def _signal_selection(self) -> None:
        refs, signal = self.selected, self.signal_choice.value
        payload: Any = None
        if signal is Signal.SIGUSR:
            try:
                payload = parse_payload(self.payload.value)
            except ValueError as exc:
                self._say(error_html(f"SIGUSR not sent: {exc}"))
                return
        aio, reason = self._client.aio, self.reason.value.strip()

        async def call() -> SignalManyResult:
            return await aio.signal_many(signal, refs=refs, reason=reason, payload=payload)

        if signal is Signal.SIGKILL:
            self.confirm_kill.ask(
                f"Kill {len(refs)} entit{'y' if len(refs) == 1 else 'ies'} now? No handler runs.",
                lambda: self._send_signal(signal, call),
            )
        else:
            self._send_signal(signal, call)

    def _close_widgets(self) -> None:
        for row in self._rows.values():
            row.close()
        self._rows.clear()
        super()._close_widgets()
