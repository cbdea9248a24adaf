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
