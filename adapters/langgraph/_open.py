"""Opening a sealed repository from a connection string, for ``from_conn_string``."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.adapters.system import SystemClock
from flowvault.application import SealedRepository, SecureObjectStore, StoreCapabilities
from flowvault.application._keys import KeyRing, check_key_matches
from flowvault.domain import InvalidInput


class HasRepository(Protocol):
    """What ``from_runtime`` needs of a flowvault runtime: its sealed repository."""

    @property
    def repository(self) -> SealedRepository: ...


def open_repository(conn_string: str, *, key: bytes, postgres_schema: str) -> SealedRepository:
    """Open (creating where needed) the store ``conn_string`` names, sealed under ``key``."""
    if not isinstance(conn_string, str) or not conn_string:
        raise InvalidInput("a connection string is a SQLite path, a PostgreSQL DSN or ':memory:'")
    cipher = AesGcmCipher.from_ring(KeyRing(primary=key))
    store: SecureObjectStore
    if conn_string == ":memory:":
        store = InMemorySecureObjectStore()
    elif conn_string.startswith(("postgresql://", "postgres://")):
        from flowvault.adapters.postgres import (  # noqa: PLC0415 - an optional extra
            PostgresSecureObjectStore,
        )

        store = PostgresSecureObjectStore.open(conn_string, schema=postgres_schema, create=True)
    else:
        store = SQLiteSecureObjectStore.open(Path(conn_string), create=True)
    try:
        capabilities = StoreCapabilities.of(store)
        if capabilities.stats is not None:
            check_key_matches(capabilities.stats.key_id_counts(), cipher.key_ids())
    except BaseException:
        store.close()
        raise
    return SealedRepository(store, cipher, SystemClock(), capabilities=capabilities)
