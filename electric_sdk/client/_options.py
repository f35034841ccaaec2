"""Connection options shared by AsyncClient and Client (no I/O here)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta

from google.protobuf import duration_pb2

from .. import errors
from .._wire.times import duration_from_ms
from ..channels import check_address
from ..durations import parse_ms

DEFAULT_ADDRESS = "127.0.0.1:7700"
# Every call gets a deadline; generous enough for a group commit under load.
DEFAULT_TIMEOUT_S = 10.0

DurationLike = timedelta | float | int | str


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of UNAVAILABLE and DEADLINE_EXCEEDED: exponential backoff with
    jitter, bounded by attempts and total time. Mutations carry an idempotency
    key, so a retry after a lost response appends exactly once."""

    attempts: int = 6
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    total_s: float = 30.0


@dataclass(frozen=True)
class ClientOptions:
    # HOST:PORT, or several replicas' as "a:7700,b:7701" (or a list): see channels.py.
    address: str = field(default_factory=lambda: os.environ.get("ELECTRIC_ADDRESS", DEFAULT_ADDRESS))
    token: str | None = field(default_factory=lambda: os.environ.get("ELECTRIC_TOKEN") or None)
    # PEM root certificates; enables TLS. `tls=True` with no roots uses the system's.
    root_certificates: bytes | None = None
    tls: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # How long a watch keeps trying to reconnect before giving up.
    reconnect_s: float = 60.0

    def __post_init__(self) -> None:
        # Checked here, once, so that a bad value (a flag, an environment variable) is a clear
        # error before any call, not an exception from deep inside grpc at the first one.
        if self.token is not None and not all(" " <= c <= "~" for c in self.token):
            # Never echoed: it is a secret.
            raise errors.InvalidArgument(
                "the token must be printable ASCII: it is sent in the authorization header",
                code="INVALID_TOKEN",
            )
        if not isinstance(self.address, str):  # several replicas, as a list: kept as "a,b"
            object.__setattr__(self, "address", ",".join(self.address))
        try:
            self.address.encode("utf-8")
        except UnicodeEncodeError:
            raise errors.InvalidArgument(
                f"the address {self.address!r} is not valid UTF-8 text", code="INVALID_ADDRESS"
            ) from None
        check_address(self.address)  # a malformed address is refused here, before any call

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


def to_duration(value: DurationLike) -> duration_pb2.Duration:
    """timedelta, seconds (float/int) or a string like "500ms", "30s", "2m"."""
    if isinstance(value, timedelta):
        ms = round(value / timedelta(milliseconds=1))
    elif isinstance(value, str):
        ms = parse_ms(value)
    else:
        ms = round(float(value) * 1000)
    return duration_from_ms(ms)
