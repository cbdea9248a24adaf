"""The pure core of flowvault: no I/O, no clock, no randomness.

Everything a host needs from the domain is importable from here.
"""

from flowvault.domain._approvals import (
    Approval,
    ApprovalReceipt,
    ApprovalStatus,
    Checkpoint,
    CheckpointStatus,
    Witness,
)
from flowvault.domain._canonical import JsonValue, content_hash
from flowvault.domain._envelope import EnvelopeHeader
from flowvault.domain._errors import (
    ApprovalAlreadyDecided,
    ApprovalDecisionNotAllowed,
    ApprovalExpired,
    ApprovalRequestConflict,
    CheckpointConsumed,
    CheckpointIntegrityFailure,
    DecisionSignatureInvalid,
    DefinitionReferenced,
    FlowvaultError,
    IdempotencyConflict,
    InsecurePermissions,
    IntegrityFailure,
    IntegrityKeyRequired,
    InvalidDefinition,
    InvalidInput,
    InvalidTransition,
    KeyExhausted,
    KeyRequired,
    NotBound,
    NotFound,
    PayloadTooLarge,
    RevisionConflict,
    SchemaTooNew,
    StoreBusy,
    StoreNotEmpty,
    StoreRolledBack,
    StoreUnavailable,
)
from flowvault.domain._fingerprint import Fingerprint
from flowvault.domain._graph_runs import (
    DefinitionVersion,
    GraphRun,
    TerminalReceipt,
    parse_terminal_receipt,
)
from flowvault.domain._ledger import (
    LedgerEvent,
)
from flowvault.domain._state import ResetFingerprint, WorkflowResult, WorkflowState
from flowvault.domain._state_machine import StateMachine
from flowvault.domain._workflow import ActionResult, DecisionReceipt, WorkflowRecord, WorkOrder

__all__ = [
    "ActionResult",
    "Approval",
    "ApprovalAlreadyDecided",
    "ApprovalDecisionNotAllowed",
    "ApprovalExpired",
    "ApprovalReceipt",
    "ApprovalRequestConflict",
    "ApprovalStatus",
    "Checkpoint",
    "CheckpointConsumed",
    "CheckpointIntegrityFailure",
    "CheckpointStatus",
    "DecisionReceipt",
    "DecisionSignatureInvalid",
    "DefinitionReferenced",
    "DefinitionVersion",
    "EnvelopeHeader",
    "Fingerprint",
    "FlowvaultError",
    "GraphRun",
    "IdempotencyConflict",
    "InsecurePermissions",
    "IntegrityFailure",
    "IntegrityKeyRequired",
    "InvalidDefinition",
    "InvalidInput",
    "InvalidTransition",
    "JsonValue",
    "KeyExhausted",
    "KeyRequired",
    "LedgerEvent",
    "NotBound",
    "NotFound",
    "PayloadTooLarge",
    "ResetFingerprint",
    "RevisionConflict",
    "SchemaTooNew",
    "StateMachine",
    "StoreBusy",
    "StoreNotEmpty",
    "StoreRolledBack",
    "StoreUnavailable",
    "TerminalReceipt",
    "Witness",
    "WorkOrder",
    "WorkflowRecord",
    "WorkflowResult",
    "WorkflowState",
    "content_hash",
    "parse_terminal_receipt",
]
