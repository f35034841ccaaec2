"""Offline tools over a store: verify, backup and restore, export and import, the data directory.

They run beside or instead of a server (`electric verify`, `backup`,
`restore`, `export`, `import`) and share only the store with it; ``datadir``
is the data directory's layout and the lock that keeps it to one writer.
"""
