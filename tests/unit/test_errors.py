"""The error tree: stable codes, one root, nothing secret in str or repr."""

from __future__ import annotations

import pytest

from flowvault import domain
from flowvault.domain import FlowvaultError

CODES = {
    "FlowvaultError": "FLOWVAULT_ERROR",
    "InvalidInput": "INVALID_INPUT",
    "PayloadTooLarge": "PAYLOAD_TOO_LARGE",
    "InvalidDefinition": "INVALID_DEFINITION",
    "InvalidTransition": "INVALID_TRANSITION",
    "RevisionConflict": "REVISION_CONFLICT",
    "NotFound": "NOT_FOUND",
    "IdempotencyConflict": "IDEMPOTENCY_CONFLICT",
    "IntegrityFailure": "INTEGRITY_FAILURE",
    "StoreBusy": "STORE_BUSY",
    "StoreUnavailable": "STORE_UNAVAILABLE",
    "KeyRequired": "KEY_REQUIRED",
    "KeyExhausted": "KEY_EXHAUSTED",
    "StoreRolledBack": "STORE_ROLLED_BACK",
    "StoreNotEmpty": "STORE_NOT_EMPTY",
    "InsecurePermissions": "INSECURE_PERMISSIONS",
    "SchemaTooNew": "SCHEMA_TOO_NEW",
    "NotBound": "NOT_BOUND",
    "DefinitionReferenced": "DEFINITION_REFERENCED",
    "CheckpointIntegrityFailure": "CHECKPOINT_INTEGRITY_FAILURE",
    "CheckpointConsumed": "CHECKPOINT_CONSUMED",
    "IntegrityKeyRequired": "INTEGRITY_KEY_REQUIRED",
    "ApprovalRequestConflict": "APPROVAL_REQUEST_CONFLICT",
    "DecisionSignatureInvalid": "DECISION_SIGNATURE_INVALID",
    "ApprovalExpired": "APPROVAL_EXPIRED",
    "ApprovalDecisionNotAllowed": "APPROVAL_DECISION_NOT_ALLOWED",
    "ApprovalAlreadyDecided": "APPROVAL_ALREADY_DECIDED",
}


@pytest.mark.parametrize(("name", "code"), sorted(CODES.items()))
def test_each_error_has_its_stable_code(name: str, code: str) -> None:
    """Every exported error class carries its documented code and a docstring."""
    cls = getattr(domain, name)
    assert issubclass(cls, FlowvaultError)
    assert cls.code == code
    assert cls.__doc__


def test_codes_are_unique() -> None:
    """No two error classes share a code."""
    assert len(set(CODES.values())) == len(CODES)


def test_every_exported_error_is_listed() -> None:
    """The table above covers every error the domain exports."""
    exported = {
        name
        for name in domain.__all__
        if isinstance(getattr(domain, name), type) and issubclass(getattr(domain, name), Exception)
    }
    assert exported == set(CODES)


def test_str_and_repr_show_code_and_message_only() -> None:
    """Str and repr carry the code and message; details stay structured."""
    error = domain.RevisionConflict("stale revision", expected=1, actual=2)
    assert str(error) == "[REVISION_CONFLICT] stale revision"
    assert repr(error) == "RevisionConflict(code='REVISION_CONFLICT', message='stale revision')"
    assert error.details == {"expected": 1, "actual": 2}
