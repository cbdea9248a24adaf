"""The contract kit: port conformance suites and fakes for host test suites.

Needs only the ``testing`` extra (pytest, hypothesis). Subclass a
``*Contract`` class in a ``test_*.py`` module and fill its hooks::

    class TestMyStore(SecureObjectStoreContract):
        def make_store(self) -> MyStore:
            return MyStore(self.tmp_path / "store.db")

Select the capabilities your adapter implements by the classes you name:
``StoreStatsContract`` in place of the base (it includes it), and beside it
a mixin per capability offered (``StoreEpochContract``,
``StreamCatalogContract``, ``SealCounterContract``, ``RecordLockContract``,
``StoreClockContract``, ``StoreFillContract``, ``LabelListingContract``,
``LabelLoadContract``, ``BatchLoadContract``)::

    class TestMyStore(StoreStatsContract, StoreEpochContract, StreamCatalogContract):
        def make_store(self) -> MyStore: ...

``SealedRepositoryContract`` (two more hooks, the ciphers) plants forgeries
through your store. docs/adapters.md lists what each proves and what a
store without it loses.
"""

from flowvault.application.testing._batch_load_contract import BatchLoadContract
from flowvault.application.testing._catalog_contract import StreamCatalogContract
from flowvault.application.testing._durability_contract import DurabilityContract
from flowvault.application.testing._fakes import (
    FrozenClock,
    SequentialIds,
    make_event,
    make_header,
    make_upsert,
)
from flowvault.application.testing._label_listing_contract import LabelListingContract
from flowvault.application.testing._label_load_contract import LabelLoadContract
from flowvault.application.testing._record_lock_contract import RecordLockContract
from flowvault.application.testing._seal_counter_contract import SealCounterContract
from flowvault.application.testing._sealed_contract import SealedRepositoryContract
from flowvault.application.testing._store_clock_contract import StoreClockContract
from flowvault.application.testing._store_contract import (
    SecureObjectStoreContract,
    StoreStatsContract,
)
from flowvault.application.testing._store_epoch_contract import StoreEpochContract
from flowvault.application.testing._store_fill_contract import StoreFillContract

__all__ = [
    "BatchLoadContract",
    "DurabilityContract",
    "FrozenClock",
    "LabelListingContract",
    "LabelLoadContract",
    "RecordLockContract",
    "SealCounterContract",
    "SealedRepositoryContract",
    "SecureObjectStoreContract",
    "SequentialIds",
    "StoreClockContract",
    "StoreEpochContract",
    "StoreFillContract",
    "StoreStatsContract",
    "StreamCatalogContract",
    "make_event",
    "make_header",
    "make_upsert",
]
