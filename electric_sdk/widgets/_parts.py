"""Pieces both widgets are built from: the lifecycle buttons and a confirmation step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from ..lifecycle import Signal
from ._live import UiThread
from ._view import SIGNAL_BUTTONS, note_html


def signal_button(signal: Signal, *, compact: bool = False) -> Any:
    """A button for one of the six lifecycle signals, disabled until the state is known."""
    label, tooltip, style = SIGNAL_BUTTONS[signal]
    button = widgets.Button(
        description=label,
        tooltip=tooltip,
        button_style=style,
        disabled=True,
        layout=widgets.Layout(width="76px" if compact else "92px"),
    )
    button.add_class(f"electric-{signal.value.lower()}")
    return button


class Confirm:
    """A question with a confirm and a cancel button, hidden until ``ask``."""

    def __init__(self, ui: UiThread, confirm_label: str) -> None:
        self.question = widgets.HTML()
        self.confirm = widgets.Button(description=confirm_label, button_style="danger")
        self.cancel = widgets.Button(description="Cancel")
        self.confirm.add_class("electric-confirm")
        self.box = widgets.HBox(
            [self.question, self.confirm, self.cancel], layout=widgets.Layout(display="none")
        )
        self._action: Callable[[], None] | None = None
        self.confirm.on_click(ui.handler(self._confirmed))
        self.cancel.on_click(ui.handler(self.dismiss))

    @property
    def widgets(self) -> list[Any]:
        return [self.question, self.confirm, self.cancel, self.box]

    @property
    def asking(self) -> bool:
        return self._action is not None

    def ask(self, question: str, action: Callable[[], None]) -> None:
        self._action = action
        self.question.value = note_html(question)
        self.box.layout.display = "flex"

    def dismiss(self) -> None:
        self._action = None
        self.box.layout.display = "none"

    def _confirmed(self) -> None:
        action = self._action
        self.dismiss()
        if action is not None:
            action()
