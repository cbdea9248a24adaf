"""The store contract, run against the SQLite adapter on a real file."""

from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application.testing import (
    SealCounterContract,
    StoreStatsContract,
    StreamCatalogContract,
)


class TestSQLiteSecureObjectStore(StoreStatsContract, StreamCatalogContract, SealCounterContract):
    """The SQLite adapter passes the whole store contract."""

    def make_store(self) -> SQLiteSecureObjectStore:
        return SQLiteSecureObjectStore.open(self.tmp_path / "data" / "store.db")
