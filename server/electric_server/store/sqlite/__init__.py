"""The embedded default store: one SQLite file in WAL mode (``store.SQLiteStore``)."""

from .store import MAX_COMMIT_DELAY_MS, SCHEMA, SQLiteStore, now_ms

__all__ = ["MAX_COMMIT_DELAY_MS", "SCHEMA", "SQLiteStore", "now_ms"]
