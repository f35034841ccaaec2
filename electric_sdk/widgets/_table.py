"""EntityTable: the fleet, live — filters, an id search, a page of rows, signals to a selection."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import anyio
import ipywidgets as widgets
import traitlets

from .. import errors
from .._proto.electric.v1 import entity_service_pb2 as api
from .._wire.enums import state_to_pb
from ..arguments import RefLike, StateLike, parse_ref
from ..client import AsyncClient, Client
from ..lifecycle import Signal, State
from ..models import Entity, EntityRef, SignalManyResult
from ..presence import hosted_types
from ._advice import advice
from ._base import LiveWidget
from ._parts import Confirm
from ._rows import ID_WIDTH, ROW_STYLE, RowSlot
from ._table_view import (
    FINAL_STATES,
    SORTS,
    TableQuery,
    WatchFilter,
    count_text,
    header_html,
    page_of,
    row_html,
    select,
    tree_labels,
)
from ._view import alert_html, error_html, note_html, parse_payload


class EntityTable(LiveWidget):
    """The entities, live: a page of rows with their state, events, last change, age and whether
    a connected worker hosts their type.

    >>> EntityTable(client)                         # every entity that is not stopped or killed
    >>> EntityTable(client, type="research", state="paused")

    Filter by type and state (stopped and killed entities show once "show stopped, killed" is
    ticked), search by id, sort, and page through ``page_size`` rows at a time. Press an id to
    open that entity (``opened``; the ``Dashboard`` shows its control panel beside the table).
    Tick rows (or "all": every matching row), pick a signal and press "Signal selected" to send
    it to all of them in one ``signal_many`` call (Kill asks first).

    The rows come from one ``WatchEntities`` stream, filtered on the server by type and by
    state (the final states only when asked for); a narrower filter or a search applies at once
    to the rows held. The rows on the page are read again every ``poll_s`` (their events and
    last change move between state changes), and so are the connected workers. ``entities`` is
    every matching entity, in the table's order; observe it (``table.observe(callback,
    "entities")``) to act after each update.
    """

    entities = traitlets.Any()
    # The entity whose id was pressed (an EntityRef), or None.
    opened = traitlets.Any(None)

    def __init__(
        self,
        client: Client | AsyncClient,
        type: str | None = None,
        state: StateLike | None = None,
        *,
        show_final: bool = False,
        page_size: int = 25,
        throttle_s: float = 0.25,
        poll_s: float = 5.0,
    ) -> None:
        super().__init__(client, throttle_s=throttle_s)
        self.page_size = max(1, page_size)
        self.poll_s = poll_s
        # What the person asked for; replaced (never changed) on the widgets' thread, read on
        # the client's loop.
        self._query = TableQuery(
            type=type, state=State.parse(state) if state is not None else None, show_final=show_final
        )
        # The facts, written on the client's loop.
        self._entities: dict[EntityRef, Entity] = {}
        self._version = 0  # counts changes to _entities
        self._types: set[str] = set() if type is None else {type}
        self._hosted: frozenset[str] | None = None
        self._watching: WatchFilter | None = None  # the stream's filter, once its snapshot is in
        self._restart: anyio.Event | None = None
        self._error: str | None = None
        self._visible: tuple[EntityRef, ...] = ()
        self._selection: tuple[tuple[int, TableQuery], list[Entity]] | None = None
        self._sent: tuple[int, TableQuery] | None = None  # the selection's key last handed over
        # On the widgets' thread.
        self._ticked: set[EntityRef] = set()
        self._matching: tuple[EntityRef, ...] = ()
        self._setting_options = False
        self.entities = ()

        own = self._own
        # As wide as the table: a long message wraps rather than widen it.
        self.alert = own(widgets.HTML(layout=widgets.Layout(width="690px")))
        self.alert.add_class("electric-alert")
        self.type_filter = own(_filter("type", self._type_options(sorted(self._types)), type or "", "190px"))
        self.state_filter = own(
            _filter(
                "state",
                [("any state", ""), *((s.value, s.value) for s in State)],
                self._query.state.value if self._query.state else "",
                "170px",
            )
        )
        self.show_final = own(
            widgets.Checkbox(
                value=show_final,
                description=f"show {', '.join(s.value for s in FINAL_STATES)}",
                indent=False,
                layout=widgets.Layout(width="190px"),
            )
        )
        self.show_final.add_class("electric-show-final")
        self.search = own(
            widgets.Text(
                placeholder="search id", continuous_update=True, layout=widgets.Layout(width="180px")
            )
        )
        self.search.add_class("electric-search")
        self.sort = own(
            widgets.Dropdown(
                options=[(label, key) for key, (label, _) in SORTS.items()],
                value="newest",
                layout=widgets.Layout(width="150px"),
            )
        )
        self.sort.add_class("electric-sort")
        self.summary = own(widgets.HTML(note_html("loading…")))
        self.summary.add_class("electric-summary")

        self.select_all = own(
            widgets.Checkbox(description="all", indent=False, layout=widgets.Layout(width="110px"))
        )
        self.signal_choice = own(
            widgets.Dropdown(
                options=[(s.value, s) for s in Signal],
                value=Signal.SIGTERM,
                layout=widgets.Layout(width="100px"),
            )
        )
        self.reason = own(widgets.Text(placeholder="reason (optional)", layout=widgets.Layout(width="170px")))
        self.payload = own(
            widgets.Text(
                placeholder="SIGUSR payload (JSON)", layout=widgets.Layout(width="170px", display="none")
            )
        )
        self.send_selected = own(widgets.Button(description="Signal selected", disabled=True))
        self.send_selected.add_class("electric-signal-selected")
        self.confirm_kill = Confirm(self._ui, "Kill")
        for widget in self.confirm_kill.widgets:
            own(widget)

        self.slots = [RowSlot(self._ui, self.open_entity, self._tick) for _ in range(self.page_size)]
        for slot in self.slots:
            for widget in slot.widgets:
                own(widget)
        self.previous_page = own(widgets.Button(description="‹ previous", disabled=True))
        self.previous_page.add_class("electric-previous-page")
        self.next_page = own(widgets.Button(description="next ›", disabled=True))
        self.next_page.add_class("electric-next-page")
        self.page_label = own(widgets.HTML())

        handler = self._ui.handler
        self.type_filter.observe(handler(self._filters_changed), "value")
        self.state_filter.observe(handler(self._filters_changed), "value")
        self.show_final.observe(handler(self._filters_changed), "value")
        self.search.observe(handler(self._filters_changed), "value")
        self.sort.observe(handler(self._filters_changed), "value")
        self.previous_page.on_click(handler(lambda: self._turn(-1)))
        self.next_page.on_click(handler(lambda: self._turn(+1)))
        self.select_all.observe(handler(self._select_all), "value")
        self.signal_choice.observe(handler(self._choice_changed), "value")
        self.send_selected.on_click(handler(self._signal_selection))

        columns = own(widgets.HTML(header_html(), layout=widgets.Layout(margin="0 0 0 24px")))
        id_header = own(widgets.HTML("<b style='font-size:12px;color:#495057'>id</b>"))
        id_header.layout = widgets.Layout(width=ID_WIDTH, margin="0 0 0 28px")
        self.children = [
            own(widgets.HTML(ROW_STYLE)),
            self.alert,
            own(widgets.HBox([self.type_filter, self.state_filter, self.show_final])),
            own(widgets.HBox([self.search, self.sort, self.summary])),
            own(
                widgets.HBox(
                    [self.select_all, self.signal_choice, self.reason, self.payload, self.send_selected]
                )
            ),
            self.confirm_kill.box,
            self.message,
            own(widgets.HBox([id_header, columns])),
            own(widgets.VBox([slot.box for slot in self.slots])),
            own(widgets.HBox([self.previous_page, self.page_label, self.next_page])),
        ]
        self.add_class("electric-entity-table")
        self._start(self._follow, self._poll, ticking=lambda: True, tick_s=1.0)

    @staticmethod
    def _type_options(types: list[str]) -> list[tuple[str, str]]:
        return [("all types", ""), *((t, t) for t in types)]

    # -- the streams, on the client's loop ------------------------------------------------------

    async def _follow(self) -> None:
        """One WatchEntities stream at a time: a new one when the query leaves what it covers."""
        while True:
            self._restart = restart = anyio.Event()
            wanted = self._query.watch_filter()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch, wanted)
                await restart.wait()
                tg.cancel_scope.cancel()

    def _query_changed(self) -> None:
        """On the client's loop, after the person changed the query."""
        wanted = self._query.watch_filter()
        if self._restart is not None and (self._watching is None or not self._watching.covers(wanted)):
            self._restart.set()

    async def _watch(self, wanted: WatchFilter) -> None:
        # The raw stream rather than AsyncClient.watch_entities: the table needs to see where a
        # snapshot ends, to show an empty one, and to replace its rows with the fresh snapshot a
        # reconnect brings (an entity that left the filter meanwhile must go).
        aio = self._client.aio
        request = api.WatchEntitiesRequest(
            type=wanted.type or "", states=[state_to_pb(s) for s in wanted.states], accepts_batches=True
        )
        snapshot: dict[EntityRef, Entity] | None = {}
        try:
            # A dashboard waits for its server as long as it is open: it says so meanwhile.
            async for item in aio._resumable(
                lambda: request, "WatchEntities", on_retry=self._retrying, reconnect_s=math.inf
            ):
                self._error = None
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
                    self._types.update(ref.type for ref in self._entities)
                    self._watching = wanted
                elif kind in ("change", "changes"):
                    for change in [item.change] if kind == "change" else item.changes.changes:
                        self._keep(Entity.from_pb(change.entity), wanted)
                self._version += 1
                self._feed_changed()
        except errors.ElectricError as exc:  # refused: say why, and wait for the next query
            self._error = advice(exc, aio)
            self._feed_changed()

    def _keep(self, entity: Entity, wanted: WatchFilter) -> None:
        if wanted.states and entity.state not in wanted.states:
            self._entities.pop(entity.ref, None)  # it left the stream's filter
        else:
            self._entities[entity.ref] = entity
            self._types.add(entity.ref.type)

    def _retrying(self, exc: errors.ElectricError) -> None:
        self._error = advice(exc, self._client.aio)
        self._feed_changed()

    async def _poll(self) -> None:
        """Every ``poll_s``: the connected workers, and the rows on the page read again."""
        aio = self._client.aio
        while True:
            try:
                self._hosted = hosted_types(await aio.workers())
            except errors.ElectricError as exc:
                if exc.status == "UNIMPLEMENTED":  # a server older than ListWorkers says nothing
                    self._hosted = None
                # Unreachable or refused: the stream says so, and the next round tries again.
            wanted = self._watching
            for entity in await self._read(self._visible):
                known = self._entities.get(entity.ref)
                # Only what is newer than the stream's news: the two race.
                if wanted is not None and known is not None and entity.txid > known.txid:
                    self._keep(entity, wanted)
                    self._version += 1
            self._feed_changed()
            await anyio.sleep(self.poll_s)

    async def _read(self, refs: tuple[EntityRef, ...]) -> list[Entity]:
        """These entities as they are now, those the server still has, read at once."""
        aio, fresh = self._client.aio, []

        async def read(ref: EntityRef) -> None:
            with contextlib.suppress(errors.ElectricError):  # gone, or unreachable: next round
                fresh.append(await aio.get(ref))

        async with anyio.create_task_group() as tg:
            for ref in refs:
                tg.start_soon(read, ref)
        return fresh

    def _feed_changed(self) -> None:
        assert self._feed is not None
        self._feed.changed()

    def _stream_failed(self, exc: BaseException) -> None:
        self._error = f"live updates stopped: {advice(exc, self._client.aio)}"

    def _refresh(self) -> Callable[[], None]:
        query = self._query
        key = (self._version, query.rows_key())
        if self._selection is None or self._selection[0] != key:
            self._selection = (key, select(self._entities.values(), query))
        matching = self._selection[1]
        page = page_of(matching, query.page, self.page_size)
        self._visible = tuple(e.ref for e in page.rows)
        now = datetime.now(UTC)
        labels = tree_labels(matching) if query.sort == "tree" else {}
        rows = [(e.ref, row_html(e, self._hosted, now), labels.get(e.ref, e.ref.id)) for e in page.rows]
        loading = self._watching is None or not self._watching.covers(query.watch_filter())
        summary = count_text(len(matching), loading)
        # The types seen, and those a connected worker hosts (a table begun on one type sees no other).
        types, error = sorted(self._types | (self._hosted or frozenset())), self._error
        # The matching rows go to the widgets only when they changed (a tick moves no row).
        entities = None if key == self._sent else tuple(matching)
        self._sent = key
        return lambda: self._render(entities, rows, page.number, page.pages, summary, types, error)

    # -- the widgets, on their own thread ----------------------------------------------------------

    def _render(
        self,
        entities: tuple[Entity, ...] | None,
        rows: list[tuple[EntityRef, str, str]],
        number: int,
        pages: int,
        summary: str,
        types: list[str],
        error: str | None,
    ) -> None:
        if self._closed:
            return
        for slot, (ref, cells, label) in zip(self.slots, rows, strict=False):
            slot.show(ref, cells, ticked=ref in self._ticked, opened=ref == self.opened, label=label)
        for slot in self.slots[len(rows) :]:
            slot.hide()
        self.summary.value = note_html(summary)
        self.alert.value = alert_html(error) if error else ""
        self.page_label.value = note_html(f"page {number + 1} of {pages:,}")
        self.previous_page.disabled = number == 0
        self.next_page.disabled = number >= pages - 1
        options = self._type_options(types)
        if list(self.type_filter.options) != options:
            # New options reset a Dropdown to its first one: put the chosen type back (it is
            # always among them), and tell the filters it was no person's choice.
            chosen, self._setting_options = self.type_filter.value, True
            try:
                self.type_filter.options = options
                self.type_filter.value = chosen
            finally:
                self._setting_options = False
        if entities is not None:
            self._matching = tuple(e.ref for e in entities)
            self._ticked.intersection_update(self._matching)  # a selection is of rows one can see
            self.select_all.description = f"all {len(entities):,}"
            self._selection_changed()
            self.entities = entities  # last, so its observers see the widgets updated

    def _filters_changed(self) -> None:
        if self._setting_options:
            return
        self._query = TableQuery(
            type=self.type_filter.value or None,
            state=State.parse(self.state_filter.value) if self.state_filter.value else None,
            show_final=self.show_final.value,
            search=self.search.value,
            sort=self.sort.value,
        )
        self._after_query()

    def _turn(self, by: int) -> None:
        self._query = replace(self._query, page=self._query.page + by)
        self._after_query()

    def _after_query(self) -> None:
        try:
            self._client.loop.call_soon_threadsafe(self._query_changed)
        except RuntimeError:  # the client's loop is closed: nothing more to show
            return
        if self._feed is not None:
            self._feed.refresh_now()

    def open_entity(self, ref: RefLike) -> None:
        """Open an entity (as pressing its id does): ``opened`` says which."""
        self.opened = parse_ref(ref)
        for slot in self.slots:
            slot.mark_opened(slot.ref is not None and slot.ref == self.opened)

    @property
    def watch_filter(self) -> WatchFilter | None:
        """What the open watch stream asks the server for, once its snapshot is in (None before):
        a filter the stream covers is applied to the rows it brought, without a new stream."""
        return self._watching

    @property
    def selected(self) -> list[EntityRef]:
        """The ticked rows, in table order."""
        return [ref for ref in self._matching if ref in self._ticked]

    def _tick(self, ref: EntityRef, ticked: bool) -> None:
        if ticked:
            self._ticked.add(ref)
        else:
            self._ticked.discard(ref)
        self._selection_changed()

    def _selection_changed(self) -> None:
        count = len(self._ticked)
        self.send_selected.disabled = count == 0
        self.send_selected.description = f"Signal {count:,} selected" if count else "Signal selected"

    def _select_all(self) -> None:
        if self.select_all.value:
            self._ticked.update(self._matching)
        else:
            self._ticked.clear()
        for slot in self.slots:
            if slot.ref is not None:
                slot.tick.value = slot.ref in self._ticked
        self._selection_changed()

    def _choice_changed(self) -> None:
        self.payload.layout.display = "" if self.signal_choice.value is Signal.SIGUSR else "none"

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
                f"Kill {len(refs):,} entit{'y' if len(refs) == 1 else 'ies'} now? No handler runs.",
                lambda: self._send_signal(signal, call),
            )
        else:
            self._send_signal(signal, call)


def _filter(name: str, options: list[tuple[str, str]], value: str, width: str) -> Any:
    """A filter's Dropdown, labelled ``name`` and found by the class ``electric-NAME-filter``.
    Its values are strings, "" for all: a Dropdown whose value is None shows no choice at all."""
    dropdown = widgets.Dropdown(
        options=options,
        value=value,
        description=name,
        style={"description_width": "initial"},
        layout=widgets.Layout(width=width),
    )
    dropdown.add_class(f"electric-{name}-filter")
    return dropdown
