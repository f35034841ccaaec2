"""The streaming commands: `events` (a page, or ``--follow`` live), `watch` (entity states live) and
`wait` (until an entity reaches a state).

Every record is printed and flushed as it arrives. ``events --follow`` ends
with exit 0 when the entity's stream closes (stopped or killed); both end on
Ctrl-C, which main.py turns into exit 130: the SDK's sync iterators cancel
their pending step when the wait is interrupted, so nothing is left running.
"""

from __future__ import annotations

import argparse
import json
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from .. import errors
from ..lifecycle import STATE_RULES, State
from ..models import Entity, EntityChange, Event
from . import console, exit_codes, presence_cmds
from .commands import Invocation, duration_s, states_of

# ReadEvents pages; the server caps a page at 1000.
EVENTS_PAGE = 500
# The live table is redrawn at most this often, however fast changes arrive.
REDRAW_INTERVAL_S = 0.1
# How often the live table re-reads its entities' event counts (see LiveTable._count_loop).
EVENTS_REFRESH_S = 1.0


def events(ctx: Invocation, args: argparse.Namespace) -> int:
    def show(event: Event) -> None:
        if ctx.out.json_mode:
            ctx.out.record(event.to_json())
        else:
            ctx.out.line(console.event_line(event))

    limit: int | None = args.limit
    if args.follow:
        if limit == 0:
            return 0
        ctx.client.get(args.ref)  # fails fast (within --timeout) if the server or the entity is not there
        for count, event in enumerate(ctx.client.watch(args.ref, args.from_offset), start=1):
            show(event)
            if limit is not None and count >= limit:
                break
        return 0
    offset, remaining = args.from_offset, limit
    while remaining is None or remaining > 0:
        size = EVENTS_PAGE if remaining is None else min(EVENTS_PAGE, remaining)
        page = ctx.client.events(args.ref, offset, size)
        for event in page.events:
            show(event)
        if remaining is not None:
            remaining -= len(page.events)
        if not page.events or page.next_offset >= page.head_offset:
            break
        offset = page.next_offset
    return 0


def state(ctx: Invocation, args: argparse.Namespace) -> int:
    """The entity's durable state (``ctx.state``); with --watch, again after every change."""

    def show(collections: dict[str, Any]) -> None:
        if ctx.out.json_mode:
            ctx.out.record({"ref": args.ref, "state": collections})
        else:
            ctx.out.line(json.dumps(collections, indent=2, sort_keys=True))

    if not args.watch:
        show(ctx.client.state(args.ref))
        return 0
    ctx.client.get(args.ref)  # fails fast (within --timeout) if the server or the entity is not there
    for collections in ctx.client.watch_state(args.ref):
        show(collections)
    return 0


def watch(ctx: Invocation, args: argparse.Namespace) -> int:
    states = states_of(args)
    try:
        wanted = {State.parse(s) for s in states}
    except ValueError as exc:
        raise errors.InvalidArgument(str(exc), code="UNKNOWN_STATE") from None
    ctx.client.list(args.type, wanted, limit=1)  # fails fast (within --timeout) if the server is not there
    changes = _noting_unhosted(ctx, ctx.client.watch_entities(args.type, wanted))
    if ctx.out.json_mode or not ctx.out.stdout.isatty():
        changes = _new_only(changes)
    if ctx.out.json_mode:
        for change in changes:
            ctx.out.record(console.change_record(change))
    elif ctx.out.stdout.isatty():
        title = f"electric watch {ctx.options.address}" + (f" --type {args.type}" if args.type else "")
        title += "".join(f" --state {s.value}" for s in sorted(wanted, key=lambda s: s.value))
        with LiveTable(ctx.out.stdout, title, wanted, lambda: ctx.client.list(args.type, wanted)) as view:
            for change in changes:
                view.apply(change)
    else:
        for change in changes:
            ctx.out.line(console.change_line(change))
    return 0


def _new_only(changes: Iterable[EntityChange]) -> Iterator[EntityChange]:
    """The changes minus the snapshot rows a reconnect repeats: after a reconnect the SDK hands
    over a fresh snapshot, whose rows for entities already printed at that same transaction
    would print the whole list again. A row for an entity that changed meanwhile is kept."""
    printed: dict[str, int] = {}  # url → the txid of its last printed row
    for change in changes:
        url, txid = change.entity.ref.url, change.entity.txid
        if change.snapshot and printed.get(url) == txid:
            continue
        printed[url] = txid
        yield change


def _noting_unhosted(ctx: Invocation, changes: Iterable[EntityChange]) -> Iterator[EntityChange]:
    """The changes, with a note on stderr the first time an entity waits for a type no
    connected worker hosts (stderr: the table and the JSON lines on stdout stay as they are)."""
    hosted = presence_cmds.HostedTypes(ctx)
    for change in changes:
        note = hosted.note(change.entity)
        if note is not None:
            ctx.out.stderr.write(f"electric: warning: {note}\n")
            ctx.out.stderr.flush()
        yield change


# `electric wait` gives up after this long unless --timeout says otherwise.
DEFAULT_WAIT = "60s"


def wait(ctx: Invocation, args: argparse.Namespace) -> int:
    """Until the entity is in one of the states: exit 0 and print it; 124 when --timeout passes
    first; 4 (the state can no longer be reached) when it ends in another terminal state.

    Scripts and the README use it so that a step never depends on how fast it is typed: e.g.
    ``electric wait research/r1 running`` before a SIGINT meant for a run in progress."""
    try:
        wanted = {State.parse(s) for item in args.states for s in item.split(",") if s}
    except ValueError as exc:
        raise errors.InvalidArgument(str(exc), code="UNKNOWN_STATE") from None
    limit_s = duration_s(getattr(args, "timeout", None) or DEFAULT_WAIT, "--timeout")
    ref = ctx.client.get(args.ref).ref  # fails fast if the server or the entity is not there
    entity = _wait_for(ctx, ref.url, wanted, limit_s)
    if entity is None:
        names = " or ".join(sorted(s.value for s in wanted))
        limit = getattr(args, "timeout", None) or DEFAULT_WAIT
        ctx.out.stderr.write(f"electric: {ref.url} did not become {names} within {limit}\n")
        return exit_codes.TIMEOUT
    if entity.state not in wanted:
        raise errors.InvalidSignal(
            f"{ref.url} is {entity.state.value}, a final state: it will never be "
            + " or ".join(sorted(s.value for s in wanted)),
            code="STATE_UNREACHABLE",
        )
    if ctx.out.json_mode:
        ctx.out.record(entity.to_json())
    else:
        ctx.out.line(f"{ref.url} {entity.state.value}")
    return 0


def _wait_for(ctx: Invocation, url: str, wanted: set[State], limit_s: float) -> Entity | None:
    """The entity once it is wanted or final; None when ``limit_s`` passed first.

    The watch runs on a thread of its own and this one waits for its answer with a deadline, so
    the limit holds whatever the watch is doing (reconnecting, say); Ctrl-C still ends the wait."""
    answers: queue.Queue[Entity | BaseException] = queue.Queue()

    def follow() -> None:
        try:
            for change in ctx.client.watch_entities(url.strip("/").split("/")[0]):
                entity = change.entity
                if entity.ref.url == url and (entity.state in wanted or STATE_RULES[entity.state].terminal):
                    answers.put(entity)
                    return
            answers.put(errors.Unavailable("the server ended the watch"))
        except BaseException as exc:  # handed to the waiting thread, which raises it
            answers.put(exc)

    threading.Thread(target=follow, name="electric-wait", daemon=True).start()
    try:
        answer = answers.get(timeout=limit_s)
    except queue.Empty:
        return None
    if isinstance(answer, BaseException):
        raise answer
    return answer


class LiveTable:
    """The TTY view of `electric watch`: one row per entity, redrawn when a change arrives.

    The watch loop (main thread) applies changes; a drawing thread redraws the
    screen when something changed, at most every REDRAW_INTERVAL_S, so a large
    snapshot arriving row by row is drawn a few times, not once per row.
    """

    HEADERS = ("URL", "STATE", "LAST CHANGE", "EVENTS", "UPDATED")

    def __init__(
        self,
        stream: TextIO,
        title: str,
        wanted: Iterable[State],
        fetch: Callable[[], Sequence[Entity]] | None = None,
    ) -> None:
        self._stream = stream
        self._fetch = fetch
        self._title = title
        self._wanted = frozenset(wanted)
        self._rows: dict[str, tuple[Entity, str]] = {}
        self._in_snapshot = False
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._draw_loop, name="electric-watch-draw", daemon=True)
        self._counter = threading.Thread(target=self._count_loop, name="electric-watch-events", daemon=True)

    def __enter__(self) -> LiveTable:
        self._changed.set()
        self._thread.start()
        if self._fetch is not None:
            self._counter.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._changed.set()
        self._thread.join(timeout=5)
        if self._counter.is_alive():
            self._counter.join(timeout=5)

    def count(self, entities: Sequence[Entity]) -> None:
        """Newer records of shown entities (a list call's): their EVENTS and UPDATED move on."""
        with self._lock:
            for entity in entities:
                row = self._rows.get(entity.ref.url)
                if row is not None and entity.txid > row[0].txid and entity.state is row[0].state:
                    self._rows[entity.ref.url] = (entity, row[1])
                    self._changed.set()

    def _count_loop(self) -> None:
        # The watch carries state changes only; messages and events append without one, so the
        # EVENTS column would stand still. A list call now and then moves it on.
        assert self._fetch is not None
        while not self._stop.wait(EVENTS_REFRESH_S):
            try:
                self.count(self._fetch())
            except errors.ElectricError:
                continue  # the watch itself reports a server that went away

    def apply(self, change: EntityChange) -> None:
        entity = change.entity
        with self._lock:
            if change.snapshot and not self._in_snapshot:
                self._rows.clear()  # a fresh snapshot (after a reconnect) replaces the view
            self._in_snapshot = change.snapshot
            if self._wanted and entity.state not in self._wanted:
                self._rows.pop(entity.ref.url, None)  # it left the --state filter
            else:
                self._rows[entity.ref.url] = (entity, console.transition(change))
        self._changed.set()

    def render(self) -> str:
        with self._lock:
            rows = [
                [url, e.state.value, last, str(e.head_offset), console.when(e.updated_at)]
                for url, (e, last) in sorted(self._rows.items())
            ]
        now = console.when(datetime.now(UTC))
        head = f"{self._title} · {len(rows)} entities · {now} · Ctrl-C to quit"
        return f"{head}\n\n{console.table(self.HEADERS, rows, frozenset({3}))}\n"

    def _draw_loop(self) -> None:
        while not self._stop.is_set():
            self._changed.wait()
            self._changed.clear()
            # Home, clear the screen, draw: one write, so the screen never shows half a table.
            self._stream.write("\x1b[H\x1b[2J" + self.render())
            self._stream.flush()
            self._stop.wait(REDRAW_INTERVAL_S)
