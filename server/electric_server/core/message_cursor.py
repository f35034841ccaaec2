"""Which of an entity's messages are done and which wait: the record's message bookkeeping.

Messages run one at a time, in stream order, except one sent ahead of the queue. The entity's
record (store/base.py) keeps

- ``message_cursor``: the offset from which messages are not yet done, and
  ``cursor_attempt``: how many runs were started for the message at the cursor;
- ``cancelled_messages``: offsets past the cursor of messages cancelled before
  their run started (a scoped SIGINT, ARCHITECTURE §5). They are never
  delivered, and a run of one is refused: cancelled stays cancelled, across
  pauses, lost workers and server restarts;
- ``last_message_offset``: the newest message not cancelled. The entity has a
  message waiting while it is at or past the cursor (an idle entity wakes for it);
- ``run_key``: the message whose run the lease's runtime started and let the server
  abort (``RuntimeWrite.server_may_abort``). While its run is in progress (the
  cursor's attempt > 0) a SIGINT aborts it in the SIGINT's own commit (``aborted``):
  the cursor moves on, and the key stays until the runtime records that run's end,
  with its partial output (``awaiting_record``), or the lease ends;
- ``run_version``: the code version the run at the cursor started on, while it is in
  flight (``bound_version``); an attempt delivered again is bound to it, and while no lease
  holds the entity the run waits for a worker of that version (``waiting_for``);
- ``ahead_offset``: a message sent ahead of the queue (``sent_ahead``: an ``interrupt`` or
  ``rollback`` that aborted the run in progress, a reply to ``ctx.ask``) whose run has not
  started. Until it starts, no other message's run may (``behind``). Its start moves the cursor
  to it and keeps where the queue it passed resumes (``resume_offset``); once its run is done,
  it joins the done-past-the-cursor offsets (``cancelled_messages``) and the cursor goes back
  there. So the cursor is always the message in flight or next, and the ones between
  ``resume_offset`` and the cursor still wait (``floor``). ``resume_last`` is the newest of
  them (``last_message_offset`` again once the one sent ahead is done, if it was the newest).

Every write that moves them goes through this module; nothing else does arithmetic on them.
"""

from __future__ import annotations

from dataclasses import dataclass

from electric_sdk.lifecycle import STATE_RULES, MessageProgress

from ..store.base import EntityRecord, Ref, Store

__all__ = [
    "Located",
    "aborted",
    "at_cursor",
    "awaiting_record",
    "behind",
    "beyond",
    "bound_version",
    "cancelled",
    "deliverable",
    "ended",
    "floor",
    "forked",
    "locate",
    "progress",
    "refuses_start",
    "run_in_progress",
    "sent",
    "sent_ahead",
    "started",
    "waiting",
    "waiting_for",
]

_PAGE = 1000


@dataclass(frozen=True, slots=True)
class Located:
    """A message looked up by key among the messages not done when the lookup read the stream.

    Events never change once written, and the cursor only moves on: what the lookup found
    still holds inside the write that uses it (``progress`` judges it against the record then).
    """

    key: str
    # Its offset; None if it is not among them (its run ended long ago, or there is no such message).
    offset: int | None
    # Every message's offset from the cursor up to the named one (its predecessors still waiting).
    earlier: tuple[int, ...] = ()


async def locate(store: Store, ref: Ref, key: str) -> Located:
    """Find message ``key`` from the entity's cursor on (a scoped signal's message)."""
    record = await store.get_entity(ref)
    if record is None:
        return Located(key, None)
    earlier: list[int] = []
    offset = floor(record)
    while offset < record.head_offset:
        page = await store.read_events(ref, offset, _PAGE)
        for event in page:
            if event.kind != "message":
                continue
            if event.key == key:
                return Located(key, event.offset, tuple(earlier))
            earlier.append(event.offset)
        if len(page) < _PAGE:
            break
        offset = page[-1].offset + 1
    return Located(key, None)


async def at_cursor(store: Store, ref: Ref) -> Located | None:
    """The message at the entity's cursor, if a run of it is in flight (its record may have moved
    on by the time a write uses this: ``Located.offset`` says which message it was)."""
    record = await store.get_entity(ref)
    if record is None or record.cursor_attempt == 0:
        return None
    page = await store.read_events(ref, record.message_cursor, 1)
    if not page or page[0].kind != "message":
        return None
    return Located(page[0].key, page[0].offset)


def progress(record: EntityRecord, located: Located) -> MessageProgress:
    """How far the located message has got, by the record as it is now."""
    offset = located.offset
    if offset is None or offset < floor(record) or offset in record.cancelled_messages:
        return MessageProgress.ENDED
    if offset == record.message_cursor and record.cursor_attempt > 0:
        return MessageProgress.STARTED
    return MessageProgress.QUEUED


def forked(record: EntityRecord, offset: int) -> EntityRecord:
    """A fork's new record, whose stream holds its origin's events before ``offset``: none of
    their messages is its to run (core/forks.py), so its cursor starts there, with none waiting
    and no question of theirs awaiting a reply."""
    return record.replace(
        message_cursor=offset,
        cursor_attempt=0,
        last_message_offset=-1,
        awaiting_run="",
        ahead_offset=-1,
        resume_offset=-1,
        resume_last=-1,
    )


def sent(record: EntityRecord, events_before: int = 0, ahead: bool = False) -> EntityRecord:
    """A message is about to be appended, after ``events_before`` other events of its write (it
    gets the head offset plus those); ``ahead``: ahead of the queue (see the module docstring),
    which changes nothing when none waits, and is refused while a message sent ahead runs (it
    goes to the back: the order stays one a reader can tell from the stream)."""
    offset = record.head_offset + events_before
    if ahead and record.message_waiting and record.resume_offset < 0:
        record = record.replace(ahead_offset=offset, resume_last=record.last_message_offset)
    return record.replace(last_message_offset=offset)


def sent_ahead(record: EntityRecord) -> bool:
    """Whether the message just ``sent`` went ahead of the queue."""
    return record.ahead_offset == record.last_message_offset


def started(
    record: EntityRecord, offset: int, attempt: int, abortable_key: str = "", code_version: str = ""
) -> EntityRecord:
    """A run of the message at ``offset`` started (``refuses_start`` and ``behind`` said yes): the
    cursor moves to it. Messages run in order, so any between the old cursor and it were cancelled,
    unless it was sent ahead of them (they then wait for its run to be done). ``abortable_key``:
    its message's key, if the server may abort the run (else ""); ``code_version``: the version this
    attempt started on, which binds the run (one replayed on newer code is bound to that)."""
    if offset < record.message_cursor:
        return record
    if offset == record.ahead_offset and offset > record.message_cursor:
        # It goes ahead of the messages from the cursor on: they, and which of them are done,
        # wait until its run is.
        record = record.replace(resume_offset=record.message_cursor, ahead_offset=-1)
        kept = record.cancelled_messages
    elif record.resume_offset >= 0:  # the one sent ahead, again (its lease was lost): as it was
        kept = record.cancelled_messages
    else:
        kept = tuple(o for o in record.cancelled_messages if o > offset)
        if offset == record.ahead_offset:
            record = record.replace(ahead_offset=-1, resume_last=-1)
    return record.replace(
        message_cursor=offset,
        cursor_attempt=attempt,
        cancelled_messages=kept,
        run_key=abortable_key,
        run_version=code_version,
        waiting_since_ms=None,
    )


def bound_version(record: EntityRecord) -> str:
    """The code version the run in flight is bound to; "" if none is in flight, or it started on
    a worker that named no version."""
    return record.run_version if record.cursor_attempt > 0 else ""


def waiting_for(record: EntityRecord, live: bool) -> str:
    """The code version the entity's run waits for: bound, no live (``live``) runtime holds it
    (the entity went idle when its runtime was lost, or was paused since), and it is not shutting
    down (a SIGTERM's cleanup runs on the version new wakes get); "" none."""
    if live or record.closed or STATE_RULES[record.state].shutting_down:
        return ""
    return bound_version(record)


def ended(record: EntityRecord, offset: int, key: str = "") -> EntityRecord:
    """A run of the message at ``offset`` (key ``key``) ended. Only the message at the cursor moves
    it; the end of a run the server aborted is the record it awaited."""
    if key and key == record.run_key:
        record = record.replace(run_key="")
    if offset != record.message_cursor:
        return record
    return _tidy(_past_cursor(record))


def run_in_progress(record: EntityRecord, live: bool) -> bool:
    """Whether the server knows a run it may abort is in progress: one its live (``live``)
    runtime started with ``server_may_abort`` and has not ended."""
    return live and bool(record.run_key) and record.cursor_attempt > 0


def aborted(record: EntityRecord) -> EntityRecord:
    """A SIGINT aborted the run in progress (``run_in_progress``): its message, at the cursor, is
    done; ``run_key`` stays until the runtime records the run's end (``awaiting_record``)."""
    return _tidy(_past_cursor(record))


def awaiting_record(record: EntityRecord) -> bool:
    """Whether a run the server aborted still awaits its end's record (``run_key`` names it)."""
    return bool(record.run_key) and record.cursor_attempt == 0


def cancelled(record: EntityRecord, located: Located) -> EntityRecord:
    """The located message is cancelled (``progress`` was not ENDED): it is done, and never delivered."""
    offset = located.offset
    assert offset is not None
    if offset == record.message_cursor:
        record = _past_cursor(record)
    else:
        record = record.replace(cancelled_messages=tuple(sorted({*record.cancelled_messages, offset})))
    lowest = floor(record)
    waiting_before = [o for o in located.earlier if o >= lowest and o not in record.cancelled_messages]
    if record.last_message_offset == offset:
        # The newest message waiting is now the newest earlier one not done; none: nothing waits.
        record = record.replace(last_message_offset=max(waiting_before, default=record.message_cursor - 1))
    if record.resume_last == offset:  # the same, for the queue a message sent ahead passed
        record = record.replace(resume_last=max(waiting_before, default=-1))
    return _tidy(record)


def _past_cursor(record: EntityRecord) -> EntityRecord:
    """The message at the cursor is done: the cursor moves on, or back to the queue a message
    sent ahead of it passed (that message is then done past the cursor)."""
    if record.resume_offset < 0:
        return record.replace(message_cursor=record.message_cursor + 1, cursor_attempt=0)
    done = tuple(sorted({*record.cancelled_messages, record.message_cursor}))
    last = record.last_message_offset
    if last == record.message_cursor:  # it was the newest: the newest of the queue it passed waits
        last = record.resume_last
    return record.replace(
        message_cursor=record.resume_offset,
        resume_offset=-1,
        resume_last=-1,
        last_message_offset=last,
        cursor_attempt=0,
        cancelled_messages=done,
    )


def floor(record: EntityRecord) -> int:
    """The offset from which messages may still wait: the cursor's, or, while a message sent
    ahead of the queue runs, where the queue it passed resumes."""
    return record.resume_offset if record.resume_offset >= 0 else record.message_cursor


def _tidy(record: EntityRecord) -> EntityRecord:
    """Forget cancelled messages the cursor has passed; when nothing waits, every message past
    the cursor was cancelled, and the cursor moves past them all."""
    if record.cursor_attempt == 0 and (record.run_version or record.waiting_since_ms is not None):
        record = record.replace(run_version="", waiting_since_ms=None)  # no run is in flight: none binds
    lowest = floor(record)
    if record.ahead_offset >= 0 and (
        record.ahead_offset < lowest or record.ahead_offset in record.cancelled_messages
    ):
        record = record.replace(ahead_offset=-1, resume_last=-1)  # it was cancelled
    kept = tuple(o for o in record.cancelled_messages if o >= lowest)
    if kept and not waiting(record) and record.resume_offset < 0:
        return record.replace(message_cursor=kept[-1] + 1, cursor_attempt=0, cancelled_messages=())
    if kept != record.cancelled_messages:
        return record.replace(cancelled_messages=kept)
    return record


def refuses_start(record: EntityRecord, offset: int) -> str | None:
    """Why a run of the message at ``offset`` may not start (it is done, or was cancelled); None: it may."""
    if offset in record.cancelled_messages:
        return f"the message at offset {offset} was cancelled before its run started"
    if offset < floor(record):
        return f"the message at offset {offset} is done (its run ended, or it was cancelled)"
    return None


def behind(record: EntityRecord, offset: int) -> str | None:
    """Why a run of the message at ``offset`` (not done) may not start yet: a message sent ahead of
    the queue runs first, or runs now. None: it may."""
    if record.ahead_offset >= 0 and offset != record.ahead_offset:
        return f"the message at offset {record.ahead_offset} was sent ahead of it and runs first"
    if record.resume_offset >= 0 and offset != record.message_cursor:
        return f"the message at offset {record.message_cursor} was sent ahead of it and runs now"
    return None


def beyond(record: EntityRecord, offset: int) -> str | None:
    """Why no message can be at ``offset`` (once ``refuses_start`` said yes): every message not
    done is at most the newest not cancelled. A run there would move the cursor past the real
    ones, never run, as if cancelled. None: it may be one."""
    newest = record.last_message_offset
    if offset <= newest:
        return None
    return f"no message waits at offset {offset} (none is past offset {newest})"


def deliverable(record: EntityRecord, offset: int) -> bool:
    """Whether the message at ``offset`` is to be delivered (it is not done)."""
    return offset >= floor(record) and offset not in record.cancelled_messages


def waiting(record: EntityRecord) -> bool:
    """Whether a message waits to be run (an idle entity wakes for it)."""
    return record.message_waiting
