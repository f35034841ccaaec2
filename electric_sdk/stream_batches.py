"""Coalescing queued runtime-session messages into one stream message.

Both ends of a worker's session (``RuntimeService.Connect``) queue their
messages and send them from one task. Each stream message costs tens of
microseconds of gRPC machinery on each side, whatever it carries, so when a
fan-out has queued thousands (a deploy's SIGHUP to every entity: a delivery,
a write, its result and a release per entity), the sender takes what is
queued behind the first message and sends it as one ``RequestBatch`` /
``ResponseBatch``. At light load the queue holds one message and it goes
out alone, so latency is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol, TypeVar

# Far below gRPC's default 4 MiB receive limit, even with one large message past the mark.
MAX_BATCH_BYTES: Final = 512 * 1024
MAX_BATCH_ITEMS: Final = 1000


class _Sized(Protocol):
    def ByteSize(self) -> int: ...


M = TypeVar("M", bound=_Sized)


class Empty:
    """What a ``poll`` returns when nothing more is queued."""


EMPTY: Final = Empty()


def coalesce(first: M, poll: Callable[[], M | Empty | None], wrap: Callable[[list[M]], M]) -> tuple[M, bool]:
    """``first`` and whatever is queued behind it, as one message.

    ``poll`` returns the next queued message without waiting, ``EMPTY`` when
    there is none, or None (the queue's end-of-stream mark). Returns the
    message to send and whether the end was reached.
    """
    items = [first]
    size = first.ByteSize()
    ended = False
    while len(items) < MAX_BATCH_ITEMS and size < MAX_BATCH_BYTES:
        item = poll()
        if isinstance(item, Empty):
            break
        if item is None:
            ended = True
            break
        items.append(item)
        size += item.ByteSize()
    return (first if len(items) == 1 else wrap(items)), ended
