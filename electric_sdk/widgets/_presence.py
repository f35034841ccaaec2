"""The entity panel's notice that no connected worker hosts the entity's type.

Its own small part of ``EntityControl``: judged by the rule `electric get` uses
(``presence.entity_unhosted``, on the entity as the server reads it), on the
client's loop when the entity's state changes (a worker connecting moves it out
of ``spawning``) and, while the state alone cannot say (``idle``), at each of
its events; shown on the widgets' thread.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from .. import errors
from ..client import AsyncClient
from ..lifecycle import State, needs_runtime
from ..models import EntityRef
from ..presence import entity_unhosted, hosted_types, state_decides, unhosted_note
from ._view import error_html


class HostingNotice:
    def __init__(self) -> None:
        self.html: Any = widgets.HTML()
        self.html.add_class("electric-unhosted")
        self.text = ""  # written on the client's loop, shown by ``show``
        self._checked: State | None = None
        self._judged: tuple[State, bool] | None = None  # the state and message_waiting last judged

    async def check(self, aio: AsyncClient, ref: EntityRef, state: State | None) -> None:
        """On the client's loop, after each event: judge again as `electric get` does
        (``presence.entity_unhosted``) when the state changed, or at any event while the state
        alone cannot say (an idle entity waits once a message waits for it)."""
        if state is None or (state is self._checked and state_decides(state)):
            return
        self._checked = state
        if not needs_runtime(state, message_waiting=True):  # it waits for no worker, whatever waits
            self.text, self._judged = "", None
            return
        entity = await aio.get(ref)
        judged = (entity.state, entity.raw.message_waiting)
        if judged == self._judged:
            return  # nothing the rule reads changed: the worker list is not read again
        try:
            types = hosted_types(await aio.workers())
        except errors.ServerError as exc:
            if exc.status != "UNIMPLEMENTED":  # a server older than ListWorkers says nothing
                raise
            return
        self._judged = judged
        self.text = unhosted_note(ref.type) if entity_unhosted(entity, types) else ""

    def show(self) -> None:
        """On the widgets' thread."""
        self.html.value = error_html(self.text) if self.text else ""
