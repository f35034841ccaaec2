"""The record's message bookkeeping (server/electric_server/core/message_cursor.py), write by write.

Each test walks an entity's messages through the writes that move the cursor — a message
sent, a run started or ended, a message cancelled by a scoped SIGINT — and checks what the
record then says: which message is delivered, which run may start, whether one waits (an
idle entity wakes for it). The end-to-end view (a real CLI, worker and server) is in
tests/runtime/test_headless.py.
"""

from __future__ import annotations

from electric_server.core import message_cursor as mc
from electric_server.store.base import EntityRecord

from electric_sdk.lifecycle import MessageProgress, State

# Events 0..9; messages at the offsets the tests name.
BLANK = EntityRecord("t", "e", State.RUNNING, 1, 1, 0, 0, 0, False, None, 0, message_cursor=1)


def sent(record: EntityRecord, *offsets: int) -> EntityRecord:
    for offset in offsets:
        record = mc.sent(record.replace(head_offset=offset))
    return record.replace(head_offset=max(offsets) + 1)


def located(key_offset: int, *earlier: int) -> mc.Located:
    return mc.Located(f"msg_{key_offset}", key_offset, earlier)


def test_a_message_cancelled_at_the_cursor_is_done_and_nothing_waits() -> None:
    record = sent(BLANK, 2)
    assert mc.progress(record, located(2)) is MessageProgress.QUEUED
    record = mc.cancelled(record, located(2))
    assert not mc.waiting(record)
    assert not mc.deliverable(record, 2)
    assert mc.refuses_start(record, 2) is not None
    assert mc.progress(record, located(2)) is MessageProgress.ENDED


def test_a_message_cancelled_behind_a_run_is_skipped_and_does_not_wake_the_entity() -> None:
    record = mc.started(sent(BLANK, 2, 5), 2, 1)
    assert mc.progress(record, located(2)) is MessageProgress.STARTED
    record = mc.cancelled(record, located(5, 2))
    assert record.cancelled_messages == (5,)
    assert mc.waiting(record)  # the run of 2 is not done
    assert not mc.deliverable(record, 5)
    assert mc.refuses_start(record, 5) is not None
    record = mc.ended(record, 2)
    # Nothing left but the cancelled one: the cursor passes it, and an idle entity stays idle.
    assert not mc.waiting(record)
    assert (record.message_cursor, record.cancelled_messages) == (6, ())
    assert mc.progress(record, located(5, 2)) is MessageProgress.ENDED


def test_an_earlier_message_still_waits_when_the_newest_is_cancelled() -> None:
    """The newest message is cancelled while an earlier one never started (its worker was lost
    before it began): the earlier one must still wake the entity and be delivered."""
    record = sent(BLANK, 2, 5)
    record = mc.cancelled(record, located(5, 2))
    assert record.last_message_offset == 2
    assert mc.waiting(record)
    assert mc.deliverable(record, 2)
    assert not mc.deliverable(record, 5)
    record = mc.ended(mc.started(record, 2, 1), 2)
    assert not mc.waiting(record)


def test_a_later_message_runs_past_a_cancelled_one() -> None:
    record = mc.started(sent(BLANK, 2, 4, 6), 2, 1)
    record = mc.cancelled(record, located(4, 2))
    assert mc.waiting(record)
    record = mc.ended(record, 2)
    assert record.cancelled_messages == (4,)
    assert mc.deliverable(record, 6)
    record = mc.started(record, 6, 1)
    assert (record.message_cursor, record.cancelled_messages) == (6, ())
    assert mc.refuses_start(record, 4) is not None  # behind the cursor: done


def test_a_run_lost_with_its_worker_counts_as_started_until_it_is_cancelled() -> None:
    record = mc.started(sent(BLANK, 2), 2, 1).replace(state=State.IDLE)
    assert mc.progress(record, located(2)) is MessageProgress.STARTED
    record = mc.cancelled(record, located(2))
    assert (record.message_cursor, record.cursor_attempt) == (3, 0)
    assert not mc.waiting(record)


def test_a_message_not_found_from_the_cursor_on_is_done() -> None:
    record = sent(BLANK, 2)
    assert mc.progress(record, mc.Located("msg_x", None)) is MessageProgress.ENDED


def test_a_run_the_server_may_abort_is_known_while_in_progress_and_awaits_its_record() -> None:
    record = mc.started(sent(BLANK, 2, 5), 2, 1, "msg_2")
    assert mc.run_in_progress(record, live=True)
    assert not mc.run_in_progress(record, live=False)  # its runtime is gone: the server cannot tell
    assert not mc.awaiting_record(record)
    record = mc.aborted(record)
    # The message is done at once; the next one waits; the run's own record is still to come.
    assert (record.message_cursor, record.cursor_attempt) == (3, 0)
    assert mc.progress(record, located(2)) is MessageProgress.ENDED
    assert mc.refuses_start(record, 2) is not None
    assert mc.waiting(record)
    assert not mc.run_in_progress(record, live=True)
    assert mc.awaiting_record(record)
    # Its runtime's end (ABORTED, with the partial output) is the record awaited.
    record = mc.ended(record, 2, "msg_2")
    assert not mc.awaiting_record(record)
    assert record.message_cursor == 3


def test_a_run_started_without_the_flag_is_never_the_servers_to_abort() -> None:
    record = mc.started(sent(BLANK, 2), 2, 1)
    assert not mc.run_in_progress(record, live=True)
    assert not mc.awaiting_record(record)
    record = mc.ended(record, 2, "msg_2")
    assert not mc.waiting(record)


# -- messages sent ahead of the queue (an aborting policy's, a reply) ---------------------------


def sent_ahead(record: EntityRecord, offset: int) -> EntityRecord:
    return mc.sent(record.replace(head_offset=offset), 0, ahead=True).replace(head_offset=offset + 1)


def interrupted() -> EntityRecord:
    """A run of 2 in progress, 4 and 5 queued behind it, then the run aborted (an interrupt)."""
    return mc.aborted(mc.started(sent(BLANK, 2, 4, 5), 2, 1, "msg_2"))


def test_a_message_sent_ahead_runs_first_then_the_queue_it_passed_in_order() -> None:
    record = sent_ahead(interrupted(), 7)
    assert mc.sent_ahead(record)
    assert mc.behind(record, 4) is not None
    assert mc.behind(record, 5) is not None
    assert mc.behind(record, 7) is None
    record = mc.started(record, 7, 1)
    assert (record.message_cursor, mc.floor(record)) == (7, 3)
    # The queue it passed still waits: delivered to a new lease, queued, refused until it is done.
    assert mc.deliverable(record, 4)
    assert mc.deliverable(record, 5)
    assert mc.progress(record, located(4)) is MessageProgress.QUEUED
    assert mc.refuses_start(record, 4) is None
    assert mc.behind(record, 4) is not None
    record = mc.ended(record, 7)
    assert (record.message_cursor, record.cancelled_messages) == (3, (7,))
    assert mc.progress(record, located(7, 4, 5)) is MessageProgress.ENDED
    assert not mc.deliverable(record, 7)
    assert mc.behind(record, 4) is None
    for offset in (4, 5):
        assert mc.waiting(record)
        record = mc.ended(mc.started(record, offset, 1), offset)
    assert not mc.waiting(record)  # the one sent ahead is done: nothing wakes an idle entity
    assert (record.message_cursor, record.cancelled_messages) == (8, ())


def test_a_message_sent_while_the_one_ahead_runs_waits_behind_the_queue_it_passed() -> None:
    record = mc.started(sent_ahead(interrupted(), 7), 7, 1)
    record = sent(record, 9)
    assert mc.behind(record, 9) is not None
    record = mc.ended(record, 7)
    for offset in (4, 5, 9):
        record = mc.ended(mc.started(record, offset, 1), offset)
    assert not mc.waiting(record)


def test_its_second_attempt_keeps_the_queue_it_passed() -> None:
    record = mc.started(sent_ahead(interrupted(), 7), 7, 1)
    record = mc.cancelled(record, located(4))  # a scoped SIGINT for a passed one
    record = mc.started(record, 7, 2)  # its lease was lost: delivered again
    assert (record.message_cursor, mc.floor(record), record.cancelled_messages) == (7, 3, (4,))
    record = mc.ended(record, 7)
    assert not mc.deliverable(record, 4)
    assert mc.deliverable(record, 5)


def test_the_newest_passed_message_cancelled_while_the_one_ahead_runs() -> None:
    record = mc.started(sent_ahead(interrupted(), 7), 7, 1)
    record = mc.cancelled(record, located(5, 4))
    record = mc.ended(record, 7)
    assert mc.waiting(record)
    record = mc.ended(mc.started(record, 4, 1), 4)
    assert not mc.waiting(record)  # 5 was cancelled, 7 is done


def test_a_message_sent_ahead_cancelled_before_its_run_frees_the_queue() -> None:
    record = sent_ahead(interrupted(), 7)
    record = mc.cancelled(record, located(7, 4, 5))
    assert record.ahead_offset == -1
    assert mc.behind(record, 4) is None
    assert record.last_message_offset == 5


def test_ahead_with_nothing_queued_or_while_one_ahead_runs_changes_nothing() -> None:
    record = sent_ahead(mc.aborted(mc.started(sent(BLANK, 2), 2, 1, "msg_2")), 4)
    assert not mc.sent_ahead(record)  # nothing waited before it: it is next anyway
    record = mc.started(sent_ahead(interrupted(), 7), 7, 1)
    record = sent_ahead(record, 9)
    assert not mc.sent_ahead(record)  # one sent ahead runs: this one goes to the back
    assert mc.behind(record, 9) is not None
