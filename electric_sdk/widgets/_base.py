"""What both widgets share: a live feed, a message line for feedback, sending signals, closing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import ipywidgets as widgets

from ..client import AsyncClient, Client
from ..lifecycle import Signal
from ..models import SignalManyResult, SignalResult
from ._live import ClientLoop, Feed, Source, UiThread, act
from ._view import (
    BUTTON_STAGE_WAIT_S,
    button_stage,
    describe,
    error_html,
    note_html,
    result_text,
    stages_text,
)


class LiveWidget(widgets.VBox):  # type: ignore[misc]  # ipywidgets ships no type hints
    """A VBox kept up to date by a ``Feed``; subclasses build their children, then ``_start``."""

    def __init__(self, client: Client | AsyncClient, *, throttle_s: float) -> None:
        super().__init__()
        self._client = ClientLoop(client)
        self._ui = UiThread()
        self._throttle_s = throttle_s
        self._closed = False
        self._owned: list[Any] = []
        self._feed: Feed | None = None
        # Feedback on the last action: what it did, or why it failed.
        self.message = self._own(widgets.HTML())

    def _own(self, widget: Any) -> Any:
        """Remember a child widget, to close it with this one."""
        self._owned.append(widget)
        return widget

    def _start(
        self, *sources: Source, ticking: Callable[[], bool] = lambda: False, tick_s: float | None = None
    ) -> None:
        self._feed = Feed(
            self._client,
            self._ui,
            interval_s=self._throttle_s,
            refresh=self._refresh,
            on_error=self._stream_failed,
            ticking=ticking,
            tick_s=tick_s,
        )
        self._feed.start(*sources)

    def _refresh(self) -> Callable[[], None]:
        """On the client's loop: take the latest facts; return how to show them."""
        raise NotImplementedError

    def _stream_failed(self, exc: BaseException) -> None:
        """On the client's loop: record why live updates stopped, to show it."""
        raise NotImplementedError

    def _say(self, html: str) -> None:
        if not self._closed:
            self.message.value = html

    def _send_signal(
        self,
        signal: Signal,
        call: Callable[[], Awaitable[SignalResult | SignalManyResult]],
    ) -> None:
        """Send a signal on the client's loop; its result or error appears on the message line,
        then, for one entity, how far it reached: its last stage (``button_stage``) is waited
        for, and the line says each stage reached or not (a stop button that says "stopped"
        only once the stream shows it)."""
        stage = button_stage(signal)

        def report(outcome: SignalResult | SignalManyResult | BaseException) -> None:
            if isinstance(outcome, BaseException):
                self._say(error_html(f"{signal.value}: {describe(outcome)}"))
                return
            text = result_text(outcome, signal)
            if stage is None or not isinstance(outcome, SignalResult):
                self._say(note_html(text))
                return
            self._say(note_html(f"{text}; waiting until {stage.value}…"))
            bound = None if signal is Signal.SIGTERM else BUTTON_STAGE_WAIT_S
            aio = self._client.aio
            act(self._client, self._ui, lambda: aio.wait_signal(outcome, stage, bound), reached)

        def reached(outcome: SignalResult | BaseException) -> None:
            if isinstance(outcome, BaseException):
                self._say(error_html(f"{signal.value}: {describe(outcome)}"))
            else:
                self._say(note_html(f"{result_text(outcome, signal)}: {stages_text(outcome)}"))

        self._say(note_html(f"sending {signal.value}…"))
        act(self._client, self._ui, call, report)

    # -- closing -------------------------------------------------------------------------------------

    def close(self, *, wait: bool = True) -> None:
        """Stop the live updates (waiting for the streams to end where it can, unless ``wait`` is
        False) and close the widgets."""
        self._ui.run(self._mark_closed)
        if self._feed is not None:
            # Not under the lock: the stream's last updates may be waiting for it.
            self._feed.close(timeout_s=5.0 if wait else 0.0)
        self._ui.run(self._close_widgets)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def streaming(self) -> bool:
        """Whether the live updates' streams are open on the client: from the first update until
        ``close()`` (which waits for them to end) or a stream error."""
        return self._feed is not None and not self._feed.stopped.is_set()

    def _mark_closed(self) -> None:
        self._closed = True

    def _close_widgets(self) -> None:
        for widget in self._owned:
            widget.close()
        super().close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
