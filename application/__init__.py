"""Use cases and the ports they stand on.

Hosts import ports and unit-of-work values from here; adapters implement
the ports; the contract kit lives in ``flowvault.application.testing``.
"""

from flowvault.application._cursor import ListCursor, effective_limit
from flowvault.application._guards import check_append, check_delete, check_upsert
from flowvault.application._keys import (
    KEY_ENV,
    MASTER_KEY_BYTES,
    KeyStore,
    check_key_matches,
    encode_master_key,
    parse_master_key,
    resolve_master_key,
)
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
from flowvault.application._sealed import SEALED_BODY_VERSION, SealedDocument, SealedRepository
from flowvault.application.ports import Cipher, Clock, IdFactory, SecureObjectStore, StoreStats

__all__ = [
    "KEY_ENV",
    "MASTER_KEY_BYTES",
    "MAX_LABELS",
    "MAX_LABEL_TEXT",
    "MAX_LIST_LIMIT",
    "MAX_PAYLOAD_BYTES",
    "SEALED_BODY_VERSION",
    "Cipher",
    "Clock",
    "Delete",
    "ExpectedRevision",
    "FilterOp",
    "Guard",
    "IdFactory",
    "KeyStore",
    "LabelFilter",
    "LabelValue",
    "LedgerPage",
    "LedgerTrim",
    "ListCursor",
    "Order",
    "RecordMetadata",
    "RecordPage",
    "SealedDocument",
    "SealedRepository",
    "SecureObjectStore",
    "StoreStats",
    "StoredRecord",
    "UnitOfWork",
    "Upsert",
    "check_append",
    "check_delete",
    "check_key_matches",
    "check_upsert",
    "effective_limit",
    "encode_master_key",
    "parse_master_key",
    "resolve_master_key",
]
