"""What a fault means for writes, once for every store: the policy from a backend's fault to a refusal.

A backend says what an exception *is* (its ``classify``: a ``StorageFault``
of one kind, or None for anything it does not know); this object decides
what that does to the store's writes, and tells the fault listeners (the
server's health and readiness):

- **Full** (``DiskFull``): the batch was rolled back, so nobody in it is
  acknowledged, published or shown to reads. Writes are *paused*: refused at
  once with ``DiskFull`` (queued ones too), reads go on. Every ``retry_s``
  the committer tries again with the backend's probe (``wait_for_room``),
  and once it works writes resume. A refused write costs nothing, so a flood
  of them cannot make the store spin. Logged once when it starts, once when
  it clears.
- **Failed** (``StorageFailed``) and **damaged** (``DamagedStore``): writes
  *stop for good*. After a failed sync the kernel may already have dropped
  the data, so retrying could report a write durable that is not: as
  PostgreSQL does on a failed fsync, the store acknowledges nothing more
  and the server stops. Logged once, as critical.
- **Busy** (``StoreBusy``): another process holds the database locked. The
  batch fails, logged, and the writer goes on.
- **Unavailable** (``DatabaseUnavailable``, ``WritesRefused``): a database
  server that cannot be reached, or takes no writes. The batch fails (the
  client retries); the backend has said why and follows the database
  (postgres/reachability.py), telling the listeners through ``tell``.
- **Anything else** is a bug or something unforeseen: logged with its
  traceback, the batch's writes fail with it (``INTERNAL``), and the writer
  goes on.

A read meets the same kinds (``read_fault``) but changes nothing: only
writes can tell a full disk has room again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from ..settings import DISK_FULL_RETRY
from .base import (
    DatabaseUnavailable,
    DiskFull,
    FaultListener,
    StorageFailed,
    StorageFault,
    StoreBusy,
)

__all__ = ["DISK_FULL_RETRY_S", "Classify", "Faults"]

log = logging.getLogger(__name__)

DISK_FULL_RETRY_S = DISK_FULL_RETRY.value / 1000

# A backend's fault predicates: the storage fault an exception is, or None for anything else.
Classify = Callable[[BaseException], StorageFault | None]


def _unknown(exc: BaseException) -> StorageFault | None:
    return None


class Faults:
    """See the module docstring. ``where`` names the storage in the log (a data directory, a
    redacted URL); ``classify`` is the backend's; ``retry_s`` how often a full disk is tried."""

    __slots__ = (
        "_classify",
        "_full_since",
        "_listeners",
        "_read_faults_logged",
        "_told",
        "failed",
        "refusal",
        "refuse_queued",
        "retry_s",
        "where",
    )

    def __init__(self, where: str, classify: Classify = _unknown, retry_s: float = DISK_FULL_RETRY_S) -> None:
        self.where = where
        self._classify = classify
        self.retry_s = retry_s
        # What writes are refused with right now (a full disk, or a failure for good), and the
        # failure for good if there was one: the store then takes no more writes.
        self.refusal: StorageFault | None = None
        self.failed: StorageFault | None = None
        self._full_since = 0.0
        # Fails every write queued and not yet applied (the committer's, once it is built).
        self.refuse_queued: Callable[[BaseException], None] = lambda error: None
        self._listeners: list[FaultListener] = []
        self._told: StorageFault | None = None
        self._read_faults_logged: set[type[StorageFault]] = set()

    def classify(self, exc: BaseException) -> StorageFault | None:
        """The storage fault ``exc`` is (a ``StorageFault`` is itself), else None."""
        if isinstance(exc, StorageFault):
            return exc
        return self._classify(exc)

    # -- the listeners ------------------------------------------------------------------------

    def subscribe(self, callback: FaultListener) -> Callable[[], None]:
        """``callback`` hears every change from now on, and at once why writes are refused, if
        they are (a disk already full when the store opened)."""
        self._listeners.append(callback)
        if self._told is not None:
            callback(self._told)
        return lambda: self._listeners.remove(callback)

    def tell(self, fault: StorageFault | None) -> None:
        """The listeners hear ``fault`` (None: all is well), unless it is what they heard last."""
        if fault is self._told:
            return
        self._told = fault
        for callback in tuple(self._listeners):
            try:
                callback(fault)
            except Exception:
                log.exception("a listener to the store's faults failed")

    # -- writes --------------------------------------------------------------------------------

    def write_fault(self, exc: BaseException, during: str) -> BaseException:
        """``exc`` met ``during`` a write's work: act on it (see the module docstring), and
        return what the writes it failed are told."""
        fault = self.classify(exc)
        if fault is None:
            log.error(
                "unexpected error in the store's writer during %s; the writer goes on", during, exc_info=exc
            )
            return exc
        if isinstance(fault, DatabaseUnavailable):  # its backend said why, and follows the database
            return fault
        if isinstance(fault, StoreBusy):  # another process's lock: this batch only
            log.error("%s during %s: its writes failed; the writer goes on", fault, during)
            return fault
        if isinstance(fault, DiskFull):
            return self._pause(fault, during)
        return self.stop(fault, during)

    def _pause(self, fault: DiskFull, during: str) -> StorageFault:
        if self.failed is not None:
            return self.failed.again()
        if self.refusal is None:
            log.error(
                "%s during %s: writes are refused (UNAVAILABLE/DISK_FULL) and reads go on. Free space "
                "on the file system of %s; writes resume by themselves (the store tries every %g s)",
                fault,
                during,
                self.where,
                self.retry_s,
            )
            self.refusal = fault
            self._full_since = time.monotonic()
            self.refuse_queued(fault)
            self.tell(fault)
        return fault.again()

    def stop(self, exc: BaseException, during: str, exc_info: BaseException | None = None) -> StorageFault:
        """Stop taking writes, for good (a failed sync is never retried, whatever it was)."""
        if self.failed is not None:
            return self.failed.again()
        fault = self.classify(exc)
        if fault is None or isinstance(fault, DiskFull):
            fault = StorageFailed(f"the storage of {self.where} failed ({type(exc).__name__}: {exc})")
        log.critical(
            "%s during %s: the store acknowledges no more writes, and the server stops. Check the "
            "disk and the file system of %s, then start the server again: it checks the files first",
            fault,
            during,
            self.where,
            exc_info=exc_info,
        )
        self.failed = self.refusal = fault
        self.refuse_queued(fault)
        self.tell(fault)
        return fault.again()

    def full_from_the_start(self, fault: DiskFull) -> None:
        """The disk was full as the store opened (its backend logged how it goes on): writes are
        refused until ``resume``."""
        self.refusal = fault
        self._full_since = time.monotonic()
        self.tell(fault)

    def resume(self) -> None:
        """The disk has room again: writes go on."""
        log.warning(
            "writes resume: the disk holding %s has room again (writes were refused for %.1f s)",
            self.where,
            time.monotonic() - self._full_since,
        )
        self.refusal = None
        self.tell(None)

    async def wait_for_room(self, woken: asyncio.Event, probe: Callable[[], Awaitable[None]]) -> None:
        """While writes are paused on a full disk, ``probe`` every ``retry_s`` (what the next
        batches need room for) until it works, or ``woken`` is set (the store closes or failed:
        no write is queued meanwhile). Returns at once while writes are not paused."""
        while self.refusal is not None and self.failed is None and not woken.is_set():
            try:
                await asyncio.wait_for(woken.wait(), self.retry_s)
            except TimeoutError:
                try:
                    await probe()
                except Exception as exc:
                    self.write_fault(exc, "a retry after the disk was full")  # still full, or worse
                else:
                    self.resume()

    # -- reads ---------------------------------------------------------------------------------

    def read_fault(self, exc: BaseException) -> BaseException:
        """What a read that met ``exc`` raises: a storage fault, logged once per kind."""
        fault = self.classify(exc)
        if fault is None:
            return exc
        if type(fault) not in self._read_faults_logged:
            self._read_faults_logged.add(type(fault))
            log.error("a read failed: %s", fault)
        return fault
