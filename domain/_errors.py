"""The flowvault error tree: one root, one stable machine code per class.

Messages are written for operators and must never carry payload plaintext,
key material or natural keys; structured ``details`` hold only safe values
(states, revisions, digests, counts, limits).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

DetailValue = str | int | bool | None


class FlowvaultError(Exception):
    """Root of every error flowvault raises on purpose."""

    code: ClassVar[str] = "FLOWVAULT_ERROR"

    def __init__(self, message: str, **details: DetailValue) -> None:
        super().__init__(message)
        self.message = message
        self.details: Mapping[str, DetailValue] = dict(details)

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class InvalidInput(FlowvaultError):
    """Raised when a caller passes malformed or out-of-profile input."""

    code = "INVALID_INPUT"


class PayloadTooLarge(InvalidInput):
    """Raised when a payload or document exceeds its documented size limit."""

    code = "PAYLOAD_TOO_LARGE"


class InvalidDefinition(InvalidInput):
    """Raised when a state machine definition is inconsistent."""

    code = "INVALID_DEFINITION"


class InvalidTransition(FlowvaultError):
    """Raised when the state machine forbids moving between two states."""

    code = "INVALID_TRANSITION"


class RevisionConflict(FlowvaultError):
    """Raised when a compare-and-swap guard does not match the stored revision."""

    code = "REVISION_CONFLICT"


class NotFound(FlowvaultError):
    """Raised when a record, stream or workflow that must exist does not."""

    code = "NOT_FOUND"


class IdempotencyConflict(FlowvaultError):
    """Raised when an idempotency key is reused with different content."""

    code = "IDEMPOTENCY_CONFLICT"


class IntegrityFailure(FlowvaultError):
    """Raised when stored data fails authentication or its hash chain breaks."""

    code = "INTEGRITY_FAILURE"


class StoreBusy(FlowvaultError):
    """Raised when the backing store stayed locked past its busy timeout."""

    code = "STORE_BUSY"


class StoreUnavailable(FlowvaultError):
    """Raised when the backing store cannot be opened or reached at all."""

    code = "STORE_UNAVAILABLE"


class KeyRequired(FlowvaultError):
    """Raised when sealed data exists but no key was found to open it."""

    code = "KEY_REQUIRED"


class InsecurePermissions(FlowvaultError):
    """Raised when a store or key file is open to other users; the message says how to fix it."""

    code = "INSECURE_PERMISSIONS"


class SchemaTooNew(FlowvaultError):
    """Raised when a store was written by a newer flowvault schema than this code knows."""

    code = "SCHEMA_TOO_NEW"


class NotBound(FlowvaultError):
    """Raised when code resolves the host's persistence but none is bound."""

    code = "NOT_BOUND"


class DefinitionReferenced(FlowvaultError):
    """Raised when deleting or silently replacing a definition that runs still reference."""

    code = "DEFINITION_REFERENCED"


class CheckpointIntegrityFailure(IntegrityFailure):
    """Raised when a checkpoint's digests or keyed integrity digest do not verify."""

    code = "CHECKPOINT_INTEGRITY_FAILURE"


class CheckpointConsumed(FlowvaultError):
    """Raised when a single-use checkpoint has already been consumed."""

    code = "CHECKPOINT_CONSUMED"


class IntegrityKeyRequired(FlowvaultError):
    """Raised when a durable checkpoint operation is attempted without an integrity key."""

    code = "INTEGRITY_KEY_REQUIRED"


class ApprovalRequestConflict(FlowvaultError):
    """Raised when a different approval is already pending for the same checkpoint and audience."""

    code = "APPROVAL_REQUEST_CONFLICT"


class ApprovalExpired(FlowvaultError):
    """Raised when a decision arrives after the approval's deadline; the expiry is recorded."""

    code = "APPROVAL_EXPIRED"


class ApprovalDecisionNotAllowed(FlowvaultError):
    """Raised when a decision is not one of the approval's allowed decisions."""

    code = "APPROVAL_DECISION_NOT_ALLOWED"


class ApprovalAlreadyDecided(FlowvaultError):
    """Raised when an approval that was already decided or expired receives a decision."""

    code = "APPROVAL_ALREADY_DECIDED"


class DecisionSignatureInvalid(FlowvaultError):
    """Raised when a decider with a registered key sends no signature, or one that fails.

    Once a decider has a public key on file, only decisions signed with
    its private key count as theirs, so an auditor can check them offline.
    """

    code = "DECISION_SIGNATURE_INVALID"


class StoreRolledBack(FlowvaultError):
    """Raised on opening a store older than this host has already seen it.

    Its commit count is below the high-water mark kept outside the store:
    an older copy of the database was put back over the live one, which
    silently loses every commit made since that copy.
    """

    code = "STORE_ROLLED_BACK"


class KeyExhausted(FlowvaultError):
    """Raised instead of sealing once a key has used its budget of random nonces.

    AES-GCM with random 96-bit nonces stays safe for 2^32 seals per key; past
    that a nonce collision, which leaks plaintext, is no longer negligible.
    """

    code = "KEY_EXHAUSTED"


class StoreNotEmpty(FlowvaultError):
    """Raised when a move or an import targets a store that already holds records, events or seals.

    A copy lands whole in an empty store, so what it writes is exactly the
    source: merged into existing records, streams or counts it would be
    neither the source nor the target.
    """

    code = "STORE_NOT_EMPTY"
