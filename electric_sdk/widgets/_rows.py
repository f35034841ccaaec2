"""The entity table's rows: a fixed pool of row widgets, one per line of a page.

A page change, a filter or a live update only sets the values of these widgets (and
ipywidgets sends only the values that changed); no widget is created or closed while
the table lives, so the page costs the browser the same with 100 entities or 10,000.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from ..models import EntityRef
from ._live import UiThread

# What the table's rows look like; in one <style> the table shows once.
ROW_STYLE = """<style>
.electric-row { border-bottom: 1px solid #eee; align-items: center; }
.electric-row > .jupyter-widgets, .electric-row > .widget-inline-hbox { margin-top: 1px; margin-bottom: 1px; }
.electric-row .widget-checkbox { height: 24px; }
.electric-row:hover { background: #f6f8fa; }
.electric-row.electric-opened { background: #e7f1ff; }
.electric-open button, button.electric-open {
  background: none; border: none; box-shadow: none; color: #0a58ca; text-align: left;
  font-family: monospace; padding: 0 4px; overflow: hidden; text-overflow: ellipsis;
}
.electric-open:hover, button.electric-open:hover { text-decoration: underline; }
</style>"""
ID_WIDTH = "200px"


class RowSlot:
    """One line of the page: a tick box, the id (press it to open the entity), its cells."""

    def __init__(
        self,
        ui: UiThread,
        on_open: Callable[[EntityRef], None],
        on_tick: Callable[[EntityRef, bool], None],
    ) -> None:
        self.ref: EntityRef | None = None
        self._on_open, self._on_tick = on_open, on_tick
        self._showing = False  # a tick set while showing a row is no person's click
        self.tick = widgets.Checkbox(value=False, indent=False, layout=widgets.Layout(width="24px"))
        self.name = widgets.Button(layout=widgets.Layout(width=ID_WIDTH, height="26px"))
        self.name.add_class("electric-open")
        self.cells = widgets.HTML()
        self.box = widgets.HBox([self.tick, self.name, self.cells], layout=widgets.Layout(display="none"))
        self.box.add_class("electric-row")
        self.name.on_click(ui.handler(self._opened))
        self.tick.observe(ui.handler(self._ticked), "value")

    @property
    def widgets(self) -> list[Any]:
        return [self.tick, self.name, self.cells, self.box]

    def show(self, ref: EntityRef, cells: str, *, ticked: bool, opened: bool, label: str = "") -> None:
        """``label``: the id as shown (indented under its parent in the tree order)."""
        if ref != self.ref:
            self.ref = ref
            self.name.tooltip = f"open {ref.url}"
        if self.name.description != (label or ref.id):
            self.name.description = label or ref.id
        self.cells.value = cells
        self._showing = True
        try:
            self.tick.value = ticked
        finally:
            self._showing = False
        self.mark_opened(opened)
        self.box.layout.display = ""

    def hide(self) -> None:
        self.ref = None
        self.box.layout.display = "none"

    def mark_opened(self, opened: bool) -> None:
        if opened:
            self.box.add_class("electric-opened")
        else:
            self.box.remove_class("electric-opened")

    def _opened(self) -> None:
        if self.ref is not None:
            self._on_open(self.ref)

    def _ticked(self) -> None:
        if self.ref is not None and not self._showing:
            self._on_tick(self.ref, self.tick.value)
