"""The durability contract, run against the SQLite and PostgreSQL adapters."""

from collections.abc import Mapping
from typing import Any

import pytest

from flowvault.adapters.postgres import PostgresSecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application.testing import DurabilityContract


class TestSQLiteDurability(DurabilityContract):
    """Units the SQLite adapter acknowledged survive a killed writer."""

    def store_factory(self) -> tuple[str, Mapping[str, Any]]:
        self.path = self.tmp_path / "data" / "store.db"
        spec = "flowvault.adapters.sqlite:SQLiteSecureObjectStore.open"
        return spec, {"path": str(self.path), "create": True}

    def open_store(self) -> SQLiteSecureObjectStore:
        return SQLiteSecureObjectStore.open(self.path, create=True)


@pytest.mark.postgres
class TestPostgresDurability(DurabilityContract):
    """Units the PostgreSQL adapter acknowledged survive a killed writer (fresh schema per test)."""

    @pytest.fixture(autouse=True)
    def _server(self, postgres_server) -> None:
        self.server = postgres_server

    def store_factory(self) -> tuple[str, Mapping[str, Any]]:
        self.schema = self.server.new_schema()
        kwargs = {"dsn": self.server.dsn, "schema": self.schema, "pool_size": 1, "create": True}
        return "flowvault.adapters.postgres:PostgresSecureObjectStore.open", kwargs

    def open_store(self) -> PostgresSecureObjectStore:
        return PostgresSecureObjectStore.open(
            self.server.dsn, schema=self.schema, pool_size=1, create=True
        )

    def discard_store(self) -> None:
        self.server.drop_schema(self.schema)
