"""The pure core of flowvault: no I/O, no clock, no randomness.

Everything a host needs from the domain is importable from here.
"""

from flowvault.domain._canonical import (
    MAX_DEPTH,
    MAX_SAFE_INTEGER,
    JsonValue,
    canonical_bytes,
    canonical_json,
    content_hash,
    digest_bytes,
    parse_json,
    validate_json,
)
from flowvault.domain._envelope import (
    AAD_FORMAT,
    Digest,
    EnvelopeHeader,
    KeyId,
    Namespace,
    Sensitivity,
    UtcDatetime,
    format_instant,
    natural_key_digest,
)
from flowvault.domain._errors import (
    FlowvaultError,
    IdempotencyConflict,
    IntegrityFailure,
    InvalidDefinition,
    InvalidInput,
    InvalidTransition,
    NotFound,
    PayloadTooLarge,
    RevisionConflict,
    StoreBusy,
    StoreUnavailable,
)
from flowvault.domain._fingerprint import Fingerprint, Readability, Receipt
from flowvault.domain._ledger import (
    GENESIS_HASH,
    ChainDefect,
    ChainVerdict,
    LedgerEvent,
    verify_chain,
)
from flowvault.domain._sanitise import REDACTED, is_secret_key, sanitise_payload
from flowvault.domain._state_machine import DEFAULT_LIFECYCLE, StateMachine, StateMachineJson

__all__ = [
    "AAD_FORMAT",
    "DEFAULT_LIFECYCLE",
    "GENESIS_HASH",
    "MAX_DEPTH",
    "MAX_SAFE_INTEGER",
    "REDACTED",
    "ChainDefect",
    "ChainVerdict",
    "Digest",
    "EnvelopeHeader",
    "Fingerprint",
    "FlowvaultError",
    "IdempotencyConflict",
    "IntegrityFailure",
    "InvalidDefinition",
    "InvalidInput",
    "InvalidTransition",
    "JsonValue",
    "KeyId",
    "LedgerEvent",
    "Namespace",
    "NotFound",
    "PayloadTooLarge",
    "Readability",
    "Receipt",
    "RevisionConflict",
    "Sensitivity",
    "StateMachine",
    "StateMachineJson",
    "StoreBusy",
    "StoreUnavailable",
    "UtcDatetime",
    "canonical_bytes",
    "canonical_json",
    "content_hash",
    "digest_bytes",
    "format_instant",
    "is_secret_key",
    "natural_key_digest",
    "parse_json",
    "sanitise_payload",
    "validate_json",
    "verify_chain",
]
