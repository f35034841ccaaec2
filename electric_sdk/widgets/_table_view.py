"""What the entity table shows, computed from facts: no widget, no I/O.

The table holds the entities one ``WatchEntities`` stream brings (its server-side
``WatchFilter``: a type and states) and shows a page of those matching the person's
``TableQuery`` (type, state, whether final entities show, an id search, a sort). A
narrower query is applied here at once, on the rows already held; only a query the
stream does not cover needs a new stream (``WatchFilter.covers``). Which states are
final comes from ``electric_sdk.lifecycle``; whether a worker hosts a row's type from
``electric_sdk.presence``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from .._wire.times import to_iso
from ..lifecycle import TERMINAL_STATES, State
from ..models import Entity
from ..presence import hosted_mark, unhosted_note
from ._view import badge_html

# The final states, in the lifecycle's order, as the "show" box names them.
FINAL_STATES = tuple(s for s in State if s in TERMINAL_STATES)
LIVE_STATES = frozenset(State) - TERMINAL_STATES

# Sort orders: label, and the key that puts rows in that order.
SORTS: dict[str, tuple[str, Callable[[Entity], tuple[object, ...]]]] = {
    "newest": ("newest first", lambda e: (-e.created_at.timestamp(), e.ref.type, e.ref.id)),
    "changed": ("last change first", lambda e: (-e.updated_at.timestamp(), e.ref.type, e.ref.id)),
    "name": ("type, id", lambda e: (e.ref.type, e.ref.id)),
    # Each entity followed by its children (and theirs), by type and id: ``tree_order``.
    "tree": ("parent, children", lambda e: (e.ref.type, e.ref.id)),
}

# Columns after the id: header, width, alignment. The row's cells use the same.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("type", "96px", "left"),
    ("state", "96px", "left"),
    ("events", "64px", "right"),
    ("last change", "92px", "right"),
    ("age", "56px", "right"),
    ("worker", "64px", "center"),
    ("parent", "120px", "left"),
)


@dataclass(frozen=True)
class WatchFilter:
    """What one ``WatchEntities`` stream asks the server for: a type (None: all) and states
    (empty: all)."""

    type: str | None
    states: frozenset[State]

    def covers(self, other: WatchFilter) -> bool:
        """Whether every entity ``other`` would bring comes with this stream too."""
        same_type = self.type is None or self.type == other.type
        return same_type and (not self.states or (bool(other.states) and other.states <= self.states))


@dataclass(frozen=True)
class TableQuery:
    """What the person asked the table for. ``state`` None: every state, but the final ones
    only with ``show_final``; a final ``state`` shows its entities regardless."""

    type: str | None = None
    state: State | None = None
    show_final: bool = False
    search: str = ""
    sort: str = "newest"
    page: int = 0

    def watch_filter(self) -> WatchFilter:
        if self.state is not None:
            return WatchFilter(self.type, frozenset({self.state}))
        return WatchFilter(self.type, frozenset() if self.show_final else LIVE_STATES)

    def matches(self, entity: Entity) -> bool:
        if self.type is not None and entity.ref.type != self.type:
            return False
        if self.state is not None:
            if entity.state is not self.state:
                return False
        elif entity.state.terminal and not self.show_final:
            return False
        needle = self.search.strip().lower()
        return not needle or needle in f"{entity.ref.type}/{entity.ref.id}".lower()

    def rows_key(self) -> TableQuery:
        """The query without its page: what decides which rows match, and their order."""
        return replace(self, page=0)


def select(entities: Iterable[Entity], query: TableQuery) -> list[Entity]:
    """The entities matching ``query``, in its order."""
    key = SORTS.get(query.sort, SORTS["newest"])[1]
    matching = sorted((e for e in entities if query.matches(e)), key=key)
    return tree_order(matching) if query.sort == "tree" else matching


def tree_order(entities: Sequence[Entity]) -> list[Entity]:
    """``entities`` (in their order) as a tree: each followed by its children, depth first. An
    entity whose parent is not among them leads a tree of its own."""
    shown = {e.ref for e in entities}
    children: dict[object, list[Entity]] = {}
    for e in entities:
        if e.parent is not None and e.parent in shown and e.parent != e.ref:
            children.setdefault(e.parent, []).append(e)
    ordered: list[Entity] = []
    seen: set[object] = set()

    def walk(e: Entity) -> None:
        if e.ref in seen:  # no cycle can arise (a parent is set once), but a table must not hang
            return
        seen.add(e.ref)
        ordered.append(e)
        for child in children.get(e.ref, ()):
            walk(child)

    for e in entities:
        if e.parent is None or e.parent not in shown:
            walk(e)
    ordered.extend(e for e in entities if e.ref not in seen)
    return ordered


def tree_labels(ordered: Sequence[Entity]) -> dict[object, str]:
    """Each entity's id as the tree shows it, indented under its parent (``tree_order``'s
    order): ``└ a1`` for a child, ``  └ a11`` for a grandchild."""
    depth: dict[object, int] = {}
    labels: dict[object, str] = {}
    for e in ordered:
        level = depth.get(e.parent, -1) + 1 if e.parent is not None else 0
        depth[e.ref] = level
        labels[e.ref] = e.ref.id if level == 0 else "\u2003" * (level - 1) + "\u2514 " + e.ref.id
    return labels


@dataclass(frozen=True)
class Page:
    rows: tuple[Entity, ...]
    number: int  # zero-based, within 0..pages-1
    pages: int


def page_of(matching: Sequence[Entity], page: int, size: int) -> Page:
    pages = max(1, math.ceil(len(matching) / size))
    number = min(max(page, 0), pages - 1)
    return Page(tuple(matching[number * size : (number + 1) * size]), number, pages)


def ago(then: datetime, now: datetime) -> str:
    """``12s``, ``4m``, ``3h``, ``2d``: how long ago, in its largest whole unit."""
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _cell(text: str, width: str, align: str, *, column: str, title: str = "") -> str:
    tip = f" title='{html.escape(title, quote=True)}'" if title else ""
    return (
        f"<span class='electric-cell' data-col='{column}'{tip} style='display:inline-block;"
        f"width:{width};text-align:{align};overflow:hidden;text-overflow:ellipsis;"
        f"white-space:nowrap;vertical-align:middle'>{text}</span>"
    )


def header_html() -> str:
    cells = "".join(_cell(f"<b>{name}</b>", width, align, column=name) for name, width, align in COLUMNS)
    return f"<div class='electric-columns' style='font-size:12px;color:#495057'>{cells}</div>"


def state_html(entity: Entity) -> str:
    """The state's badge, and the code version its run waits for while it does (or the question
    its last run asked, while it awaits the reply)."""
    waiting = entity.waiting_for_code
    if not waiting and entity.awaiting_input is not None:
        question = html.escape(entity.awaiting_input.question)
        return f"{badge_html(entity.state)} <span style='font-size:11px;color:#6c757d'>awaiting input: {question}</span>"
    if not waiting:
        return badge_html(entity.state)
    return (
        f"{badge_html(entity.state)} <span class='electric-waiting' style='font-size:11px;color:#6c757d'>"
        f"waiting for code {html.escape(waiting)}</span>"
    )


def row_html(entity: Entity, hosted: frozenset[str] | None, now: datetime) -> str:
    """A row's cells after its id: type, state, events, last change, age, worker, parent."""
    if hosted is None:
        worker, tip = "?", "the connected workers are not known (yet)"
    else:
        worker = hosted_mark(entity, hosted)
        tip = {
            "yes": f"a connected worker hosts type {entity.ref.type!r}",
            "no": unhosted_note(entity.ref.type),
            "-": "it waits for no worker",
        }[worker]
    contents = (  # (html, tooltip), in the order of COLUMNS
        (html.escape(entity.ref.type), entity.ref.type),
        (
            state_html(entity),
            f"its run waits for code {entity.waiting_for_code}" if entity.waiting_for_code else "",
        ),
        (f"{entity.head_offset:,}", ""),
        (f"{ago(entity.updated_at, now)} ago", to_iso(entity.updated_at)),
        (ago(entity.created_at, now), to_iso(entity.created_at)),
        (f"<b style='color:#dc3545'>{worker}</b>" if worker == "no" else html.escape(worker), tip),
        (
            html.escape(f"{entity.parent.type}/{entity.parent.id}") if entity.parent else "",
            f"a child of {entity.parent.url}" if entity.parent else "",
        ),
    )
    cells = "".join(
        _cell(text, width, align, column=name, title=title)
        for (name, width, align), (text, title) in zip(COLUMNS, contents, strict=True)
    )
    return f"<div class='electric-cells' style='font-size:13px'>{cells}</div>"


def count_text(matching: int, loading: bool) -> str:
    """``1,234 entities``, and ``loading…`` until the stream covers the query."""
    text = f"{matching:,} entit{'y' if matching == 1 else 'ies'}"
    return text + (" · loading…" if loading else "")
