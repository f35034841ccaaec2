"""Helpers shared by the tests (plain functions; fixtures live in conftest.py)."""

from __future__ import annotations

import re
import subprocess
import threading
from typing import Any

import anyio
import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


def error_info(exc: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    """The single google.rpc.ErrorInfo of a failed call, from domain electric.v1."""
    status = rpc_status.from_call(exc)
    assert status is not None, f"no rich status on {exc.code()}: {exc.details()}"
    infos = []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            infos.append(info)
    assert len(infos) == 1, f"expected one ErrorInfo in {status}"
    assert infos[0].domain == "electric.v1"
    return infos[0]


class OutputPump:
    """A child's stdout read line by line on a thread of its own, so its pipe never fills while the
    test does other things; ``wait_for`` returns once a line matches (woken by each new line, not
    by polling) or fails when the child ends first or ``timeout_s`` passes."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._ended = False
        self._changed = threading.Condition()
        threading.Thread(target=self._pump, name="output-pump", daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def text(self) -> str:
        with self._changed:
            return "".join(self.lines)

    def ended(self, timeout_s: float) -> str:
        """All the child printed, once its output ended (it exited, or closed it)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._ended, timeout_s):
                raise AssertionError(f"the output did not end within {timeout_s} s:\n{self.text()}")
            return "".join(self.lines)

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        found: list[re.Match[str]] = []

        def matched() -> bool:
            found.extend(m for line in self.lines if (m := re.search(pattern, line)))
            return bool(found) or self._ended

        with self._changed:
            self._changed.wait_for(matched, timeout_s)
        if not found:
            raise AssertionError(f"no line matched {pattern!r}:\n{self.text()}")
        return found[0]


async def lock_waiter(admin: Any) -> int:
    """The pid of the backend that waits for a row lock (the store's), once there is one."""
    with anyio.fail_after(10):
        while True:
            pid = await admin.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            if pid is not None:
                return int(pid)


def emitter_app() -> Any:
    """An app whose entity ``emitter`` emits an event of its message's text as its type, and
    answers with the error's code if that raised InvalidArgument, else ``kept``."""
    from electric_sdk.errors import InvalidArgument
    from electric_sdk.runtime import App, Context, Message

    app = App(code_version="test")

    @app.entity("emitter")
    async def emitter(ctx: Context, message: Message) -> str:
        try:
            await ctx.emit(message.text, {"x": 1})
        except InvalidArgument as exc:
            return f"{exc.code}: {exc}"
        return "kept"

    return app
