"""The gRPC door: the grpc.aio server on ``--listen``, its guard and auth, and its acceptors.

A component of the server (app.py), entered in two steps so that a refused start serves nothing:
entering binds the port (a ConfigError when it cannot), and ``serve`` registers the services and
starts serving once every other component has started. ``stop`` (the drain's) stops accepting
and lets in-flight calls finish within the grace; leaving stops it at once if the drain did not.

grpc.aio keeps the socket a server bound, and the poller it made for the bind, until that server
has started and stopped (grpcio 1.85: neither ``stop`` nor the garbage collector lets go of an
unstarted server's). So one that never served is started with no service registered (every call
is UNIMPLEMENTED, for the instant it lives) and stopped at once: a refused start leaves no socket.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

import grpc

from ..config_error import ConfigError
from ..core.auth import TokenTable
from ..fastpaths.acceptors import Acceptors, quiet_abandoned_writes
from .auth import AuthInterceptor
from .handlers import guard_server

# The services a door serves: registered on its server (after the guard and the acceptors, which
# record them) just before it starts.
Services = Callable[[grpc.aio.Server], None]


class GrpcDoor:
    def __init__(
        self,
        listen: str,
        *,
        tls: tuple[bytes, bytes] | None = None,
        tokens: TokenTable | None = None,
        acceptors_per_method: int = 0,
    ) -> None:
        self.listen = listen
        self._tls = tls  # (key, certificate)
        interceptors = [AuthInterceptor(tokens)] if tokens else []
        self.server = grpc.aio.server(
            interceptors=interceptors,  # no maximum_concurrent_rpcs: Acceptors bypass grpc's limiter
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", 4 * 1024 * 1024),
                # Clients ping every 30 s to keep quiet watches alive, and workers every
                # second to notice a dead replica (runtime/worker.py); accept that (no
                # strike limit) rather than cutting them with "too many pings".
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.max_ping_strikes", 0),
            ],
        )
        self.acceptors = Acceptors(self.server, interceptors, acceptors_per_method)
        quiet_abandoned_writes()  # a client that walks away is no error of the server's
        guard_server(self.server)  # after Acceptors: they record the guarded handlers
        self.port = 0
        self._served = False
        self._stopped = False

    async def __aenter__(self) -> GrpcDoor:
        try:
            if self._tls is not None:
                self.port = self.server.add_secure_port(self.listen, grpc.ssl_server_credentials([self._tls]))
            else:
                self.port = self.server.add_insecure_port(self.listen)
        except RuntimeError:  # grpc raises instead of returning 0 when the bind fails
            self.port = 0
        if not self.port:
            await self.stop(0)  # the poller grpc made for the bind (see the module's docstring)
            why = "invalid TLS certificate or key, " if self._tls else ""
            raise ConfigError(f"cannot listen on {self.listen} ({why}address in use or not local?)")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop(0)

    async def serve(self, services: Services) -> None:
        """Register ``services`` and serve them, with the acceptors."""
        services(self.server)
        self._served = True
        await self.server.start()
        self.acceptors.start()

    async def stop(self, grace_s: float) -> None:
        """Stop accepting; calls in flight finish within ``grace_s``, then are cancelled. Safe to repeat."""
        if self._stopped:
            return
        self._stopped = True
        if not self._served:
            await self.server.start()  # with no service: see the module's docstring
        await self.server.stop(grace_s)
        await self.acceptors.wait_closed()
