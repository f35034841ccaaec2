"""How large a response the server builds, and how large one the SDK takes.

A page of events (``ReadEvents``) or a batch of them (``WatchEvents``) stops
growing once it holds ``PAGE_BYTES`` of events, and always holds at least
one, so no response exceeds ``PAGE_BYTES`` plus the largest event (about
130 KiB: a 64 KiB text, 64 KiB of data and a 1 KiB reason). The SDK's
channels accept ``RECEIVE_LIMIT_BYTES``, set here rather than left to gRPC's
default so the two cannot drift apart; ``tests/test_page_bytes.py`` checks
the largest page an entity can produce against it.
"""

from __future__ import annotations

from typing import Final

PAGE_BYTES: Final = 1024 * 1024
RECEIVE_LIMIT_BYTES: Final = 4 * 1024 * 1024

# Every SDK channel (clients and workers): keepalive pings so a quiet watch or
# session survives idle-connection reapers; no gRPC-level retries (the SDK's
# own retry policy decides what is safe to repeat); the receive limit above.
CHANNEL_OPTIONS: Final = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.enable_retries", 0),
    ("grpc.max_receive_message_length", RECEIVE_LIMIT_BYTES),
)
