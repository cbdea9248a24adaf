"""The SQLite adapter: a durable ``SecureObjectStore`` in one local database file.

Open it with ``SQLiteSecureObjectStore.open(path)``; the file and its
directory are created private (0600/0700), and refused when others can
reach them.
"""

from flowvault.adapters.sqlite._connect import ConnectOptions, Synchronous
from flowvault.adapters.sqlite._doctor import (
    DatabaseProbe,
    file_mode_check,
    probe_database,
)
from flowvault.adapters.sqlite._schema import SCHEMA_VERSION
from flowvault.adapters.sqlite._store import SQLiteSecureObjectStore

__all__ = [
    "SCHEMA_VERSION",
    "ConnectOptions",
    "DatabaseProbe",
    "SQLiteSecureObjectStore",
    "Synchronous",
    "file_mode_check",
    "probe_database",
]
