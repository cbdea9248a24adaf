"""What an auditor is handed about an approval: its receipt and its signed decisions.

Both carry keyed digests and times, never the approval's plaintext, so they
can leave the host; a signed decision is checked with the decider's public
key alone.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import datetime

from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._record_kinds import APPROVAL_TAG, DECIDER_TAG
from flowvault.application._runs import RUNS
from flowvault.application._sealed import SealedRepository
from flowvault.application._signing import integrity_digest
from flowvault.domain import (
    Approval,
    ApprovalReceipt,
    IntegrityFailure,
    InvalidInput,
)
from flowvault.domain._approvals import decision_statement
from flowvault.domain._canonical import canonical_bytes, canonical_json


@dataclass(frozen=True, slots=True)
class SignedDecision:
    """A decider's signed decision: the statement (canonical JSON text), the signature, the decider.

    ``decider`` is the keyed digest the approval's receipt uses; the
    signature is checked with the decider's public key alone.
    """

    statement: str
    signature: str
    decider: str

    def to_json(self) -> str:
        """Return the statement file an auditor checks with ``approvals verify-decision``."""
        return canonical_json(
            {"statement": self.statement, "signature": self.signature, "decider": self.decider}
        )


def check_approval(approval: object) -> Approval:
    """Refuse anything but an ``Approval`` where the caller hands one back."""
    if not isinstance(approval, Approval):
        raise InvalidInput("expected an Approval as the service returned it")
    return approval


def approval_receipt(
    key: KeyedDigester, repository: SealedRepository, approval: Approval, issued_at: datetime
) -> ApprovalReceipt:
    """Build the receipt of ``approval``, refusing one that does not verify under ``key``."""
    if not hmac.compare_digest(
        integrity_digest(key, APPROVAL_TAG, approval), approval.integrity_digest
    ):
        raise IntegrityFailure("approval does not verify under the integrity key")

    def keyed(tag: str, value: str | None) -> str | None:
        return None if value is None else key.keyed_digest(tag, value)

    return ApprovalReceipt(
        issued_at=issued_at,
        approval=approval.integrity_digest,
        checkpoint=approval.checkpoint_digest,
        run=repository.key_digest(RUNS, approval.run_id),
        audience=key.keyed_digest("flowvault.approval-audience/1", approval.audience),
        prompt=key.keyed_digest("flowvault.approval-prompt/1", approval.prompt_digest),
        allowed_decisions=key.keyed_digest(
            "flowvault.approval-decisions/1",
            canonical_bytes(list(approval.allowed_decisions)),
        ),
        status=approval.status,
        decision=keyed("flowvault.approval-decision/1", approval.decision),
        actor=keyed(DECIDER_TAG, approval.actor),
        decided_at=approval.decided_at,
        required=approval.required if approval.quorum else None,
        votes=key.keyed_digest(
            "flowvault.approval-votes/1",
            canonical_bytes([vote.model_dump(mode="json") for vote in approval.votes]),
        )
        if approval.votes
        else None,
    )


def signed_decisions(approval: Approval) -> list[SignedDecision]:
    """Return the approval's signed decisions, each checkable with a public key alone."""
    check_approval(approval)
    return [
        SignedDecision(
            statement=decision_statement(approval, vote.decision).decode("utf-8"),
            signature=vote.signature,
            decider=vote.decider,
        )
        for vote in approval.votes
        if vote.signature is not None
    ]
