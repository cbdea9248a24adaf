"""The SQLite adapter: a durable ``SecureObjectStore`` in one local database file.

Open it with ``SQLiteSecureObjectStore.open(path)``; with ``create=True``
a missing file and its directory are created private (0600/0700). Both
are refused when others can reach them.
"""

from flowvault.adapters.sqlite._store import SQLiteSecureObjectStore

__all__ = [
    "SQLiteSecureObjectStore",
]
