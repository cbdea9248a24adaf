"""The PostgreSQL adapter: a ``SecureObjectStore`` several hosts can share.

Open it with ``PostgresSecureObjectStore.open(dsn, schema=...)``; the schema
is created only with ``create=True``, and migrated on open. Needs the ``postgres`` extra
(psycopg 3 and psycopg-pool).
"""

from flowvault.adapters.postgres._store import PostgresSecureObjectStore

__all__ = [
    "PostgresSecureObjectStore",
]
