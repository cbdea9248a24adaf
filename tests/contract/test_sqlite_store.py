"""The store contract, run against the SQLite adapter on a real file."""

from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import SecureObjectStore
from flowvault.application.testing import (
    BatchLoadContract,
    LabelListingContract,
    LabelLoadContract,
    SealCounterContract,
    StoreEpochContract,
    StoreFillContract,
    StoreStatsContract,
    StreamCatalogContract,
)


class TestSQLiteSecureObjectStore(
    StoreStatsContract,
    StreamCatalogContract,
    SealCounterContract,
    StoreEpochContract,
    StoreFillContract,
    LabelListingContract,
    LabelLoadContract,
    BatchLoadContract,
):
    """The SQLite adapter passes the whole store contract."""

    def make_store(self) -> SQLiteSecureObjectStore:
        return SQLiteSecureObjectStore.open(self.tmp_path / "data" / "store.db", create=True)

    def reopen_store(self, store: SecureObjectStore) -> SQLiteSecureObjectStore:
        assert isinstance(store, SQLiteSecureObjectStore)
        return SQLiteSecureObjectStore.open(store.path, create=True)
