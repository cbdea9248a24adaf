"""The store contract, run against the PostgreSQL adapter, one fresh schema per test."""

import pytest

from flowvault.adapters.postgres import PostgresSecureObjectStore
from flowvault.application import SecureObjectStore
from flowvault.application.testing import (
    BatchLoadContract,
    LabelListingContract,
    LabelLoadContract,
    RecordLockContract,
    SealCounterContract,
    StoreClockContract,
    StoreEpochContract,
    StoreFillContract,
    StoreStatsContract,
    StreamCatalogContract,
)

pytestmark = pytest.mark.postgres


class TestPostgresSecureObjectStore(
    StoreStatsContract,
    StreamCatalogContract,
    SealCounterContract,
    StoreEpochContract,
    RecordLockContract,
    StoreClockContract,
    StoreFillContract,
    LabelListingContract,
    LabelLoadContract,
    BatchLoadContract,
):
    """The PostgreSQL adapter passes the whole store contract."""

    @pytest.fixture(autouse=True)
    def _server(self, postgres_server) -> None:
        self.server = postgres_server

    def make_store(self) -> PostgresSecureObjectStore:
        self.schema = self.server.new_schema()
        return PostgresSecureObjectStore.open(
            self.server.dsn, schema=self.schema, pool_size=2, create=True
        )

    def reopen_store(self, store: SecureObjectStore) -> PostgresSecureObjectStore:
        return PostgresSecureObjectStore.open(
            self.server.dsn, schema=self.schema, pool_size=1, create=True
        )

    def close_store(self, store: SecureObjectStore) -> None:
        store.close()
        self.server.drop_schema(self.schema)
