"""Use cases and the ports they stand on.

Hosts import ports and unit-of-work values from here; adapters implement
the ports; the contract kit lives in ``flowvault.application.testing``.
"""

from flowvault.application._cursor import ListCursor, effective_limit
from flowvault.application._guards import check_append, check_delete, check_upsert
from flowvault.application._records import (
    MAX_LABEL_TEXT,
    MAX_LABELS,
    MAX_LIST_LIMIT,
    MAX_PAYLOAD_BYTES,
    Delete,
    ExpectedRevision,
    FilterOp,
    Guard,
    LabelFilter,
    LabelValue,
    LedgerPage,
    LedgerTrim,
    Order,
    RecordMetadata,
    RecordPage,
    StoredRecord,
    UnitOfWork,
    Upsert,
)
from flowvault.application.ports import Clock, IdFactory, SecureObjectStore

__all__ = [
    "MAX_LABELS",
    "MAX_LABEL_TEXT",
    "MAX_LIST_LIMIT",
    "MAX_PAYLOAD_BYTES",
    "Clock",
    "Delete",
    "ExpectedRevision",
    "FilterOp",
    "Guard",
    "IdFactory",
    "LabelFilter",
    "LabelValue",
    "LedgerPage",
    "LedgerTrim",
    "ListCursor",
    "Order",
    "RecordMetadata",
    "RecordPage",
    "SecureObjectStore",
    "StoredRecord",
    "UnitOfWork",
    "Upsert",
    "check_append",
    "check_delete",
    "check_upsert",
    "effective_limit",
]
