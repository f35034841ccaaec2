"""Stores: the durable per-entity streams, embedded (SQLite) or on a database server (PostgreSQL).

Here, what both share: the contract (``base``), the rows and what a decided
write becomes (``rows``, ``outcome``), the group committer and the interface a
backend gives it (``committer``, ``transaction``), what a fault means for
writes (``faults``), the fast paths' protocol and switches (``fastpath``),
the session book and the reads every SQL store answers alike. Each backend
is a package of thin parts: ``sqlite/`` and ``postgres/``.
"""
