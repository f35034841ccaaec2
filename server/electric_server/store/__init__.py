"""Stores: the durable per-entity streams (SQLite embedded; PostgreSQL later)."""
