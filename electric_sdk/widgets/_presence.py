"""The entity panel's notice that no connected worker hosts the entity's type.

Its own small part of ``EntityControl``: read on the client's loop when the
entity's state changes (a worker connecting moves it out of ``spawning``),
shown on the widgets' thread.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from .. import errors
from ..client import AsyncClient
from ..lifecycle import State, needs_runtime
from ..models import EntityRef
from ..presence import hosted_types, unhosted, unhosted_note
from ._view import error_html


class HostingNotice:
    def __init__(self) -> None:
        self.html: Any = widgets.HTML()
        self.html.add_class("electric-unhosted")
        self.text = ""  # written on the client's loop, shown by ``show``
        self._checked: State | None = None

    async def check(self, aio: AsyncClient, ref: EntityRef, state: State | None) -> None:
        """On the client's loop: read the connected workers again if the state changed."""
        if state is None or state is self._checked:
            return
        self._checked = state
        if not needs_runtime(state, message_waiting=False):
            self.text = ""
            return
        try:
            types = hosted_types(await aio.workers())
        except errors.ServerError as exc:
            if exc.status != "UNIMPLEMENTED":  # a server older than ListWorkers says nothing
                raise
            return
        self.text = unhosted_note(ref.type) if unhosted(ref.type, state, types) else ""

    def show(self) -> None:
        """On the widgets' thread."""
        self.html.value = error_html(self.text) if self.text else ""
