"""A real electric server for your own tests: in-process, on a free loopback
port, with a temporary SQLite store. No mocks: your code talks gRPC to the
same server that runs in production.

Sync or async, in any test framework::

    from electric_sdk.testing import TestServer

    with TestServer() as server:
        client = server.client()          # a sync Client, closed with the server
        client.spawn("my_agent/a1")

With pytest, the fixtures ``electric_server`` and ``electric_client`` are there
once electric is installed (a ``pytest11`` plugin, ``electric_sdk.pytest_plugin``)::

    def test_kill(electric_client):
        electric_client.spawn("my_agent/a1")
        assert electric_client.kill("my_agent/a1").new_state.value == "killed"

The server runs on its own event-loop thread, so it works from sync tests and
from async ones (whatever their loop) alike. Keep durations short in tests:
``grace_period="50ms"``.

``replay(app, server=...)`` (or ``file=`` an ``electric export``) checks new
code against recorded runs, as ``electric replay-check`` does (docs/patches.md)::

    def test_new_code_replays_the_runs_in_flight():
        replay(app, server="127.0.0.1:7700").assert_replays()
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from ._portal import start_portal
from .client import AsyncClient, Client
from .runtime.app import App
from .runtime.harness import EntityHarness, HarnessRun, ManualClock
from .runtime.replay import DEFAULT_RUN_TIMEOUT_S, ReplayProblem, ReplayResult

__all__ = [
    "EntityHarness",
    "HarnessRun",
    "ManualClock",
    "ReplayProblem",
    "ReplayResult",
    "TestServer",
    "replay",
]


class TestServer:
    """Start with ``start()`` or ``with``; stop with ``stop()``. Safe to repeat.

    One server per data directory: starting a second on a ``data_dir`` that a
    server holds, in this process or another, raises ``DataDirLocked``.
    """

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self, data_dir: str | Path | None = None, **config: Any) -> None:
        self._own_dir = data_dir is None
        self.data_dir = (
            Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="electric-test-"))
        )
        self._config = config
        self._server: Any = None
        self._clients: list[Client] = []
        self._thread: threading.Thread | None = None
        self.address = ""
        self.http_address = ""

    def start(self) -> TestServer:
        if self._server is not None:
            return self
        from electric_server import ElectricServer, ServerConfig  # the server ships in this distribution

        config = ServerConfig(
            listen=self._config.pop("listen", "127.0.0.1:0"),
            data_dir=self.data_dir,
            drain_grace_s=self._config.pop("drain_grace_s", 0.5),
            **self._config,
        )
        self._portal, self._thread = start_portal("electric-test-server")

        async def start() -> Any:
            server = ElectricServer(config)
            await server.start()
            return server

        try:
            self._server = self._portal.call(start)
        except BaseException:  # e.g. DataDirLocked: another server uses data_dir; end the loop thread too
            self._portal.call(self._portal.stop)
            self._thread.join()
            raise
        self.address = self._server.address
        # The HTTP/JSON door's base URL (docs/http.md) when started with http="127.0.0.1:0"; else "".
        self.http_address = self._server.http.address if self._server.http is not None else ""
        return self

    @property
    def server(self) -> Any:
        """The running ``electric_server.ElectricServer`` (None before ``start`` and after ``stop``),
        for a test that looks inside it: ``server.watches.watching()``, ``server.store``."""
        return self._server

    def client(self, **options: Any) -> Client:
        """A sync Client for this server; closed when the server stops."""
        client = Client(self.address, **options)
        self._clients.append(client)
        return client

    def async_client(self, **options: Any) -> AsyncClient:
        """An AsyncClient bound to the calling event loop; close it yourself."""
        return AsyncClient(self.address, **options)

    def stop(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()
        if self._server is not None:
            server, self._server = self._server, None
            try:
                self._portal.call(server.stop, 0)
            finally:
                self._portal.call(self._portal.stop)
                assert self._thread is not None
                self._thread.join()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> TestServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def replay(
    app: App,
    *,
    server: TestServer | str | None = None,
    file: str | Path | None = None,
    types: Sequence[str] | None = None,
    all_runs: bool = False,
    run_timeout_s: float = DEFAULT_RUN_TIMEOUT_S,
    **client_options: Any,
) -> ReplayResult:
    """Replay ``app``'s code against the runs recorded on ``server`` (a ``TestServer`` or an
    address; by default its runs in flight, every started run with ``all_runs``) or in the
    ``electric export`` ``file``: every recorded step answered from its record, stopped at the
    first step that is not recorded (no step function runs). The result lists each run that
    would fail; ``result.assert_replays()`` fails the test with them. The code between steps runs:
    keep it free of side effects. ``client_options`` (``token=...``) go to the client. Runs on a
    loop thread of its own, so sync and async tests alike may call it."""
    from .runtime.replay_sources import replay_check

    if (server is None) == (file is None):
        raise ValueError("replay against a server or an export file: name one")
    address = server.address if isinstance(server, TestServer) else server

    async def check() -> ReplayResult:
        if file is not None:
            return await replay_check(
                app, file=Path(file), types=types, all_runs=all_runs, run_timeout_s=run_timeout_s
            )
        async with AsyncClient(address, **client_options) as client:
            return await replay_check(
                app, client=client, types=types, all_runs=all_runs, run_timeout_s=run_timeout_s
            )

    portal, thread = start_portal("electric-replay")
    try:
        return portal.call(check)
    finally:
        portal.call(portal.stop)
        thread.join()
