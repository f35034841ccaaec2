"""Clients: AsyncClient (grpc.aio) and Client (sync facade on a portal thread)."""

from ._async import AsyncClient
from ._options import ClientOptions, RetryPolicy
from ._sync import Client

__all__ = ["AsyncClient", "Client", "ClientOptions", "RetryPolicy"]
