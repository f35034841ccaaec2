"""The PostgreSQL store, for one or many server replicas on one database (``store.PostgresStore``)."""

from .store import PostgresStore

__all__ = ["PostgresStore"]
