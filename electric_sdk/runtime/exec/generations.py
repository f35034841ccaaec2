"""What one exec host knows of its entity's generations, and how it learns it from the stream.

A generation is one start of the entity's process (on the posix backend, its
whole process group). The host numbers them on from the newest its stream
records; runs at most one (``child``); remembers the last that ended and how,
for the receipts of the acts it then refuses; and holds one it cannot prove
gone (``orphan``): never acted on, and no new generation starts while it may
run. A generation found running that another worker started is proved
(``evidence.prove``), taken over and shut down before a new one starts: one
entity never has two live generations on one host.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime

from .evidence import Evidence, prove
from .output import OutputPump
from .process import Adopted, Child, describe_status
from .receipts import ReceiptLog, Stored

__all__ = ["Generations"]


class Generations:
    __slots__ = (
        "_backend",
        "_receipts",
        "_start_refused",
        "child",
        "exited_in_session",
        "last",
        "last_status",
        "let_go",
        "number",
        "orphan",
        "pumps",
    )

    def __init__(self, backend: str, receipts: ReceiptLog) -> None:
        self._backend, self._receipts = backend, receipts
        self.number = 0  # the newest generation's number, started here or found in the stream
        self.child: Child | None = None
        # The last generation we know of and how it ended (None: never started, or still running).
        self.last: Evidence | None = None
        self.last_status: int | None = None
        # A stored generation this worker does not hold and cannot prove gone: never acted on, and no
        # new generation starts while it may run.
        self.orphan: Evidence | None = None
        # A generation taken over that could not be acted on after all: held (``orphan``) from then.
        self.let_go: Child | None = None
        self.exited_in_session = False
        self._start_refused = False  # said once while a held generation blocks new ones
        # The output of the newest generation started here: its exit waits for it to catch up.
        self.pumps: list[OutputPump] = []

    @property
    def alive(self) -> bool:
        return self.child is not None and not self.child.exited.is_set()

    @property
    def last_known(self) -> Evidence | None:
        """The generation a refused act names when none runs: the held one, else the last that ended."""
        return self.orphan or self.last

    def started(self, child: Child) -> None:
        """A new generation runs: its output pumps are added as they start."""
        self.child, self.pumps = child, []

    def ended(self, child: Child, status: int | None) -> None:
        """``child``'s generation is over (reaped, with ``status``)."""
        if self.child is child:
            self.child = None
            # A generation taken over ends to make room for ours; one of ours ending is an exit.
            self.exited_in_session = not child.adopted
        self.last, self.last_status = child.evidence, status

    def hold(self, child: Child) -> None:
        """A generation taken over could not be acted on: it is held from now on."""
        self.child, self.orphan, self.let_go = None, child.evidence, child

    def close(self) -> None:
        """Hosting ended: a generation let go keeps no pidfd of ours (it is never reaped here)."""
        if self.let_go is not None:
            self.let_go.close()

    async def recover(self, stored: Stored, adopt: Callable[[Adopted], None]) -> None:
        """Judge the last generation in the stream; one this worker does not hold is proved
        (``evidence.prove``): gone, it is recorded so; running, it is taken over (``adopt`` watches
        it; its shutdown comes before any new generation); unprovable, it is held and blocks new
        generations."""
        self.number = max(self.number, stored.newest)
        started = stored.started
        if started is not None and stored.ended:
            self.last, self.last_status = started, stored.exit_status
        if started is None or stored.ended:
            return
        proof = prove(started)
        by = started.worker_id or "another worker"
        if proof.gone is not None:
            self.last = started
            await self._receipts.write(
                "recover", "observed", evidence=started, reason=f"{started.describe()} is gone: {proof.gone}"
            )
        elif proof.pidfd is not None and self._backend == "posix":
            child = Adopted(started, proof.pidfd)
            child.graceful_issued = stored.graceful
            self.child = child
            adopt(child)
            await self._receipts.write(
                "recover", "issued", evidence=started, issued_at=datetime.now(UTC),
                reason=(
                    f"{started.describe()} is still running (proved: a pidfd opened, then its start time "
                    f"and boot id matched); started by {by}, which no longer holds it: this worker takes it "
                    "over, and its shutdown policy runs before any new generation starts"
                ),
            )  # fmt: skip
        else:
            if proof.pidfd is not None:  # running, but this backend has no way to act on it
                os.close(proof.pidfd)
            doubt = proof.doubt or f"the {self._backend} backend cannot take over a process it did not start"
            self.orphan = started
            await self._receipts.write(
                "recover", "held", evidence=started,
                reason=(
                    f"{started.describe()}, started by {by}, may still be running: {doubt}; "
                    "this worker never signals it, and starts no new generation while it may run"
                ),
            )  # fmt: skip

    async def recheck_orphan(self) -> bool:
        """No new generation beside a held one that may still run: the start is refused (said once),
        and the held one is looked at again; True once it is proved gone (messages queue meanwhile;
        SIGTERM and SIGKILL still end the entity)."""
        orphan = self.orphan
        assert orphan is not None
        proof = prove(orphan)
        if proof.pidfd is not None:
            os.close(proof.pidfd)
        if proof.gone is not None:
            self.orphan, self.last, self.last_status = None, orphan, None
            await self._receipts.write(
                "recover", "observed", evidence=orphan, reason=f"{orphan.describe()} is gone: {proof.gone}"
            )
            return True
        if not self._start_refused:
            self._start_refused = True
            doubt = proof.doubt or f"the {self._backend} backend cannot take it over"
            await self._receipts.write(
                "start", "refused", evidence=orphan,
                reason=(
                    f"no new generation while {orphan.describe()}, started by "
                    f"{orphan.worker_id or 'another worker'}, may still be running: {doubt}"
                ),
            )  # fmt: skip
        return False

    def nothing_sent(self) -> str:
        """Why an act found no generation of this worker's to act on."""
        if self.orphan is not None:
            return (
                f"this worker holds no generation: {self.orphan.describe()} was started by "
                f"{self.orphan.worker_id or 'another worker'} and cannot be proved here; nothing sent"
            )
        if self.last is not None:
            how = describe_status(self.last_status)
            return (
                f"no live generation: {self.last.describe()} ended ({how}) and was reaped; "
                f"pid {self.last.pid} is not signalled"
            )
        return "no process was ever started; nothing sent"
