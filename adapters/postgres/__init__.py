"""The PostgreSQL adapter: a ``SecureObjectStore`` several hosts can share.

Open it with ``PostgresSecureObjectStore.open(dsn, schema=...)``; the schema
is created and migrated on first use. Needs the ``postgres`` extra
(psycopg 3 and psycopg-pool).
"""

from flowvault.adapters.postgres._connect import APPLICATION_NAME, check_schema_name
from flowvault.adapters.postgres._schema import SCHEMA_VERSION
from flowvault.adapters.postgres._store import ATTEMPTS, PostgresSecureObjectStore

__all__ = [
    "APPLICATION_NAME",
    "ATTEMPTS",
    "SCHEMA_VERSION",
    "PostgresSecureObjectStore",
    "check_schema_name",
]
