"""Dashboard: the operator's console — the entity table, and beside it the opened entity's panel."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

from ..arguments import RefLike
from ..client import AsyncClient, Client
from ._control import EntityControl
from ._table import EntityTable

PLACEHOLDER = (
    "<div class='electric-placeholder' style='color:#6c757d;padding:24px 8px'>Press an entity's id "
    "in the table to open its control panel here: its state, the signals valid now, the grace "
    "countdown of a stop, a SIGUSR payload and its event log, live.</div>"
)


class Dashboard(widgets.VBox):  # type: ignore[misc]  # ipywidgets ships no type hints
    """The fleet as a table and one entity's control panel beside it.

    >>> Dashboard(client)                              # what `make dashboard` serves
    >>> Dashboard(client, entity="research/r1")        # with that entity's panel open

    Pressing an id in the table (``table``, an ``EntityTable``) opens that entity's
    ``EntityControl`` (``control``) beside it; the previous one is closed, with its streams.
    The table's filters, search, paging and selection signals are its own; an error about the
    server (none at the address, a refused token) shows above the table, one about the opened
    entity (gone, unknown) in its panel, and neither stops the other. ``close()`` closes both.
    """

    def __init__(
        self,
        client: Client | AsyncClient,
        *,
        entity: RefLike | None = None,
        type: str | None = None,
        page_size: int = 25,
        log_size: int = 20,
    ) -> None:
        super().__init__()
        self._client = client
        self._log_size = log_size
        self.control: EntityControl | None = None
        address = client.options.address
        self.header = widgets.HTML(
            "<div style='display:flex;gap:12px;align-items:baseline;border-bottom:2px solid #dee2e6;"
            "padding:2px 0 6px 0;margin-bottom:6px'><b style='font-size:18px'>electric</b>"
            f"<span style='color:#495057'>server <code>{html.escape(address)}</code></span></div>"
        )
        self.table = EntityTable(client, type=type, page_size=page_size)
        self.table.layout = widgets.Layout(flex="0 0 auto", margin="0 16px 0 0")
        self.panel = widgets.VBox(
            [widgets.HTML(PLACEHOLDER)], layout=widgets.Layout(flex="1 1 auto", min_width="420px")
        )
        self.panel.add_class("electric-panel")
        self.table.observe(self._opened, "opened")
        self.children = [self.header, widgets.HBox([self.table, self.panel])]
        self.add_class("electric-dashboard")
        if entity is not None:
            self.table.open_entity(entity)

    def _opened(self, change: dict[str, Any]) -> None:
        """On the widgets' thread (a click, or ``table.open_entity``): the panel of the entity opened."""
        ref = change["new"]
        if self.control is not None and self.control.ref == ref:
            return
        previous, self.control = self.control, EntityControl(self._client, ref, log_size=self._log_size)
        self.panel.children = [self.control]
        if previous is not None:
            # Without waiting for its streams to end: this click may hold the lock their last
            # update needs (where no event loop runs here); they end on the client's loop anyway.
            previous.close(wait=False)

    def close(self) -> None:
        """Stop every stream (the table's and the panel's) and close the widgets."""
        self.table.close()
        if self.control is not None:
            self.control.close()
        self.header.close()
        self.panel.close()
        super().close()

    def __enter__(self) -> Dashboard:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
