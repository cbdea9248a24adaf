"""The store contract, run against the in-memory reference adapter."""

from flowvault.adapters.memory import InMemorySecureObjectStore
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


class TestInMemorySecureObjectStore(
    StoreStatsContract,
    StreamCatalogContract,
    SealCounterContract,
    StoreEpochContract,
    StoreFillContract,
    LabelListingContract,
    LabelLoadContract,
    BatchLoadContract,
):
    """The memory adapter passes the whole store contract."""

    def make_store(self) -> InMemorySecureObjectStore:
        return InMemorySecureObjectStore()
