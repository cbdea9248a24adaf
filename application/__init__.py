"""Use cases and the ports they stand on.

Hosts import ports and unit-of-work values from here; adapters implement
the ports; the contract kit lives in ``flowvault.application.testing``.
"""

from flowvault.application._action_results import ActionResultService
from flowvault.application._approval_expiry import ExpiryReport
from flowvault.application._approval_flow import ApprovalFlow, ApprovalOutcome
from flowvault.application._approval_receipts import SignedDecision
from flowvault.application._approvals import ApprovalService
from flowvault.application._archive import decode_archive, encode_archive, verify_signature
from flowvault.application._audit import AuditReport, LedgerAudit
from flowvault.application._backoff import RetryPolicy
from flowvault.application._blobs import BlobInfo, BlobStore, BlobWrite
from flowvault.application._capabilities import StoreCapabilities
from flowvault.application._checkpoints import CheckpointService
from flowvault.application._cursor import LabelCursor, ListCursor, effective_limit
from flowvault.application._definitions import DefinitionRegistry
from flowvault.application._evidence import EvidenceService
from flowvault.application._guards import check_append, check_delete, check_drop, check_upsert
from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._keys import KeyStore
from flowvault.application._lease_keeper import LeaseKeeper
from flowvault.application._paging import Page, UnreadableItem
from flowvault.application._receipts import ReceiptSigner, ReceiptVerifier, authenticate_terminal
from flowvault.application._records import (
    MAX_TAGS,
    Delete,
    FilterOp,
    Guard,
    LabelFilter,
    LedgerDrop,
    LedgerPage,
    LedgerTrim,
    Order,
    RecordFilter,
    RecordMetadata,
    RecordPage,
    StoreContents,
    StoredRecord,
    TagFilter,
    UnitOfWork,
    Upsert,
)
from flowvault.application._request_idempotency import IdempotencyService
from flowvault.application._retention import RetentionJob, RetentionReport
from flowvault.application._retention_policy import RetentionPolicy
from flowvault.application._run_service import RunService
from flowvault.application._runs import ResultRepository
from flowvault.application._scope_transfer import ScopeReport, add_scope_verified, read_scope
from flowvault.application._sealed import SealedBytes, SealedDocument, SealedRepository
from flowvault.application._state import HistoryEvent, StateRepository, StateSnapshot
from flowvault.application._stream_drops import DROP_REGISTRY, drop_unit
from flowvault.application._stream_writer import StreamWriter
from flowvault.application._streams import chained_event, mac_matches, trim_unit
from flowvault.application._terminal_receipts import TerminalReceipts
from flowvault.application._transfer import (
    ContentSummary,
    CopyReport,
    fill_verified,
    read_contents,
)
from flowvault.application._verified import verified_events, verified_page
from flowvault.application._workflow_events import WorkflowEventService
from flowvault.application._workflows import WorkflowService
from flowvault.application.ports import (
    MAX_LOAD_BATCH,
    BatchLoad,
    Cipher,
    Clock,
    Compactor,
    DecisionSignatures,
    IdFactory,
    LabelListing,
    LabelLoad,
    RecordLock,
    SealCounter,
    SecureObjectStore,
    StoreClock,
    StoreEpoch,
    StoreFill,
    StoreStats,
    StreamCatalog,
    StreamHeadBatch,
    StreamHeads,
    Vacuumer,
)

__all__ = [
    "DROP_REGISTRY",
    "MAX_LOAD_BATCH",
    "MAX_TAGS",
    "ActionResultService",
    "ApprovalFlow",
    "ApprovalOutcome",
    "ApprovalService",
    "AuditReport",
    "BatchLoad",
    "BlobInfo",
    "BlobStore",
    "BlobWrite",
    "CheckpointService",
    "Cipher",
    "Clock",
    "Compactor",
    "ContentSummary",
    "CopyReport",
    "DecisionSignatures",
    "DefinitionRegistry",
    "Delete",
    "EvidenceService",
    "ExpiryReport",
    "FilterOp",
    "Guard",
    "HistoryEvent",
    "IdFactory",
    "IdempotencyService",
    "KeyStore",
    "KeyedDigester",
    "LabelCursor",
    "LabelFilter",
    "LabelListing",
    "LabelLoad",
    "LeaseKeeper",
    "LedgerAudit",
    "LedgerDrop",
    "LedgerPage",
    "LedgerTrim",
    "ListCursor",
    "Order",
    "Page",
    "ReceiptSigner",
    "ReceiptVerifier",
    "RecordFilter",
    "RecordLock",
    "RecordMetadata",
    "RecordPage",
    "ResultRepository",
    "RetentionJob",
    "RetentionPolicy",
    "RetentionReport",
    "RetryPolicy",
    "RunService",
    "ScopeReport",
    "SealCounter",
    "SealedBytes",
    "SealedDocument",
    "SealedRepository",
    "SecureObjectStore",
    "SignedDecision",
    "StateRepository",
    "StateSnapshot",
    "StoreCapabilities",
    "StoreClock",
    "StoreContents",
    "StoreEpoch",
    "StoreFill",
    "StoreStats",
    "StoredRecord",
    "StreamCatalog",
    "StreamHeadBatch",
    "StreamHeads",
    "StreamWriter",
    "TagFilter",
    "TerminalReceipts",
    "UnitOfWork",
    "UnreadableItem",
    "Upsert",
    "Vacuumer",
    "WorkflowEventService",
    "WorkflowService",
    "add_scope_verified",
    "authenticate_terminal",
    "chained_event",
    "check_append",
    "check_delete",
    "check_drop",
    "check_upsert",
    "decode_archive",
    "drop_unit",
    "effective_limit",
    "encode_archive",
    "fill_verified",
    "mac_matches",
    "read_contents",
    "read_scope",
    "trim_unit",
    "verified_events",
    "verified_page",
    "verify_signature",
]
